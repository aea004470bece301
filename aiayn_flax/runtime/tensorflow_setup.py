"""TensorFlow is here only for tf.data and tfds: it must never take an accelerator.

TensorFlow's GPU build claims nearly all of every GPU's memory when it first initialises its
devices (and a TPU build can claim the TPU), leaving JAX none. Hiding the accelerators from
TensorFlow before it initialises its devices prevents that; our own dependency is
`tensorflow-cpu`, which has no GPU support, but Colab and many GPU images ship the GPU build.

Importing TensorFlow took 9.2 s against jax's 1.2 s (timed on a 2-core host with a test run
beside them), and a run whose data needs no tf.data (the toy and parsing-sample configs,
evaluate.py on text files) should not pay it. So when
TensorFlow is not imported yet, the accelerators are hidden the moment it is: an import hook
does it right after `import tensorflow` finishes, before anything can use it.
"""
import os

from aiayn_flax.runtime import import_hooks

_NAME = "tensorflow"


def keep_tensorflow_off_accelerators() -> None:
  """Makes TensorFlow see only the CPU, now if it is imported already, else as soon as it is.
  Call it before any tf.data or tfds work (the entry points call it first thing in main());
  calling it again is harmless. Raises RuntimeError if TensorFlow already initialised a GPU or
  TPU, which would then hold its memory."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import_hooks.call_after_import(_NAME, _hide_accelerators)


def _hide_accelerators(tf) -> None:
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

