"""Training-step throughput and MFU, against an f32 matmul peak measured in the same process.

  python bench/train_throughput.py --config=configs/multi30k.py [--batch=80 --length=32]

Batches are synthetic with the torch peer's padding pattern (the last quarter of every row is
padding), at the config's tokens_per_batch unless --batch is given. Prints one `name: value`
line each: matmul_peak_gflops, step_ms, tokens_per_s (real source + target tokens), model
gflops_per_s (the analytic train FLOPs of aiayn_flax/flops.py, padding included) and mfu.
"""
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from aiayn_flax import flops, optimizer, train_step  # noqa: E402

config_flags.DEFINE_config_file("config", "configs/multi30k.py", "Config file.")
flags.DEFINE_integer("batch", 0, "Rows per batch (0: tokens_per_batch // length).")
flags.DEFINE_integer("length", 32, "Padded sequence length (source and target).")
flags.DEFINE_integer("steps", 10, "Timed steps (after two warm-up steps).")
FLAGS = flags.FLAGS


def matmul_peak_gflops(n: int = 2048, repeats: int = 10) -> float:
  """Best-of-`repeats` f32 GFLOP/s of an n x n x n matmul."""
  a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
  matmul = jax.jit(lambda x, y: x @ y)
  matmul(a, a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n ** 3 / best / 1e9


def synthetic_batch(rng, batch: int, length: int, vocab: int) -> dict:
  """Random ids in [4, vocab) with the last quarter of every row padded, as the torch peer."""
  tokens = {k: rng.integers(4, vocab, (batch, length)).astype(np.int32)
            for k in ("inputs", "targets")}
  for v in tokens.values():
    v[:, length - length // 4:] = 0
  return tokens


def time_train_step(config, batch: int, length: int, steps: int) -> float:
  """Mean seconds per step of the jitted training step (compile excluded)."""
  model = train_step.make_model(config)
  state = train_step.create_train_state(config, model)
  step_fn = jax.jit(functools.partial(
      train_step.train_step, model=model, label_smoothing=config.label_smoothing,
      schedule=optimizer.learning_rate_schedule(config)), donate_argnums=0)
  rng = np.random.default_rng(0)
  batches = [synthetic_batch(rng, batch, length, config.model.vocab_size)
             for _ in range(steps + 2)]
  key = train_step.dropout_key(0)
  for b in batches[:2]:
    state, metrics = step_fn(state, b, key)
  jax.block_until_ready(state)
  start = time.perf_counter()
  for b in batches[2:]:
    state, metrics = step_fn(state, b, key)
  jax.block_until_ready((state, metrics))
  return (time.perf_counter() - start) / steps


def measure(config, batch: int, length: int, steps: int) -> dict:
  peak = matmul_peak_gflops()
  seconds = time_train_step(config, batch, length, steps)
  real_tokens = 2 * batch * (length - length // 4)
  model_gflops = flops.train_flops(config.model, batch, length, length) / seconds / 1e9
  return {"config": config.name, "batch": f"{batch}x{length}", "devices": jax.device_count(),
          "matmul_peak_gflops": round(peak, 1), "step_ms": round(seconds * 1000, 1),
          "tokens_per_s": round(real_tokens / seconds), "model_gflops_per_s": round(model_gflops, 1),
          "mfu": round(model_gflops / peak, 3)}


def main(argv):
  del argv
  config = FLAGS.config
  batch = FLAGS.batch or config.tokens_per_batch // FLAGS.length
  for key, value in measure(config, batch, FLAGS.length, FLAGS.steps).items():
    print(f"{key}: {value}")


if __name__ == "__main__":
  app.run(main)
