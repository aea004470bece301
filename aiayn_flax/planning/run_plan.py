"""The run's plan, made once at its start from the config and the devices: the mesh, the
micro-batches of an optimizer step (fit.py chooses them, compiling the step where the devices'
memory is known; micro_config buckets their batches, as the compiles did), and the forms and
programs that compiled. The trainer trains what the plan says (`for_training`);
`train.py --dry_run` prints the same plan (`RunPlan.text`) for the devices here
(`for_local_devices`) or for a --target's (`for_target`).

The path goes down once: the mesh (sharding.py), the fit (fit.py, which compiles through
compiled_plan.py and reads train_step.accumulation_steps for a micro_batch_tokens_per_device
given), then the config each micro-batch's batches are built with; the trainer reads the
plan's fields and does not ask again.
"""
import dataclasses

import jax
from absl import logging

from aiayn_flax import sharding
from aiayn_flax.data import bucketing
from aiayn_flax.planning import dry_run, fit


@dataclasses.dataclass(frozen=True)
class RunPlan:
  # The run's config: micro_batch_tokens_per_device where the fit accumulates (what a user
  # would have passed by hand, recorded in checkpoints), the plain forms its compiles fell
  # back to (programs.with_plain_forms).
  config: object
  mesh: jax.sharding.Mesh | None  # None: a dry run's mesh that the devices here cannot make
  fit: fit.Fit  # how the accumulation was chosen: the line, the trial compiled, fits or not
  micro_config: object  # each micro-batch's: the step's tokens_per_batch / accumulation

  @property
  def accumulation(self) -> int:
    """Micro-batches per optimizer step."""
    return self.fit.accumulation

  @property
  def data_shards(self) -> int:
    return self.fit.data_shards

  @property
  def programs(self) -> dict:
    """Bucket length -> the compiled programs of one optimizer step (the fit's chosen trial;
    empty where nothing was compiled)."""
    return self.fit.chosen.programs if self.fit.chosen else {}

  def text(self) -> str:
    """What `train.py --dry_run` prints: the analytic plan at the accumulation the fit chose
    (dry_run.plan, one `key: value` a line), then the fit's line."""
    compiled = self.fit.chosen is not None and self.fit.fits
    return (dry_run.plan_text(self.fit.plan_config(), compiled_fit=compiled)
            + f"\nfit: {self.fit.line}")


def micro_batch_config(config, accumulation: int):
  """The config each of an optimizer step's `accumulation` micro-batches is built with: the
  step's tokens_per_batch shared between them, rounded down, so that a micro-batch's padded
  budget stays within micro_batch_tokens_per_device x data shards."""
  micro_config = config.copy_and_resolve_references()
  micro_config.tokens_per_batch = config.tokens_per_batch // accumulation
  return micro_config


def _plan(fitted: fit.Fit, mesh) -> RunPlan:
  return RunPlan(fitted.config, mesh, fitted,
                 micro_batch_config(fitted.config, fitted.accumulation))


def for_local_devices(config) -> RunPlan:
  """The dry run's plan for the devices here (nothing compiled where config.device or
  config.num_devices plans for others, or config.mesh does not fit them)."""
  fitted = fit.for_local_devices(config)
  return _plan(fitted, fitted.mesh)


def for_target(config, target) -> RunPlan:
  """The dry run's plan for an accelerator_targets.Target, compiled without its devices
  (ValueError: no compiler for it here)."""
  fitted = fit.for_target(config, target)
  return _plan(fitted, fitted.mesh)


def for_training(config) -> RunPlan:
  """The trainer's plan, at start: the mesh over the devices here, the accumulation that fits
  them, each logged; ValueError (one line) when the mesh cannot be made, nothing fits (a
  user's given micro_batch_tokens_per_device runs anyway, with a warning), or steps_per_call
  asks for several steps a call of a step that accumulates."""
  mesh = sharding.make_mesh(config.mesh, dcn_spec=config.dcn_mesh)
  logging.info("devices: %s; mesh: %s", jax.devices(), dict(mesh.shape))
  fitted = fit.for_local_devices(config, mesh)
  (logging.info if fitted.fits else logging.warning)("fit: %s", fitted.line)
  if not fitted.fits and not config.get("micro_batch_tokens_per_device", 0):
    raise ValueError(f"does not fit: {fitted.line}")
  plan = _plan(fitted, mesh)
  steps_per_call = plan.config.steps_per_call
  if steps_per_call < 1 or (steps_per_call > 1 and plan.accumulation > 1):
    raise ValueError(f"config.steps_per_call={steps_per_call}: must be >= 1, and 1 when a step "
                     f"accumulates micro-batches ({plan.accumulation} here, from "
                     "micro_batch_tokens_per_device)")
  logging.info("%d micro-batch(es) of about %d real tokens per side (at most %d padded) per "
               "optimizer step", plan.accumulation, plan.micro_config.tokens_per_batch,
               bucketing.padded_budget(plan.micro_config.tokens_per_batch))
  return plan
