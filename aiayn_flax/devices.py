"""Accelerators the dry-run plan knows: peak matmul throughput and memory of one JAX device.

A "device" is what `jax.devices()` lists, which is not always a chip:
- TPU v3 has no megacore: each chip's two TensorCores are two JAX devices, so a TPU v3-8
  (4 chips, 8 TensorCores; the number in the name counts TensorCores) is 8 devices of 16 GiB
  and half a chip's 123 TFLOP/s each.
- TPU v4 is a megacore chip: its two TensorCores form one JAX device, so a TPU v4-8 (4 chips,
  8 TensorCores) is 4 devices of 32 GiB and 275 TFLOP/s each.
- TPU v5e (v5 lite) has one TensorCore per chip: a v5e-8 is 8 devices of 16 GiB.
- TPU v5p is a megacore chip like v4: a v5p-8 (4 chips) is 4 devices of 95 GiB.
- A GPU is one device.

Sources: cloud.google.com/tpu/docs/v3 (123 TFLOP/s bf16 and 32 GiB HBM per chip, two
TensorCores per chip) and /tpu/docs/v4 (275 TFLOP/s bf16, 32 GiB per chip); the JAX Pallas
`ChipVersion` table (megacore on v4, not on v3) and jax-ml/jax discussion #36155 (a v4 JAX
device is a megacore). NVIDIA datasheets: V100 SXM2 125 TFLOP/s fp16 tensor, 15.7 f32; A100
312 bf16 dense, 156 TF32 dense; H100 SXM5 989 bf16 dense, 495 TF32 dense (the datasheet's
1979 / 989 are with 2:4 sparsity); H200 is the H100's compute with 141 GB. P100: the paper's
own 9.5 TFLOP/s (Table 2 footnote; the PCIe card's f32 peak at boost clock). TPU v5e: 197
TFLOP/s bf16, 16 GiB per chip (cloud.google.com/tpu/docs/v5e); v5p: 459 TFLOP/s bf16, 95 GiB
per chip (/tpu/docs/v5p). T4: 65 TFLOP/s fp16 tensor, 8.1 f32, 16 GB GDDR6 (15 GiB visible);
L4: 121 TFLOP/s bf16 dense (242 with sparsity), 60 TF32 dense, 24 GB (NVIDIA datasheets).
A10G (AWS g5): 70 TFLOP/s bf16 dense, 35 TF32 dense, 24 GB GDDR6 of which nvidia-smi shows
23028 MiB, 600 GB/s (the figures AWS and NVIDIA give for the g5's A10G, 80 SMs at 1.71 GHz).

bfloat16 units: TPUs, and NVIDIA GPUs from Ampere on (compute capability 8.0: A100, L4, H100).
V100, T4 and P100 have none: XLA runs a bf16 program there through f32 arithmetic, so their
16-bit peak below is their f32 peak and "auto" precision gives f32. Their tensor cores take
fp16, which needs loss scaling to train (fp16's 5 exponent bits underflow small gradients);
the project has no loss scaling, so it does not plan or run fp16.

`peak_flops_32bit` is what float32 matmuls reach under JAX's default precision: one bfloat16
pass on TPU (jax-ml/jax#1856), TF32 on Ampere and Hopper GPUs (jax-ml/jax#4873, #12008), true
f32 on V100 and P100.

It lies in the model layer although planning/ is its main reader: train_step.py reads the
compute dtype of a device's kind here, so in planning/ the two layers would import each other.

It also says which platform's form of an operation a trace takes (platform_dependent): the
model, loss and optimizer have GPU forms that a program built for CPU devices never traces.
"""
import contextvars
import dataclasses
import functools
import os

import jax

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class DeviceKind:
  name: str
  description: str
  peak_flops_16bit: float  # dense bf16 matmul FLOP/s of one JAX device (f32's without bf16 units)
  peak_flops_32bit: float  # float32 matmul FLOP/s under JAX's default precision
  memory_bytes: int  # HBM of one JAX device
  usable_memory_fraction: float  # what a training step may plan to fill
  host: str  # the standard host, e.g. "TPU v3-8"
  host_devices: int  # JAX devices in that host
  bfloat16_units: bool = True  # False: bf16 runs no faster than f32, "auto" precision is f32

  def peak_flops(self, dtype: str) -> float:
    """Peak for a compute dtype ("auto" resolved for this kind: compute_dtype)."""
    dtype = compute_dtype(dtype, self)
    return self.peak_flops_16bit if dtype in ("bfloat16", "float16") else self.peak_flops_32bit


