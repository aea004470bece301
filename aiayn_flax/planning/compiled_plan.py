"""`train.py --dry_run --target=NAME`: the run's programs compiled by XLA for an accelerator
that is not here (accelerator_targets.py), and the per-device memory XLA reports for them.

It compiles every program a run calls (programs.py, translator.py), with the shapes and
placements it calls them with: the training step as the trainer runs it (the multi-step
program with K = steps_per_call stacked batches, one step, or, when
micro_batch_tokens_per_device asks for accumulation, the accumulate and apply programs), the
evaluation step, the greedy decoding of training's validation BLEU, and evaluate.py's decoding
(beam_size), both as the translator runs them: data-parallel over every device of the slice,
parameters whole on each, decode_batch_size rows per device (config.decode_batch_size counts
per device: sharding.over_decoding_devices) of sources of the longest training length. A
program's memory is its arguments + outputs + temporaries - what outputs alias (donated
state); what the trainer holds beside them around its validation decoding (the state, the
decoding's copy of the parameters) is reported too (`_training_decode_memory`). An HBM
overflow that the TPU compiler reports itself (RESOURCE_EXHAUSTED) is turned into the same
one-line message.
"""
import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np

from aiayn_flax.planning import accelerator_targets
from aiayn_flax import devices, sharding, tasks, train_step, translator
from aiayn_flax.data import bucketing
from aiayn_flax.planning.dry_run import activation_bytes_per_token
from aiayn_flax import programs as programs_lib
from aiayn_flax.programs import training_programs

HELPFUL_KEYS = ("a smaller --config.micro_batch_tokens_per_device (accumulates more micro-batches),"
                " a model axis in --config.mesh (e.g. data:-1,model:2), or --config.fsdp=True")


class DoesNotFit(Exception):
  """One line: the program, the bytes it needs and the bytes available, the keys that help."""


class DoesNotCompile(Exception):
  """One line: a program that fails to compile for the target for another reason than the
  device's memory (a kernel's shared memory, a lowering), with every form's fallback tried."""


@dataclasses.dataclass(frozen=True)
class CompiledProgram:
  name: str
  shape: str  # the batch it was compiled for
  argument_bytes: int
  output_bytes: int
  temporary_bytes: int
  alias_bytes: int
  flops: float  # all devices, one call
  collectives: tuple  # sorted (op, devices per group) pairs in the partitioned program
  # On each device beside the program's own buffers while it runs: an accumulate step's
  # arguments are the parameters, the sums and a batch, while Adam's moments stay there.
  resident_bytes: int = 0

  @property
  def memory_bytes(self) -> int:
    return (self.argument_bytes + self.output_bytes + self.temporary_bytes - self.alias_bytes
            + self.resident_bytes)


def largest_memory_bucket(boundaries: list[int], model_config, micro_tokens: int,
                          data_shards: int) -> int:
  """The bucket boundary whose batch can need the most activation memory. A bucket's batch
  holds at most the padded budget of `micro_tokens` real tokens (rows = budget // boundary,
  rounded down to the data shards: the most rows bucketing.rows_per_bucket gives it, whatever
  the data), and only the attention probabilities grow with the length, so it is the longest
  bucket unless rounding leaves it many fewer tokens than a shorter one: rank them by
  dry_run's per-token estimate x the slots each batch can hold, and compile that one."""

  def activation_bytes(boundary):
    rows = bucketing.padded_budget(micro_tokens) // boundary // data_shards * data_shards
    return rows * boundary * activation_bytes_per_token(model_config, boundary)
  return max(boundaries, key=activation_bytes)


def _candidate_buckets(boundaries: list[int], model_config, micro_tokens: int,
                       data_shards: int) -> list[int]:
  """The buckets whose training program may need the most memory: the estimate's
  (largest_memory_bucket) and the shortest. compile_run compiles both and keeps the larger: on
  TPU a short bucket's [rows, heads, L, L] attention tensors pad their last dimension to 128
  lanes, which the per-token estimate does not model (one v5e chip, a 1-layer d_model 128
  model: 162 MB at 8 tokens against 19 MB at 128)."""
  estimated = largest_memory_bucket(boundaries, model_config, micro_tokens, data_shards)
  shortest = boundaries[0]
  return [estimated] if estimated == shortest else [estimated, shortest]


