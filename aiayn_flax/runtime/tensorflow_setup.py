"""TensorFlow is here only for tf.data and tfds: it must never take an accelerator.

TensorFlow's GPU build claims nearly all of every GPU's memory when it first initialises its
devices (and a TPU build can claim the TPU), leaving JAX none. Hiding the accelerators from
TensorFlow before it initialises its devices prevents that; our own dependency is
`tensorflow-cpu`, which has no GPU support, but Colab and many GPU images ship the GPU build.
"""
import os


def keep_tensorflow_off_accelerators() -> None:
  """Makes TensorFlow see only the CPU. Call it before any tf.data or tfds work (the entry
  points call it first thing in main()); calling it again is harmless. Raises RuntimeError if
  TensorFlow already initialised a GPU or TPU, which would then hold its memory."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf
  for kind in ("GPU", "TPU"):
    if not tf.config.list_physical_devices(kind):
      continue
    try:
      tf.config.set_visible_devices([], kind)
    except RuntimeError as e:  # TF initialised its devices already
      if tf.config.get_visible_devices(kind):
        raise RuntimeError(f"TensorFlow initialised its {kind}s before "
                           "keep_tensorflow_off_accelerators() was called; call it before any "
                           "tf.data or tfds work") from e