# JAX preallocates 75% of a GPU's memory by default (XLA_PYTHON_CLIENT_MEM_FRACTION); on TPU
# most HBM is usable, less a margin for XLA's temporaries and fragmentation.
_GPU_FRACTION = 0.75
_TPU_FRACTION = 0.85

KINDS = {k.name: k for k in [
    DeviceKind("tpu_v3", "TPU v3 TensorCore (half a chip)", 61.5e12, 61.5e12, 16 * GIB,
               _TPU_FRACTION, "TPU v3-8", 8),
    DeviceKind("tpu_v4", "TPU v4 chip (megacore)", 275e12, 275e12, 32 * GIB, _TPU_FRACTION,
               "TPU v4-8", 4),
    DeviceKind("tpu_v5e", "TPU v5e chip", 197e12, 197e12, 16 * GIB, _TPU_FRACTION, "TPU v5e-8",
               8),
    DeviceKind("tpu_v5p", "TPU v5p chip (megacore)", 459e12, 459e12, 95 * GIB, _TPU_FRACTION,
               "TPU v5p-8", 4),
    DeviceKind("v100", "V100 SXM2 16 GB", 15.7e12, 15.7e12, 16 * GIB, _GPU_FRACTION,
               "8 x V100 (DGX-1)", 8, bfloat16_units=False),
    DeviceKind("v100_32gb", "V100 SXM2 32 GB", 15.7e12, 15.7e12, 32 * GIB, _GPU_FRACTION,
               "8 x V100 32 GB (DGX-1)", 8, bfloat16_units=False),
    DeviceKind("t4", "T4 16 GB", 8.1e12, 8.1e12, 15 * GIB, _GPU_FRACTION, "1 x T4 (Colab)", 1,
               bfloat16_units=False),
    DeviceKind("l4", "L4 24 GB", 121e12, 60e12, 24 * 10**9, _GPU_FRACTION, "1 x L4 (Colab)", 1),
    DeviceKind("a10g", "A10G 24 GB", 70e12, 35e12, 23028 * 2**20, _GPU_FRACTION,
               "1 x A10G (AWS g5.xlarge)", 1),
    DeviceKind("a100", "A100 SXM4 40 GB", 312e12, 156e12, 40 * GIB, _GPU_FRACTION,
               "8 x A100 (DGX A100)", 8),
    DeviceKind("a100_80gb", "A100 SXM4 80 GB", 312e12, 156e12, 80 * GIB, _GPU_FRACTION,
               "8 x A100 80 GB (DGX A100)", 8),
    DeviceKind("h100", "H100 SXM5 80 GB", 989e12, 495e12, 80 * GIB, _GPU_FRACTION,
               "8 x H100 (DGX H100)", 8),
    DeviceKind("h200", "H200 SXM 141 GB", 989e12, 495e12, 141 * 10**9, _GPU_FRACTION,
               "8 x H200 (DGX H200)", 8),
    DeviceKind("p100", "P100 16 GB (the paper's)", 9.5e12, 9.5e12, 16 * GIB, _GPU_FRACTION,
               "8 x P100 (the paper's)", 8, bfloat16_units=False),
]}

# Substrings of jax's `device_kind` (lower case, spaces removed) that identify a kind; the
# first match wins, so the more specific patterns come first.
_LOCAL_PATTERNS = [
    ("tpu_v3", ("tpuv3",)), ("tpu_v4", ("tpuv4",)), ("tpu_v5e", ("tpuv5lite",)),
    ("tpu_v5e", ("tpuv5e",)), ("tpu_v5p", ("tpuv5",)), ("h100", ("h100",)), ("h200", ("h200",)),
    ("t4", ("teslat4",)), ("l4", ("nvidial4",)), ("a10g", ("a10g",)),
    ("a100_80gb", ("a100", "80gb")), ("a100", ("a100",)), ("v100_32gb", ("v100", "32gb")),
    ("v100", ("v100",)), ("p100", ("p100",)),
]


def kind(name: str) -> DeviceKind:
  """A kind of the table; "cpu" is this machine's CPU (local_kind of jax's first CPU device)."""
  if name == "cpu":
    return local_kind(jax.devices("cpu")[0], jax.local_device_count("cpu"))
  if name not in KINDS:
    raise ValueError(f"config.device={name!r}: unknown; known kinds: {sorted(KINDS) + ['cpu']}")
  return KINDS[name]


def compute_dtype(requested: str, kind_: DeviceKind) -> str:
  """The model's compute dtype: `requested` ("float32", "bfloat16"), or for "auto" bfloat16
  where the device has bf16 units (parameters, softmax and loss stay f32: model.py) and
  float32 elsewhere (CPU, V100, T4, P100)."""
  if requested != "auto":
    return requested
  return "bfloat16" if kind_.bfloat16_units else "float32"


