"""Fit by itself: the gradient accumulation a run needs on its devices, chosen by compiling.

At start the trainer (for its devices) and `train.py --dry_run` (for the local devices, or for
a `--target` that is not here) compile the training step and read XLA's memory analysis of it
(compiled_plan.TrainingCompiler). Where the whole batch does not fit the devices' usable
memory they try accumulation: k micro-batches of tokens_per_batch / k real tokens each (the
optimizer step keeps the config's tokens, about 25,000 for base), and keep the smallest k that
fits. The analytic plan (dry_run.memory_plan) picks the first k to try; the compiles decide,
down to the next k that does not fit. One line says what was tried, what was chosen and the
memory of each.

Usable memory per device: config.device_memory_bytes when set (a budget; CPU devices report
none), else what jax's allocator may hold on the device (memory_stats' bytes_limit: 75% of a
GPU by default, XLA_PYTHON_CLIENT_MEM_FRACTION), or for a --target its kind's usable memory
(compiled_plan.usable_memory). Where none is known (the CPU without a budget) nothing is
compiled and the whole batch is trained.

A config.micro_batch_tokens_per_device given by the user wins: it is compiled and reported,
never changed. A chosen accumulation is written into the run's config as that field (what a
user would have passed by hand), so checkpoints record the batches trained.
"""
import dataclasses

import jax

from aiayn_flax import devices, programs as programs_lib, sharding, train_step
from aiayn_flax.data import bucketing
from aiayn_flax.planning import accelerator_targets, compiled_plan, dry_run

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Trial:
  accumulation: int  # micro-batches per optimizer step
  micro_batch_tokens_per_device: int  # padded slots per device and side (0: the whole batch)
  programs: dict  # bucket length -> [CompiledProgram] of one optimizer step
  memory_bytes: int | None  # the largest program's; None: the compiler refused it (TPU)
  refusal: str = ""  # the compiler's RESOURCE_EXHAUSTED line

  def fits(self, usable: int) -> bool:
    return self.memory_bytes is not None and self.memory_bytes <= usable

  def text(self, usable: int) -> str:
    what = ("the whole batch" if self.accumulation == 1 else
            f"{self.accumulation} x {self.micro_batch_tokens_per_device} tokens")
    memory = (_size(self.memory_bytes) if self.memory_bytes is not None
              else "more than the device (XLA: RESOURCE_EXHAUSTED)")
    return f"{what}: {memory} ({'fits' if self.fits(usable) else 'no'})"