def _same_for_all(tree, sharding_):
  return jax.tree.map(lambda _: sharding_, tree)


def _flops(compiled, lowered_for_cpu, num_devices: int) -> float:
  """XLA's FLOP count of one call over all devices: the TPU compiler's (per device, of the
  partitioned program), else (GPU: cost_analysis is None) the CPU lowering's of the whole."""
  cost = compiled.cost_analysis()
  if cost and cost.get("flops"):
    return float(cost["flops"]) * num_devices
  return float(lowered_for_cpu().cost_analysis()["flops"])


def _compile(name, shape, function, args, num_devices) -> CompiledProgram:
  """`function` compiled for `args`; a run's training program (programs.Program) falls back to
  plainer forms where its own do not compile, as the trainer's would. DoesNotFit where the
  device's memory overflows; DoesNotCompile (saying it is not memory) where a kernel or the
  lowering fails. An error in tracing is the program's own, raised as it is."""
  traced = function.trace(*args)
  try:
    compiled = (function.compile(*args) if isinstance(function, programs_lib.Program)
                else traced.lower().compile())
  except Exception as e:  # noqa: BLE001 - told apart below
    if not programs_lib.is_device_memory_error(e):
      raise DoesNotCompile(f"{name} ({shape}) does not compile for this target, and not for "
                           f"its memory: {programs_lib.error_line(e)}; every GPU form is "
                           "switched by a config field (docs/TRAIN.md, the GPU forms)") from e
    # libtpu 0.0.42: "... required for HLO temporaries (42.08G) exceeds available HBM (15.75G)"
    sizes = re.search(r"\(([\d.]+[KMGT]?)\) exceeds available HBM \(([\d.]+[KMGT]?)\)", str(e))
    detail = (f"needs more than {sizes.group(1)}B per device, {sizes.group(2)}B HBM available"
              if sizes else str(e).splitlines()[0][:200])
    raise DoesNotFit(f"{name} ({shape}) {detail} (XLA: RESOURCE_EXHAUSTED, the device's "
                     f"memory); try {HELPFUL_KEYS}") from None
  memory = compiled.memory_analysis()
  unsharded = tuple(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), a)
                    if a is not None else None for a in args)
  lowered_for_cpu = lambda: jax.jit(function.__wrapped__).lower(*unsharded)  # noqa: E731
  return CompiledProgram(name, shape, memory.argument_size_in_bytes, memory.output_size_in_bytes,
                         memory.temp_size_in_bytes, memory.alias_size_in_bytes,
                         _flops(compiled, lowered_for_cpu, num_devices),
                         collectives(compiled.as_text()))


_COLLECTIVE = re.compile(r"= [^\n]*? (all-reduce|all-gather|reduce-scatter|all-to-all|"
                         r"collective-permute)(?:-start)?\([^\n]*?replica_groups=([^\n]*)")
_MESH_GROUPS = re.compile(r"mesh\[([^\]]*)\] \{([^}]*)\}")
# Multislice: a slice's program hands the cross-slice part of a collective to the megascale
# runtime, over the data-center network, as a host transfer.
_DCN_COLLECTIVE = re.compile(r'_xla_megascale_transfer_type="(\w+)"')


def _group_size(groups: str) -> int:
  """Devices per replica group, as HLO writes them: mesh['a'=4,'b'=2] {'a'} (the named axes
  of a mesh), an iota [groups,size]<=[...], explicit lists {{0,1},{2,3}}, or {} (all: 0)."""
  if mesh := _MESH_GROUPS.match(groups):
    sizes = {name.strip("'"): int(size) for name, size in
             (part.split("=") for part in mesh.group(1).split(","))}
    return math.prod(sizes[name.strip().strip("'")] for name in mesh.group(2).split(","))
  if iota := re.match(r"\[\d+,(\d+)\]", groups):
    return int(iota.group(1))
  if groups.startswith("{}"):
    return 0
  return groups[2:groups.index("}")].count(",") + 1


