"""The shared memory per block that Pallas's attention kernels ask of a GPU, measured by
compiling them deviceless, against the model the dispatcher plans with
(attention/backends.py's pallas_shared_memory).

  python bench/attention_kernels.py --gpus=h100,a100,l4 --out=docs/records/pallas_shared_memory.json

Triton states what a kernel asks only when it does not fit, so each kernel is compiled for a
copy of the GPU's figures (planning/accelerator_targets.py) with 1 KiB of shared memory per
block: the forward kernel's request is in its error; then, the forward given exactly what it
asked, the backward's (None where it asks no more than the forward). Needs the `aot` extra.
"""
import itertools
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

flags.DEFINE_list("gpus", ["h100", "a100", "l4"], "Keys of accelerator_targets.GPUS.")
flags.DEFINE_list("heads", ["32", "64", "128"], "Padded head widths.")
flags.DEFINE_list("lengths", ["128", "256"], "Padded lengths.")
flags.DEFINE_string("out", "", "The JSON record.")
FLAGS = flags.FLAGS


def device(gpu: str, shared_memory: int):
  from jax.experimental import topologies

  from aiayn_flax.planning import accelerator_targets
  accelerator_targets.topology_devices(accelerator_targets.target(f"gpu-{gpu}x1"))  # the plugin
  config = accelerator_targets.GPUS[gpu].target_config(shared_memory_per_block=shared_memory)
  return topologies.get_topology_desc(platform="cuda", target_config=config,
                                      topology="1x1x1").devices[0]


def requested(gpu_device, dtype, head: int, length: int, block: int, gradient: bool):
  """Bytes the first kernel that does not fit asks (None: all fit)."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from aiayn_flax.attention import forms
  whole = NamedSharding(Mesh([gpu_device], ("d",)), PartitionSpec())
  mask = jax.ShapeDtypeStruct((1, 1, 1, length), jnp.bool_, sharding=whole)
  kernels = lambda q, k, v, m: forms._pallas_kernels(q, k, v, m, cross=False,  # noqa: E731,SLF001
                                                     block=block, interpret=False)
  loss = lambda *a: jnp.sum(kernels(*a).astype(jnp.float32))  # noqa: E731
  function = jax.grad(loss, argnums=(0, 1, 2)) if gradient else kernels
  operand = jax.ShapeDtypeStruct((1, length, 2, head), dtype, sharding=whole)
  try:
    jax.jit(function).lower(operand, operand, operand, mask).compile()
  except Exception as e:  # noqa: BLE001
    found = re.search(r"requested (\d+), available: (\d+)", str(e))
    if not found:
      raise
    return int(found.group(1))
  return None


def main(argv):
  del argv
  import jax.numpy as jnp

  from aiayn_flax.attention import backends
  rows = []
  for gpu in FLAGS.gpus:
    tiny = device(gpu, 1024)
    for dtype, head, length, block in itertools.product(
        ("float32", "bfloat16"), map(int, FLAGS.heads), map(int, FLAGS.lengths),
        backends.PALLAS_BLOCKS):
      if block > length:
        continue
      start = time.perf_counter()
      forward = requested(tiny, jnp.dtype(dtype), head, length, block, False)
      backward = requested(device(gpu, forward), jnp.dtype(dtype), head, length, block, True)
      asked = max(forward, backward or 0)
      planned = backends.pallas_shared_memory(block, head, dtype, length)
      rows.append(dict(gpu=gpu, dtype=dtype, head=head, length=length, block=block,
                       forward=forward, backward=backward, planned=planned))
      print(f"{gpu} {dtype} head {head} length {length} block {block}: forward {forward}, "
            f"backward {backward}; planned {planned} ({planned / asked:.2f}x) "
            f"[{time.perf_counter() - start:.1f} s]", flush=True)
  under = [r for r in rows if r["planned"] < max(r["forward"], r["backward"] or 0)]
  print(f"{len(rows)} kernels; planned below what was asked: {under or 'none'}")
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
  app.run(main)