@dataclasses.dataclass(frozen=True)
class Fit:
  config: object  # the run's config, micro_batch_tokens_per_device set where it accumulates
  accumulation: int
  fits: bool
  line: str  # the one line: tried, chosen, the memory of each
  chosen: Trial | None = None  # None: nothing compiled (no memory limit known)
  data_shards: int = 1
  mesh: object = None  # the devices' mesh (None: one the devices here cannot make)

  def plan_config(self):
    """The config for the analytic plan (dry_run.plan) at the accumulation compiled and
    chosen: where that is the whole batch, a micro-batch of the whole padded budget (the plan's
    own estimate might ask for micro-batches the compiled step does not need)."""
    if self.chosen is None or self.accumulation > 1:
      return self.config
    config = self.config.copy_and_resolve_references()
    budget = bucketing.padded_budget(config.tokens_per_batch)
    config.micro_batch_tokens_per_device = -(-budget // self.data_shards)
    return config


def micro_batch_tokens(config, accumulation: int, data_shards: int) -> int:
  """The micro_batch_tokens_per_device that gives `accumulation` micro-batches
  (train_step.accumulation_steps); 0 for one."""
  if accumulation == 1:
    return 0
  budget = bucketing.padded_budget(config.tokens_per_batch)
  return -(-budget // (accumulation * data_shards))  # the fewest slots that give it


def max_accumulation(config, data_shards: int, longest: int) -> int:
  """The most micro-batches whose batches still hold a row per data shard of the `longest`
  bucket (bucketing.batch_size_for)."""
  k = 1
  while bucketing.padded_budget(config.tokens_per_batch // (k + 1)) // longest >= data_shards:
    k += 1
  return k


def _with_accumulation(config, accumulation: int, data_shards: int):
  config = config.copy_and_resolve_references()
  config.micro_batch_tokens_per_device = micro_batch_tokens(config, accumulation, data_shards)
  return config


def _estimate(config, usable: int, kind, compiler) -> int:
  """The analytic plan's accumulation for `usable` bytes per device (at least 1)."""
  budget_kind = dataclasses.replace(kind, memory_bytes=usable, usable_memory_fraction=1.0)
  plan_config = config.copy_and_resolve_references()
  plan_config.model.dtype = devices.compute_dtype(config.model.dtype, kind)
  return max(1, dry_run.memory_plan(plan_config, budget_kind, compiler.mesh_axes,
                                    compiler.boundaries[-1])["accumulation_steps"])


def _size(bytes_: int) -> str:
  return f"{bytes_ / GIB:.2f} GiB" if bytes_ >= GIB else f"{bytes_ / 2**20:.1f} MiB"


def choose(config, mesh, usable: int | None, where: str, kind: devices.DeviceKind) -> Fit:
  """The accumulation for `config` on `mesh` (its devices, here or a target's) within `usable`
  bytes per device (None: unknown, nothing compiled); `where` names the devices and the
  memory's source for the line; `kind` is their kind (for the analytic estimate)."""
  return dataclasses.replace(_choose(config, mesh, usable, where, kind),
                             data_shards=dict(mesh.shape)["data"], mesh=mesh)


def _choose(config, mesh, usable, where, kind) -> Fit:
  given = config.get("micro_batch_tokens_per_device", 0)
  if usable is None:
    return Fit(config, train_step.accumulation_steps(config, dict(mesh.shape)["data"]), True,
               f"on {where}: "
               + (f"--config.micro_batch_tokens_per_device={given} given, which wins (no "
                  "memory limit known, nothing compiled)" if given else
                  "no memory limit known, nothing compiled: the whole batch is trained (set "
                  "--config.device_memory_bytes to choose the accumulation against a budget)"))
  compiler = compiled_plan.TrainingCompiler(config, mesh)
  data_shards = compiler.data_shards
  if given:
    accumulation = compiler.accumulation(config)
    trial = _trial(compiler, config, accumulation, given)
    fits = trial.fits(usable)
    return Fit(_with_forms_compiled(config, compiler), accumulation, fits,
               f"on {where}: --config.micro_batch_tokens_per_device={given} given, which wins "
               f"(nothing chosen): {trial.text(usable)}"
               + ("" if fits else "; a larger accumulation (a smaller value), a model axis in "
                  "--config.mesh or --config.fsdp=True would fit"), trial)
  steps_per_call = config.get("steps_per_call", 1)
  limit = (1 if steps_per_call > 1
           else max_accumulation(config, data_shards, compiler.boundaries[-1]))
  trials, fitting, failing = {}, None, 0  # the smallest k known to fit, the largest that does not
  state_too_big = None
  k = 1  # the whole batch first: where it fits, its one compile is the run's own program
  while True:
    trials[k] = _trial(compiler, config, k, micro_batch_tokens(config, k, data_shards))
    if trials[k].fits(usable):
      fitting = k
    else:
      failing = k
      if k >= 2 and (state_too_big := _apply_too_big(compiler, usable)):
        break  # the update alone does not fit: no accumulation helps
    if fitting is not None and fitting - failing <= 1:
      break
    if fitting is None:
      if k >= limit:
        break
      # then the analytic plan's accumulation, then twice as many until one fits
      estimate = _estimate(config, usable, kind, compiler)
      k = min(limit, estimate if k == 1 and estimate > 1 else 2 * k)
    else:  # between the largest that does not fit and the smallest that does
      k = (failing + fitting) // 2
  tried = ", ".join(trials[k].text(usable) for k in trials)
  if fitting is None:
    if state_too_big:
      why = f"the update alone ({state_too_big}) does not fit"
    elif steps_per_call > 1:
      why = (f"steps_per_call={steps_per_call} cannot accumulate (--config.steps_per_call=1 "
             "can)")
    else:
      why = f"{limit} micro-batches is the most the longest bucket allows"
    return Fit(config, 1, False,
               f"on {where}: tried {tried}; none fits: {why}; try a model axis in "
               "--config.mesh (e.g. data:-1,model:2) or --config.fsdp=True", trials[max(trials)])
  chosen = trials[fitting]
  if fitting == 1:
    choice = "the whole batch, no accumulation"
  else:
    choice = (f"{fitting} micro-batches of {chosen.micro_batch_tokens_per_device} padded tokens "
              f"per device (micro_batch_tokens_per_device={chosen.micro_batch_tokens_per_device}"
              f"), {config.tokens_per_batch} real tokens a step as configured")
  return Fit(_with_forms_compiled(_with_accumulation(config, fitting, data_shards), compiler),
             fitting, True, f"on {where}: tried {tried}; chose {choice}", chosen)


def _with_forms_compiled(config, compiler):
  """`config` with the plain forms its compiles fell back to (programs.FormFallback), so that
  the trainer builds what compiled, without trying the failing form again."""
  return programs_lib.with_plain_forms(config, compiler.programs.forms.fell_back)


def _trial(compiler, config, accumulation: int, micro_tokens: int) -> Trial:
  """The step compiled at `accumulation` micro-batches (of `micro_tokens` padded slots per
  device: micro_batch_tokens, which gives that accumulation)."""
  try:
    programs = compiler.compile_buckets(config, accumulation)
  except compiled_plan.DoesNotFit as e:
    return Trial(accumulation, micro_tokens, {}, None, str(e))
  memory = max(p.memory_bytes for step in programs.values() for p in step)
  return Trial(accumulation, micro_tokens, programs, memory)


def _apply_too_big(compiler, usable: int) -> str | None:
  """The update program's memory when it alone exceeds `usable` (the state and the summed
  gradients: every accumulation needs it), else None."""
  try:
    program = compiler.apply_program()
  except compiled_plan.DoesNotFit:
    return "apply_gradient_sums: RESOURCE_EXHAUSTED"
  return (f"apply_gradient_sums, {_size(program.memory_bytes)}"
          if program.memory_bytes > usable else None)


def local_usable_memory(config, local_devices) -> tuple[int | None, str]:
  """(usable bytes per device, where that comes from) for the devices here."""
  if config.get("device_memory_bytes", 0):
    return config.device_memory_bytes, "--config.device_memory_bytes"
  limits = []
  for device in local_devices:
    try:
      stats = device.memory_stats()
    except (AttributeError, NotImplementedError, RuntimeError):
      stats = None
    if not stats or "bytes_limit" not in stats:
      return None, "not reported"
    limits.append(int(stats["bytes_limit"]))
  return min(limits), "jax's allocator limit"


def _where(devices_text: str, usable: int | None, source: str) -> str:
  return devices_text + (f", {_size(usable)} usable per device ({source})" if usable else "")


def for_local_devices(config, mesh=None) -> Fit:
  """The fit for the devices here (the trainer's, and the dry run's without --target); nothing
  compiled where config.device plans for another kind (--target compiles for one)."""
  local = jax.local_devices()
  kind = devices.local_kind(local[0], len(local))
  planned = config.get("device", "")
  if planned and planned != "cpu" and planned != kind.name:
    shards = dict(mesh.shape)["data"] if mesh is not None else 1
    return Fit(config, train_step.accumulation_steps(config, shards), True,
               f"not compiled: the plan is for config.device={planned}, not the "
               f"{local[0].device_kind} devices here (--target compiles for a kind without it)",
               data_shards=shards, mesh=mesh)
  planned_count = config.get("num_devices", 0)
  if mesh is None and planned_count and planned_count != jax.device_count():
    return Fit(config, train_step.accumulation_steps(config, 1), True,
               f"not compiled: the plan is for config.num_devices={planned_count}, not the "
               f"{jax.device_count()} devices here (--target compiles for a slice without it)")
  if mesh is None:
    try:
      mesh = sharding.make_mesh(config.mesh, dcn_spec=config.dcn_mesh)
    except ValueError as e:
      return Fit(config, train_step.accumulation_steps(config, 1), True,
                 f"not compiled: config.mesh={config.mesh!r} on the devices here: {e}")
  usable, source = local_usable_memory(config, mesh.local_devices)
  where = _where(f"{mesh.devices.size} x {local[0].device_kind}", usable, source)
  return choose(config, mesh, usable, where, kind)


def for_target(config, target) -> Fit:
  """The fit for an accelerator_targets.Target compiled without its devices (ValueError: no
  compiler for it here)."""
  target_devices = accelerator_targets.topology_devices(target)
  mesh = sharding.make_mesh(config.mesh, target_devices, config.dcn_mesh)
  kind = devices.kind(target.kind)
  usable = compiled_plan.usable_memory(kind, target.platform)
  source = (f"{kind.usable_memory_fraction:.0%} of {_size(kind.memory_bytes)}, what jax takes "
            "of a GPU" if target.platform == "gpu" else "the HBM")
  where = _where(f"{target.name} ({len(target_devices)} x {target_devices[0].device_kind})",
                 usable, source)
  return choose(config, mesh, usable, where, kind)