def collectives(hlo_text: str) -> tuple:
  """(op, devices per replica group) of each kind of collective in an HLO module's text, e.g.
  ("all-reduce", 8) for a data-parallel gradient sum on 8 devices; on several slices, each
  slice's program holds its own devices' part, and ("dcn-all-reduce", 0) the part across the
  slices (0: all of them, as for replica_groups={})."""
  dcn = {("dcn-" + kind.lower().replace("_", "-"), 0)
         for kind in _DCN_COLLECTIVE.findall(hlo_text)}
  return tuple(sorted(dcn | {(op, _group_size(groups))
                             for op, groups in _COLLECTIVE.findall(hlo_text)}))


def usable_memory(kind: devices.DeviceKind, platform: str) -> int:
  """What a run may fill of one device of a target: the kind's usable share on a GPU (JAX
  preallocates 75%), all of a TPU's HBM (its compiler reports an overflow itself)."""
  return int(kind.memory_bytes * (kind.usable_memory_fraction if platform == "gpu" else 1.0))


class TrainingCompiler:
  """Compiles what one optimizer step runs, as the trainer runs it (programs.py), for a mesh's
  devices (a target's or the local ones), at the accumulation a config asks for: compile_run's
  training programs, and the accumulations fit.py tries (the programs do not depend on it: a
  step's accumulation is passed in, decided once by the caller)."""

  def __init__(self, config, mesh):
    self.mesh, self.mesh_axes = mesh, dict(mesh.shape)
    self.boundaries = bucketing.boundaries_for(config.dataset)
    self.tokens_per_batch = config.tokens_per_batch
    self.data_shards = self.mesh_axes["data"]
    self.num_devices = mesh.devices.size
    self.model = train_step.make_model(config, mesh.devices.flat[0], mesh.devices.size)
    self.abstract_state, logical_specs = train_step.state_shapes_and_logical_specs(
        config, self.model)
    self.state_sharding = sharding.train_state_shardings(
        mesh, self.abstract_state, logical_specs, config.fsdp)
    self.programs = training_programs(config, self.model, mesh, self.state_sharding)
    self.replicated = sharding.replicated(mesh)
    self.batch_sharding = sharding.batch_sharding(mesh)
    self.state = sharding.placed(self.abstract_state, self.state_sharding)
    rng = jax.eval_shape(lambda: train_step.dropout_key(0))
    self.rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=self.replicated)
    self.scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.replicated)
    # What stays on each device beside an accumulate step's arguments (the parameters, the
    # sums, a batch): Adam's moments and the step count.
    self.resident_bytes = (_shard_bytes(self.abstract_state, self.state_sharding)
                           - _shard_bytes(self.abstract_state.params, self.state_sharding.params))
    self._apply = None

  def accumulation(self, config) -> int:
    """The micro-batches that config.micro_batch_tokens_per_device asks for on this mesh."""
    return train_step.accumulation_steps(config, self.data_shards)

  def micro_tokens(self, accumulation: int) -> int:
    """Real tokens per side of a micro-batch, as the trainer's micro_config."""
    return self.tokens_per_batch // accumulation

  def buckets(self, accumulation: int) -> list[int]:
    return _candidate_buckets(self.boundaries, self.model.config,
                              self.micro_tokens(accumulation), self.data_shards)

  def batch_of(self, length: int, accumulation: int):
    rows = bucketing.batch_size_for(
        length, bucketing.padded_budget(self.micro_tokens(accumulation)), self.data_shards)
    return f"{rows}x{length}", {
        key: jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=self.batch_sharding)
        for key in ("inputs", "targets")}

  def compile_step(self, config, length: int,
                   accumulation: int | None = None) -> list[CompiledProgram]:
    """What one optimizer step of `config` runs, for batches of the bucket `length`, at
    `accumulation` micro-batches (None: config.micro_batch_tokens_per_device's)."""
    accumulation = accumulation or self.accumulation(config)
    shape, batch = self.batch_of(length, accumulation)
    steps_per_call, n = config.get("steps_per_call", 1), self.num_devices
    state, programs = self.state, self.programs
    if accumulation == 1 and steps_per_call > 1:
      # The trainer runs every step through this program, K batches of one shape per call.
      stacked_sharding = sharding.stacked_batch_sharding(self.mesh)
      stacked = {key: jax.ShapeDtypeStruct((steps_per_call, *x.shape), jnp.int32,
                                           sharding=stacked_sharding)
                 for key, x in batch.items()}
      return [_compile("train_steps", f"{steps_per_call}x{shape}", programs.steps_fn,
                       (state, stacked, self.scalar, self.rng), n)]
    if accumulation == 1:
      return [_compile("train_step", shape, programs.step_fn, (state, batch, self.rng), n)]
    accumulate = _compile("accumulate_step", shape, programs.accumulate_fn,
                          (self._sums(), state.params, batch, self.rng, self.scalar,
                           self.scalar), n)
    return [dataclasses.replace(accumulate, resident_bytes=self.resident_bytes),
            self.apply_program()]

  def compile_buckets(self, config, accumulation: int) -> dict[int, list[CompiledProgram]]:
    """compile_step at each bucket that may need the most memory (buckets)."""
    return {length: self.compile_step(config, length, accumulation)
            for length in self.buckets(accumulation)}

  def _sums(self):
    """The abstract gradient and metric sums an accumulation carries (the batch's shape does
    not change them)."""
    shortest = self.data_shards, 8
    batch = {key: jax.ShapeDtypeStruct(shortest, jnp.int32, sharding=self.batch_sharding)
             for key in ("inputs", "targets")}
    grads, metrics = jax.eval_shape(self.programs.accumulate_fn, None, self.state.params, batch,
                                    self.rng, self.scalar, self.scalar)
    return (sharding.placed(grads, self.state_sharding.params),
            sharding.placed(metrics, jax.tree.map(lambda _: self.replicated, metrics)))

  def apply_program(self) -> CompiledProgram:
    """The update from accumulated sums: the same program at every accumulation (compiled
    once)."""
    if self._apply is None:
      self._apply = _compile("apply_gradient_sums", "-", self.programs.apply_fn,
                             (self.state, *self._sums()), self.num_devices)
    return self._apply


