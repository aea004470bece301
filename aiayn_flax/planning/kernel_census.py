"""What a compiled GPU (or TPU) program launches, read from XLA's optimized HLO text, deviceless.

Each instruction of the ENTRY computation that is not bookkeeping (parameter, tuple,
get-tuple-element, bitcast, constant) is one kernel launch on a GPU: a fusion (kCustom: a
matmul, XLA's gemm fusion or cuBLAS; kInput: a reduction; kLoop/kOutput: elementwise), a
library call, a copy or a collective. A `while` or `conditional` there is a round trip through
the host. For each kernel the census records the bytes it reads and writes (its operands' and
outputs' sizes: an upper bound, since a fusion may read part of an operand) and, for matmuls,
the FLOPs of the dot it calls; `roofline_ms` turns those into a time per step on a GPU's
published peaks. The one measured row (an H200, docs/RESULTS.md) calibrates the estimate.
"""
import collections
import dataclasses
import math
import re

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "f8e4m3fn": 1,
          "f8e5m2": 1}
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(")
_BOOKKEEPING = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant", "after-all",
                "partition-id", "replica-id", "opt-barrier", "add-dependency"}
_HOST_ROUND_TRIPS = {"while", "conditional"}


@dataclasses.dataclass(frozen=True)
class Kernel:
  name: str
  kind: str  # matmul, reduction, elementwise, copy, collective, loop, or the HLO op
  part: str  # the part of the model or step it comes from (scope names in op_name)
  bytes_read: int
  bytes_written: int
  flops: float
  largest_operand: int  # elements of its largest operand


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  shape: str
  op: str
  operands: tuple
  attributes: str


def array_sizes(shape: str) -> list[tuple[int, int]]:
  """(elements, bytes) of each array in a shape's text (one, or a tuple's)."""
  sizes = []
  for dtype, dims in _ARRAY.findall(shape):
    elements = math.prod(int(d) for d in dims.split(",") if d)
    sizes.append((elements, elements * _BYTES[dtype]))
  return sizes


def parse_module(hlo_text: str) -> dict[str, list[Instruction]]:
  """The module's computations by name, each a list of its instructions; "ENTRY" is the entry."""
  computations, current = {}, None
  for line in hlo_text.splitlines():
    if current is None:
      if match := _COMPUTATION.match(line):
        current = "ENTRY" if line.startswith("ENTRY") else match.group(1)
        computations[current] = []
      continue
    if line.startswith("}"):
      current = None
      continue
    if match := _INSTRUCTION.match(line):
      name, shape, op, rest = match.groups()
      depth, end = 1, 0
      for end, char in enumerate(rest):  # the operand list ends at its closing parenthesis
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
          break
      operands = tuple(re.findall(r"%([\w.\-]+)", rest[:end]))
      computations[current].append(Instruction(name, shape, op, operands, rest[end + 1:]))
  return computations


def _dot_flops(instruction: Instruction, shapes: dict[str, str]) -> float:
  out = sum(elements for elements, _ in array_sizes(instruction.shape))
  contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instruction.attributes)
  lhs = _ARRAY.search(shapes[instruction.operands[0]])
  dims = [int(d) for d in lhs.group(2).split(",") if d]
  k = math.prod(dims[int(i)] for i in contracting.group(1).split(",") if i) if contracting else 1
  return 2.0 * out * k


def _called(instruction: Instruction) -> list[str]:
  return re.findall(r"(?:calls|body|condition|to_apply|branch_computations)=\{?%([\w.\-]+)",
                    instruction.attributes)


def _kind(instruction: Instruction) -> str:
  attributes = instruction.attributes
  if instruction.op == "fusion":
    fusion_kind = re.search(r"kind=k(\w+)", attributes).group(1)
    return {"Custom": "matmul", "Input": "reduction", "Loop": "elementwise",
            "Output": "elementwise"}.get(fusion_kind, fusion_kind.lower())
  if instruction.op == "custom-call":
    target = re.search(r'custom_call_target="([^"]*)"', attributes)
    target = target.group(1) if target else ""
    if "cudnn" in target.lower() and ("fmha" in target.lower() or "attention" in target.lower()):
      return "attention (cuDNN)"
    if target == "__gpu$xla.gpu.triton":
      return "Pallas (Triton)"
    return "matmul" if ("gemm" in target.lower() or "matmul" in target.lower()) else target
  if instruction.op in ("copy", "transpose"):
    return "copy"
  if instruction.op.startswith(("all-", "reduce-scatter", "collective-")):
    return "collective"
  return instruction.op


