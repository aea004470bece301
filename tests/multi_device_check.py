"""Run by test_multi_device.py in a process with 8 simulated CPU devices: the same global batch
on 1 device, on 8 as data:8, and as data:4,model:2 (tensor parallel, with and without FSDP)
gives the same loss, gradients and updated parameters."""
import functools
import os
import sys

# LLVM at -O0 (--xla_backend_optimization_level=0): the time here is compiling small programs
# that run once, and what is compared is one layout against another, both compiled alike
# (29.6 -> 22.0 s for this script alone, 2 cores).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8"
                           " --xla_cpu_collective_call_terminate_timeout_seconds=120"
                           " --xla_backend_optimization_level=0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from aiayn_flax import optimizer, sharding, train_step  # noqa: E402
from configs import toy  # noqa: E402


def sharded_state(mesh, config, fsdp=False):
  """(model, a new train state laid out over `mesh` as the trainer lays it out, its shardings)."""
  model = train_step.make_model(config)
  new_state = lambda: train_step.create_train_state(config, model)  # noqa: E731
  state_sharding = sharding.train_state_shardings(
      mesh, jax.eval_shape(new_state), train_step.logical_param_specs(model), fsdp)
  return model, jax.jit(new_state, out_shardings=state_sharding)(), state_sharding


def run_on(devices, mesh_spec, config, batch, fsdp=False):
  mesh = sharding.make_mesh(mesh_spec, devices)
  model, state, state_sharding = sharded_state(mesh, config, fsdp)
  replicated, batch_sharding = sharding.replicated(mesh), sharding.batch_sharding(mesh)
  batch = sharding.put_batch(batch, batch_sharding)
  rng = train_step.dropout_key(0)
  grads_fn = jax.jit(functools.partial(train_step.loss_and_grads, model=model,
                                       label_smoothing=config.label_smoothing),
                     in_shardings=(state_sharding.params, batch_sharding, replicated))
  grads, metrics = grads_fn(state.params, batch, rng)
  grads = jax.tree.map(lambda g: g / metrics["tokens"], grads)  # per token, as the update uses
  step_fn = jax.jit(functools.partial(train_step.train_step, model=model,
                                      label_smoothing=config.label_smoothing,
                                      schedule=optimizer.learning_rate_schedule(config)),
                    in_shardings=(state_sharding, batch_sharding, replicated),
                    out_shardings=(state_sharding, replicated))
  for _ in range(3):
    state, _ = step_fn(state, batch, rng)
    jax.block_until_ready(state)  # CPU collectives: one step at a time
  return jax.device_get((metrics, grads, state.params))


def main():
  assert jax.device_count() == 8, jax.devices()
  config = toy.get_config()
  # One layer of each stack: what is compared (how the step is split over devices) does not
  # depend on depth, and its 12 programs compile faster (79 -> 53 s for this script, alone).
  config.model.num_layers = 1
  config.model.dropout_rate = 0.1  # dropout masks must not depend on the sharding either
  config.label_smoothing = 0.1
  # Adam's first updates are g / (|g| + eps): for a gradient of ~1e-9, whose last bits depend
  # on the order of the cross-device sum, eps 1e-9 would turn a 1e-15 difference into a whole
  # learning rate. A larger eps keeps the comparison about the step, not about that rounding.
  config.adam_eps = 1e-6
  rng = np.random.default_rng(0)
  batch = {k: rng.integers(4, 20, (16, 12)).astype(np.int32) for k in ("inputs", "targets")}
  batch["inputs"][:, 9:] = 0
  batch["targets"][3:, 7:] = 0
  one = run_on(jax.devices()[:1], "data:1", config, batch)
  for mesh_spec, fsdp in (("data:8", False), ("data:4,model:2", False), ("data:4,model:2", True)):
    other = run_on(jax.devices(), mesh_spec, config, batch, fsdp)
    for name, a, b in zip(("metrics", "gradients", "updated parameters"), one, other):
      # Absolute differences, relative for magnitudes above 1 (the summed loss is ~10^3).
      worst = max(float(np.max(np.abs(x - y) / np.maximum(1.0, np.abs(y))))
                  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
      print(f"{mesh_spec}{' fsdp' if fsdp else ''} {name}: max difference {worst:.2e}")
      assert worst <= 1e-5, (mesh_spec, name)
  check_a_checkpoint_of_eight_devices_compiles_nothing(config)
  print("OK")


def check_a_checkpoint_of_eight_devices_compiles_nothing(config):
  """A train state replicated over 8 CPU devices is saved without compiling any program and
  reads back equal. Orbax's default copies such arrays to the host in slices, one per device,
  compiling a slicing program per array at a process's first save (seconds at every start of a
  multi-device CPU run); checkpoints.py turns that off on the CPU."""
  import tempfile
  from aiayn_flax.runtime import checkpoints
  _, state, _ = sharded_state(sharding.make_mesh("data:8", jax.devices()), config)
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, seconds, **_: compiles.append(event)
      if event == "/jax/core/compile/backend_compile_duration" else None)
  with tempfile.TemporaryDirectory() as workdir:
    mngr = checkpoints.manager(workdir, asynchronous=False)
    checkpoints.save(mngr, 1, state, {"step": 1})
    mngr.wait_until_finished()
    assert compiles == [], f"saving compiled {len(compiles)} programs"
    restored, meta = checkpoints.restore(mngr, 1, checkpoints.abstract_of(state))
  assert meta == {"step": 1}
  for a, b in zip(*(jax.tree.leaves(jax.device_get(x)) for x in (state, restored))):
    np.testing.assert_array_equal(a, b)
  print("a checkpoint of a state replicated over 8 devices: saved with no compile, read back equal")


if __name__ == "__main__":
  main()