def compile_run(config, target_name: str,
                include=("train", "eval", "decode", "evaluate"), length: int | None = None,
                training: dict | None = None, accumulation: int | None = None) -> dict:
  """Compiles the run's programs for the target (those of `include`; tests leave some out to
  save time) with training batches of the bucket `length` (default: the bucket that needs the
  most memory); returns the compiled plan (a dict). `training`: the training programs already
  compiled for this config, by bucket (fit.py's chosen trial), not compiled again, at the run
  plan's `accumulation` (None: config.micro_batch_tokens_per_device's).

  "train": what one optimizer step runs (train_steps with K = steps_per_call stacked batches,
  train_step, or accumulate_step + apply_gradient_sums); "eval": the loss of a validation batch;
  "decode": the greedy decoding of training's validation BLEU; "evaluate": evaluate.py's
  decoding (beam_size); both over every device, as translator.py places them."""
  target = accelerator_targets.target(target_name)
  target_devices = accelerator_targets.topology_devices(target)
  kind = devices.kind(target.kind)
  mesh = sharding.make_mesh(config.mesh, target_devices, config.dcn_mesh)
  compiler = TrainingCompiler(config, mesh)
  model, params = compiler.model, compiler.state.params
  programs, n = compiler.programs, len(target_devices)
  accumulation = accumulation or compiler.accumulation(config)
  candidates = [length] if length is not None else compiler.buckets(accumulation)
  # Each candidate bucket's training programs are compiled once; the one needing more memory
  # is the run's (compiled even when "train" is left out of the plan, to choose the bucket).
  if training is None and ("train" in include or len(candidates) > 1):
    training = {length: compiler.compile_step(config, length, accumulation)
                for length in candidates}
  if training:
    length = max(training, key=lambda length: max(p.memory_bytes for p in training[length]))
  else:
    (length,) = candidates
  shape, batch = compiler.batch_of(length, accumulation)
  compiled = list(training[length]) if "train" in include else []
  if "eval" in include:
    compiled.append(_compile("eval_step", shape, programs.eval_fn, (params, batch), n))
  # The translator decodes over every device on one data axis (across slices too), with the
  # parameters whole on each and a batch's rows split over them (translator.py).
  decoding_mesh = sharding.data_parallel_mesh(target_devices)
  placement = (_same_for_all(params, sharding.replicated(decoding_mesh)),
               sharding.batch_sharding(decoding_mesh))
  if "decode" in include and training_decode_sentences(config):
    compiled.append(_compile_decoding(
        "greedy_decode", config, model, params, placement, beam_size=1,
        rows=translator.batch_rows(
            training_decode_sentences(config), _decode_length(config),
            sharding.over_decoding_devices(config.decode_batch_size, decoding_mesh)),
        num_devices=n))
  if "evaluate" in include:
    compiled.append(_compile_decoding(
        f"evaluate_{'beam_search' if config.beam_size > 1 else 'greedy_decode'}", config,
        model, params, placement, beam_size=config.beam_size,
        rows=sharding.over_decoding_devices(config.decode_batch_size, decoding_mesh),
        num_devices=n))

  largest = max(compiled, key=lambda p: p.memory_bytes)
  decoding_memory = _training_decode_memory(compiler.abstract_state, compiler.state_sharding,
                                            compiled)
  usable = usable_memory(kind, target.platform)
  return {"target": target.name, "target_devices": f"{n} x {target_devices[0].device_kind}",
          "target_hosts": len({(getattr(d, "slice_index", 0), d.process_index)
                               for d in target_devices}),
          "target_mesh": ",".join(f"{k}:{v}" for k, v in compiler.mesh_axes.items()),
          "target_compute_dtype": model.config.dtype,
          "accumulation_steps": accumulation, "programs": compiled, "largest": largest,
          "device_memory": kind.memory_bytes, "usable_device_memory": usable,
          "compiled_flops_per_optimizer_step": _flops_per_optimizer_step(compiled, accumulation),
          "fits": largest.memory_bytes <= usable,
          "forms_fallen_back": ", ".join(compiler.programs.forms.fell_back) or "none",
          **decoding_memory}


