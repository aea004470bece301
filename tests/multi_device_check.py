"""Run by test_multi_device.py in a process with 8 simulated CPU devices: the same global batch
on 1 device and on 8 (mesh data:8) gives the same loss, gradients and updated parameters."""
import functools
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8"
                           " --xla_cpu_collective_call_terminate_timeout_seconds=120")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from aiayn_flax import optimizer, sharding, train_step  # noqa: E402
from configs import toy  # noqa: E402


def run_on(devices, config, batch):
  mesh = sharding.make_mesh("data:-1", devices)
  model = train_step.make_model(config)
  replicated, batch_sharding = sharding.replicated(mesh), sharding.batch_sharding(mesh)
  state = jax.device_put(train_step.create_train_state(config, model), replicated)
  batch = jax.device_put(batch, batch_sharding)
  rng = train_step.dropout_key(0)
  grads_fn = jax.jit(functools.partial(train_step.loss_and_grads, model=model,
                                       label_smoothing=config.label_smoothing),
                     in_shardings=(replicated, batch_sharding, replicated))
  grads, metrics = grads_fn(state.params, batch, rng)
  step_fn = jax.jit(functools.partial(train_step.train_step, model=model,
                                      label_smoothing=config.label_smoothing,
                                      schedule=optimizer.learning_rate_schedule(config)),
                    in_shardings=(replicated, batch_sharding, replicated))
  for _ in range(3):
    state, _ = step_fn(state, batch, rng)
    jax.block_until_ready(state)  # CPU collectives: one step at a time
  return jax.device_get((metrics, grads, state.params))


def main():
  assert jax.device_count() == 8, jax.devices()
  config = toy.get_config()
  config.model.dropout_rate = 0.1  # dropout masks must not depend on the sharding either
  config.label_smoothing = 0.1
  rng = np.random.default_rng(0)
  batch = {k: rng.integers(4, 20, (16, 12)).astype(np.int32) for k in ("inputs", "targets")}
  batch["inputs"][:, 9:] = 0
  batch["targets"][3:, 7:] = 0
  one = run_on(jax.devices()[:1], config, batch)
  eight = run_on(jax.devices(), config, batch)
  for name, a, b in zip(("metrics", "gradients", "updated parameters"), one, eight):
    worst = max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    print(f"{name}: max abs difference {worst:.2e}")
    assert worst <= 1e-5, name
  print("OK")


if __name__ == "__main__":
  main()