# The step's parts, by the scopes jax records in each op's name (Flax module names, the train
# step's named scopes): the first that matches.
_PARTS = (("optimizer", "optimizer"), ("loss", "loss"), ("LayerNorm", "layer norm"),
          ("ropout", "dropout"), ("attention", "attention"), ("ffn", "feed-forward"),
          ("embed", "embeddings"), ("Transformer", "model, other"))


def _part(instruction: Instruction, computations) -> str:
  names = re.findall(r'op_name="([^"]*)"', instruction.attributes)
  for called in _called(instruction):
    names += [n for i in computations.get(called, ()) for n in
              re.findall(r'op_name="([^"]*)"', i.attributes)]
  text = " ".join(names)
  for key, part in _PARTS:
    if key in text:
      return part
  return "unnamed (layout, padding)" if not text else "other"


def _bytes_read(instruction: Instruction, computations, shapes) -> int:
  """The bytes a kernel reads: each operand whole, except in an elementwise fusion, which reads
  at most one element of each operand per element it writes (the one-vector optimizer's
  fusions each update a slice of one vector of all parameters)."""
  elementwise = _kind(instruction) == "elementwise"
  written = sum(elements for elements, _ in array_sizes(instruction.shape))
  total = 0
  for operand in instruction.operands:
    for elements, size in array_sizes(shapes[operand]):
      total += min(size, written * size // elements) if elementwise and elements else size
  return total


def census(hlo_text: str) -> dict:
  """Kernels of the ENTRY computation (and, per iteration, of the bodies of its loops)."""
  computations = parse_module(hlo_text)
  shapes = {i.name: i.shape for instructions in computations.values() for i in instructions}
  kernels, round_trips = [], collections.Counter()

  def flops_of(instruction):
    return sum(_dot_flops(i, shapes) for called in _called(instruction)
               for i in computations.get(called, ()) if i.op == "dot")

  def visit(computation):
    for instruction in computations.get(computation, ()):
      if instruction.op in _BOOKKEEPING:
        continue
      if instruction.op in _HOST_ROUND_TRIPS:
        round_trips[instruction.op] += 1
        for called in _called(instruction):
          visit(called)
        continue
      operand_sizes = [size for o in instruction.operands for size in array_sizes(shapes[o])]
      kind = _kind(instruction)
      kernels.append(Kernel(
          instruction.name, kind, _part(instruction, computations),
          bytes_read=_bytes_read(instruction, computations, shapes),
          bytes_written=sum(b for _, b in array_sizes(instruction.shape)),
          flops=flops_of(instruction) if kind == "matmul" else 0.0,
          largest_operand=max((e for e, _ in operand_sizes), default=0)))

  visit("ENTRY")
  return {"kernels": kernels, "while": round_trips["while"],
          "conditional": round_trips["conditional"]}


def full_vocabulary_passes(kernels: list[Kernel], logits_elements: int) -> list[Kernel]:
  """The loss's kernels that read an operand as large as the logits (rows x length x
  vocabulary): its passes over them. (The matmuls that read the logits' gradient are not the
  loss's, nor is a pad of that gradient to the matmul's tile, which XLA adds for row counts
  off it.)"""
  return [k for k in kernels if k.part == "loss" and k.largest_operand >= logits_elements]


@dataclasses.dataclass(frozen=True)
class Gpu:
  name: str
  bf16_flops: float  # dense, per second
  bandwidth: float  # HBM bytes per second


# NVIDIA's datasheets (SXM): 989 TFLOP/s dense bf16 for both; HBM3 3.35 TB/s, HBM3e 4.8 TB/s.
H100 = Gpu("H100 SXM", 989e12, 3.35e12)
H200 = Gpu("H200 SXM", 989e12, 4.8e12)
# The one measured row (docs/RESULTS.md, "On an accelerator"): base at 976 x 32 on an H200, each
# step waited for.
MEASURED_H200_BASE = {"launches": 1657, "kernels_ms": 46.2, "step_ms": 58.5}
# What a kernel costs at least, however small (launch latency and the tail of its blocks), and
# what the host spends launching one, from that row: the step's time beyond its kernels per
# launch (7.4 us), not hidden when each step is waited for.
MIN_KERNEL_SECONDS = 2e-6
_BEYOND_KERNELS_MS = MEASURED_H200_BASE["step_ms"] - MEASURED_H200_BASE["kernels_ms"]
HOST_LAUNCH_SECONDS = _BEYOND_KERNELS_MS * 1e-3 / MEASURED_H200_BASE["launches"]


def roofline_ms(kernels: list[Kernel], gpu: Gpu) -> dict[str, float]:
  """Per step: `kernels` is the sum of each kernel's roofline time (its FLOPs at peak or its
  bytes at full bandwidth, whichever is longer, at least MIN_KERNEL_SECONDS); `launch` the
  host's time to launch them all; `waited` the two added (a step waited for cannot launch
  while the previous one runs), `pipelined` the larger of the two (steps queued back to back)."""
  seconds = sum(max(k.flops / gpu.bf16_flops, (k.bytes_read + k.bytes_written) / gpu.bandwidth,
                    MIN_KERNEL_SECONDS) for k in kernels)
  launch = len(kernels) * HOST_LAUNCH_SECONDS
  return {"kernels": 1e3 * seconds, "launch": 1e3 * launch, "waited": 1e3 * (seconds + launch),
          "pipelined": 1e3 * max(seconds, launch)}


def table_by(kernels: list[Kernel], attribute: str) -> list[tuple[str, int, float, float]]:
  """(value, kernels, GB moved, GFLOP) per value of `attribute` (kind or part), most first."""
  rows = collections.defaultdict(lambda: [0, 0.0, 0.0])
  for k in kernels:
    row = rows[getattr(k, attribute)]
    row[0] += 1
    row[1] += (k.bytes_read + k.bytes_written) / 1e9
    row[2] += k.flops / 1e9
  return sorted(((key, *row) for key, row in rows.items()), key=lambda r: -r[1])


def train_step_hlo(config, target_name: str, length: int) -> tuple[str, str, object]:
  """The optimized HLO text of one training step (one batch per call) compiled for a target
  without its devices, its batch shape ("ROWSxLENGTH"), and the compiled program (XLA's cost
  analysis answers on a TPU). The batch is the config's bucket `length` at its token budget."""
  import jax
  import jax.numpy as jnp

  from aiayn_flax.planning import accelerator_targets
  from aiayn_flax import programs, sharding, train_step
  from aiayn_flax.data import bucketing
  target = accelerator_targets.target(target_name)
  target_devices = accelerator_targets.topology_devices(target)
  mesh = sharding.make_mesh(config.mesh, target_devices, config.dcn_mesh)
  model = train_step.make_model(config, target_devices[0], len(target_devices))
  abstract_state, logical_specs = train_step.state_shapes_and_logical_specs(config, model)
  state_sharding = sharding.train_state_shardings(mesh, abstract_state, logical_specs,
                                                  config.fsdp)
  step_fn = programs.training_programs(config, model, mesh, state_sharding).step_fn
  state = sharding.placed(abstract_state, state_sharding)
  rows = bucketing.batch_size_for(length, bucketing.padded_budget(config.tokens_per_batch),
                                  dict(mesh.shape)["data"])
  batch = {key: jax.ShapeDtypeStruct((rows, length), jnp.int32,
                                     sharding=sharding.batch_sharding(mesh))
           for key in ("inputs", "targets")}
  rng = jax.eval_shape(lambda: train_step.dropout_key(0))
  rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=sharding.replicated(mesh))
  compiled = step_fn.lower(state, batch, rng).compile()
  return compiled.as_text(), f"{rows}x{length}", compiled