def _shard_bytes(tree, shardings) -> int:
  """Bytes that one device holds of a tree of arrays placed by `shardings` (its largest
  shard of each)."""
  return sum(math.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
             for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))


def _training_decode_memory(abstract_state, state_sharding, compiled) -> dict:
  """What the trainer holds per device around its validation decoding (trainer.py
  evaluate_translations), beside the programs: the training state as sharded
  (`state_bytes_per_device`); the decoding's copy of the parameters, whole on each device
  (`decode_copy_bytes_per_device`: parameters that training already keeps whole on every
  device are read in place, the others are gathered into it: FSDP, a `model` axis); while
  decoding, the state beside the greedy decoding's program, whose arguments hold that copy
  (`compiled_memory_while_decoding`); and what every later training step would hold if the
  copy were kept after the decoding, as the trainer did before it dropped it
  (`compiled_memory_training_with_decode_copy`: the largest training program + the copy). The
  copy lives between the programs, so no compiled program shows it alone."""
  params, placements = abstract_state.params, state_sharding.params
  whole = [(x, s) for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(placements))]
  copy = sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x, s in whole
             if not s.is_fully_replicated)
  state = _shard_bytes(abstract_state, state_sharding)
  figures = {"state_bytes_per_device": state, "decode_copy_bytes_per_device": copy}
  by_name = {p.name: p for p in compiled}
  if "greedy_decode" in by_name:
    in_place = sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x, s in whole
                   if s.is_fully_replicated)  # already counted among the decoding's arguments
    figures["compiled_memory_while_decoding"] = (state - in_place
                                                 + by_name["greedy_decode"].memory_bytes)
  training = [p for p in compiled if p.name not in ("eval_step", "greedy_decode")
              and not p.name.startswith("evaluate_")]
  if training:
    figures["compiled_memory_training_with_decode_copy"] = (
        max(p.memory_bytes for p in training) + copy)
  return figures


