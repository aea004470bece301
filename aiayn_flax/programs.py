"""The jitted programs of a run, built once for the trainer and for the compiled dry run
(`train.py --dry_run --target=...`), so that what the dry run compiles is what training runs:
the same functions, shardings and donations."""
import dataclasses
import functools

import jax

from aiayn_flax import devices, optimizer, sharding, train_step


@dataclasses.dataclass(frozen=True)
class TrainingPrograms:
  step_fn: object  # (state, batch, rng) -> (state, metrics): one optimizer step
  steps_fn: object  # (state, [K, ...] batches, num_steps, rng): several steps in one call
  accumulate_fn: object  # (sums | None, params, batch, rng, step, micro_step) -> sums
  apply_fn: object  # (state, grad_sums, metrics) -> (state, metrics): the accumulated update
  eval_fn: object  # (params, batch) -> metric sums


def aligns_rows(mesh) -> bool:
  """Whether the programs pad a batch's rows to a GPU's tile sizes
  (train_step.with_aligned_rows): on one GPU. Over several devices the rows appended at the end
  would all fall on the last one, so there the batches stay as they come."""
  return mesh.devices.size == 1 and mesh.devices.flat[0].platform == "gpu"


def training_programs(config, model, mesh, state_sharding) -> TrainingPrograms:
  """The train, accumulate/apply and eval programs of `config` on `mesh`; the state is
  donated (updated in place), batches are split along `data`."""
  batch_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  stacked_batch_sharding = sharding.stacked_batch_sharding(mesh)
  schedule = optimizer.learning_rate_schedule(config)
  one_vector = optimizer.state_is_whole_on_each_device(config)
  align_rows = aligns_rows(mesh)
  # Traced knowing their devices' platform: on a CPU mesh, the CPU's forms alone.
  platform = mesh.devices.flat[0].platform
  for_mesh = functools.partial(devices.traced_for, platform)
  step_fn = jax.jit(
      functools.partial(for_mesh(train_step.train_step), model=model,
                        label_smoothing=config.label_smoothing, schedule=schedule,
                        one_vector=one_vector, align_rows=align_rows),
      in_shardings=(state_sharding, batch_sharding, replicated),
      out_shardings=(state_sharding, replicated), donate_argnums=0)
  steps_fn = jax.jit(
      functools.partial(for_mesh(train_step.train_steps), model=model,
                        label_smoothing=config.label_smoothing, schedule=schedule,
                        one_vector=one_vector, align_rows=align_rows),
      in_shardings=(state_sharding, stacked_batch_sharding, replicated, replicated),
      out_shardings=(state_sharding, replicated), donate_argnums=0)
  accumulate_fn = jax.jit(functools.partial(for_mesh(train_step.accumulate_step), model=model,
                                            label_smoothing=config.label_smoothing,
                                            align_rows=align_rows),
                          donate_argnums=0)
  apply_fn = jax.jit(functools.partial(for_mesh(train_step.apply_gradient_sums), schedule=schedule,
                                        one_vector=one_vector),
                     out_shardings=(state_sharding, replicated), donate_argnums=(0, 1))
  eval_fn = jax.jit(functools.partial(for_mesh(train_step.eval_step), model=model,
                                      label_smoothing=config.label_smoothing,
                                      align_rows=align_rows))
  return TrainingPrograms(step_fn, steps_fn, accumulate_fn, apply_fn, eval_fn)