def dtype_refusal(requested: str, kind_: DeviceKind) -> str:
  """Why model.dtype `requested` is refused on `kind_`, or "": bfloat16 on a GPU without
  bfloat16 units (T4, V100, P100), where XLA would run it through float32 at no gain and with
  bfloat16's roundings. A CPU runs it (tests of the bfloat16 forms)."""
  if requested == "bfloat16" and not kind_.bfloat16_units and kind_.name != "cpu":
    return (f"config.model.dtype=bfloat16: the {kind_.description} has no bfloat16 units; "
            "set auto (float32 there) or float32")
  return ""


def _has_bfloat16_units(device) -> bool:
  """For a device the table lacks: TPUs have them; CUDA GPUs from compute capability 8.0."""
  if device.platform == "tpu":
    return True
  capability = getattr(device, "compute_capability", "")
  return device.platform == "gpu" and bool(capability) and float(capability) >= 8.0


def local_kind(device, num_local_devices: int = 1) -> DeviceKind:
  """The table's entry for a jax device when its kind is known, else an entry with the memory
  the runtime reports (on CPU: the host's memory shared by its `num_local_devices` simulated
  devices) and no peak FLOP/s (0: unknown)."""
  text = device.device_kind.lower().replace(" ", "")
  for name, parts in _LOCAL_PATTERNS:
    if all(p in text for p in parts):
      return KINDS[name]
  try:
    stats = device.memory_stats()
  except (AttributeError, NotImplementedError, RuntimeError):  # not every backend reports
    stats = None
  if stats and "bytes_limit" in stats:
    memory, fraction = int(stats["bytes_limit"]), 1.0
  else:  # CPU: the host's memory, shared by its simulated devices
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // num_local_devices
    fraction = 0.5
  return DeviceKind(device.platform, device.device_kind, 0.0, 0.0, memory, fraction,
                    f"local {device.platform}", 1, _has_bfloat16_units(device))


# The platform of the devices the program being traced is for, where its builder knows them
# (training_programs: its mesh's); None where it does not, and every form is traced.
_tracing_for = contextvars.ContextVar("aiayn_flax_tracing_for", default=None)


def traced_for(platform: str, function):
  """`function`, whose traces know that their program is for devices of `platform` ("cpu",
  "gpu", "tpu"): a program whose arguments are placed on a mesh's devices can be lowered for
  nothing else (see platform_dependent). Keeps the function's name, which names the program.
  For a function built with its mesh (as training_programs builds them): jax reuses traces of
  the same function, so one traced here must not also be lowered for another platform."""
  @functools.wraps(function)
  def traced(*args, **kwargs):
    token = _tracing_for.set(platform)
    try:
      return function(*args, **kwargs)
    finally:
      _tracing_for.reset(token)
  return traced


def platform_dependent(*args, cpu, **forms):
  """jax.lax.platform_dependent(*args, cpu=cpu, **forms) (each form the operation as it suits
  a platform), except in a program traced for CPU devices (traced_for("cpu", ...)): there the
  CPU's form is called alone. Elsewhere every form is traced and the lowering keeps the one of
  the platform it lowers for, as a deviceless compile for a TPU or GPU (whose devices are a
  topology's, not the CPU's) or the compiled plan's CPU lowering of a GPU step need. Tracing
  every form and differentiating through the conditional that joins them took about 0.5 s of
  the toy train step's trace on 2 CPU cores (docs/lab_notes/TESTS.md)."""
  if _tracing_for.get() == "cpu":
    return cpu(*args)
  return jax.lax.platform_dependent(*args, cpu=cpu, **forms)


# Compiler options, by platform, for a program that runs once (a run's initial state): its
# run time is nothing beside its compile. On a CPU, LLVM at -O1: the same bits as at XLA's
# default level (tests/test_training.py; -O0 rounds otherwise) in less CPU, base's initial
# state 4.7 -> 3.4 s and the toy's 2.7 -> 1.5 s (docs/lab_notes/TESTS.md). Other platforms
# compile it as jax.jit does.
ONE_CALL_COMPILER_OPTIONS = {"cpu": {"xla_backend_optimization_level": 1}}


def call_once(function, platform: str, **jit_kwargs):
  """jax.jit(function, **jit_kwargs)(): the same result, compiled with
  ONE_CALL_COMPILER_OPTIONS for the devices of `platform` it runs on."""
  return jax.jit(function, compiler_options=ONE_CALL_COMPILER_OPTIONS.get(platform),
                 **jit_kwargs)()