def training_decode_sentences(config) -> int:
  """The validation sentences the trainer greedy-decodes for its task's metric (the task's
  validation_sentences, as trainer.py); 0: no decoding during training."""
  return tasks.for_config(config).validation_sentences(config)


def _flops_per_optimizer_step(compiled, accumulation: int) -> float:
  """FLOPs of one optimizer step from the compiled training programs (0 when none was)."""
  by_name = {p.name: p for p in compiled}
  if "train_step" in by_name:
    return by_name["train_step"].flops
  if "train_steps" in by_name:  # XLA counts the loop's body once: one step of the K
    return by_name["train_steps"].flops
  if "accumulate_step" in by_name:
    return accumulation * by_name["accumulate_step"].flops + by_name["apply_gradient_sums"].flops
  return 0.0


def plan_lines(result: dict) -> list[str]:
  lines = [f"{key}: {result[key]}" for key in ("target", "target_devices", "target_hosts",
                                               "target_mesh", "target_compute_dtype")]
  for p in result["programs"]:
    lines.append(f"compiled_{p.name}: {p.shape} memory {p.memory_bytes} = arguments "
                 f"{p.argument_bytes} + outputs {p.output_bytes} + temporaries "
                 f"{p.temporary_bytes} - aliased {p.alias_bytes}"
                 + (f" + resident {p.resident_bytes} (Adam's moments)" if p.resident_bytes
                    else "") + f"; flops {p.flops:.4g}; "
                 f"collectives {' '.join(f'{op}/{size}' for op, size in p.collectives) or 'none'}")
  largest = result["largest"]
  lines += [f"compiled_memory_per_device: {largest.memory_bytes}",
            f"compiled_memory_program: {largest.name}",
            f"device_memory: {result['device_memory']}",
            f"usable_device_memory: {result['usable_device_memory']}",
            f"fits: {'yes' if result['fits'] else 'no'}",
            f"forms_fallen_back: {result['forms_fallen_back']} (docs/TRAIN.md, the GPU forms)",
            *(f"{key}: {result[key]}" for key in (
                "state_bytes_per_device", "decode_copy_bytes_per_device",
                "compiled_memory_while_decoding", "compiled_memory_training_with_decode_copy")
              if key in result),
            f"compiled_flops_per_optimizer_step: {result['compiled_flops_per_optimizer_step']:.6g}"]
  return lines


def does_not_fit_message(result: dict) -> str:
  """The one line for a plan whose largest program exceeds the device's usable memory."""
  largest, usable = result["largest"], result["usable_device_memory"]
  return (f"{result['target']}: {largest.name} ({largest.shape}) needs {largest.memory_bytes} "
          f"bytes ({largest.memory_bytes / devices.GIB:.2f} GiB) per device, "
          f"{usable} ({usable / devices.GIB:.2f} GiB) available; try {HELPFUL_KEYS}")


def _decode_length(config) -> int:
  """Sources of the longest training length, padded as the translator pads them."""
  return translator.padded_source_length(config.dataset.max_length)


def _compile_decoding(name, config, model, params, placement, *, beam_size: int, rows: int,
                      num_devices: int) -> CompiledProgram:
  """One call of the translator's decoding: `rows` sources of the longest training length
  (rounded up to the devices that split them, as the translator pads a batch), parameters and
  sources placed by `placement` (the parameters' shardings, the sources')."""
  length = _decode_length(config)
  devices = placement[1].mesh.shape["data"]
  rows = -(-rows // devices) * devices
  constraint = tasks.for_config(config).stand_in_decoding_constraint(config.model.vocab_size)
  decode_fn = translator.make_decode_fn(model, beam_size, config.length_penalty_alpha,
                                        config.decode_extra_length, constraint_for=constraint,
                                        devices=devices)
  params = sharding.placed(params, placement[0])
  sources = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=placement[1])
  return _compile(name, f"{rows}x{length}", decode_fn, (params, sources), num_devices)
