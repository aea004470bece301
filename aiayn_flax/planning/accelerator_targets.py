"""Accelerators the compiled dry run (`train.py --dry_run --target=NAME`) compiles for without
having one: each name is a topology of jax.experimental.topologies and a kind of devices.py.

TPU topologies come from libtpu (the `aot` extra). A GPU topology comes from the CUDA plugin
and a target config: a text proto of the GPU's published figures (XLA's GpuTargetConfigProto),
which XLA uses in place of the device it would otherwise query. The figures are NVIDIA's
(datasheets and the CUDA C++ Programming Guide's table of compute capabilities: shared memory
per SM and per block, registers, threads); memory is what the card reports, bandwidth the
datasheet's. cuDNN/CUDA versions are those jax-cuda12-plugin 0.10.2 is built against.
"""
import dataclasses
import importlib
import math

from aiayn_flax.attention import backends

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class GpuFigures:
  description: str  # what the CUDA driver calls the device (jax's device_kind)
  compute_capability: tuple[int, int]
  sm_count: int
  fp32_units_per_sm: int
  shared_memory_per_sm: int
  threads_per_sm: int
  memory_bytes: int
  memory_bandwidth: int  # bytes/s
  l2_cache_bytes: int
  boost_clock_ghz: float

  @property
  def shared_memory_per_block_optin(self) -> int:
    """What a kernel's block may take, by compute capability: the attention dispatcher's table
    (attention/backends.py), which plans Pallas's blocks on any CUDA GPU with it."""
    major, minor = self.compute_capability
    return backends.SHARED_MEMORY_PER_BLOCK_OPTIN[f"{major}.{minor}"]

  def target_config(self, shared_memory_per_block: int | None = None) -> str:
    """The GpuTargetConfigProto text XLA compiles against (`shared_memory_per_block`: another
    opt-in limit than the GPU's, for bench/attention_kernels.py's measurement)."""
    major, minor = self.compute_capability
    optin = shared_memory_per_block or self.shared_memory_per_block_optin
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {self.shared_memory_per_sm}
  threads_per_core_limit: {self.threads_per_sm}
  core_count: {self.sm_count}
  fpus_per_core: {self.fp32_units_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {self.memory_bandwidth}
  l2_cache_size: {self.l2_cache_bytes}
  clock_rate_ghz: {self.boost_clock_ghz}
  device_memory_size: {self.memory_bytes}
  shared_memory_per_block_optin: {optin}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 patch: 0 }}
runtime_version {{ major: 12 minor: 8 patch: 0 }}
device_description_str: "{self.description}"
"""


KIB = 1024
GPUS = {
    "h100": GpuFigures("NVIDIA H100 80GB HBM3", (9, 0), 132, 128, 228 * KIB, 2048,
                       80 * GIB, 3_350_000_000_000, 50 * 2**20, 1.98),
    "h200": GpuFigures("NVIDIA H200", (9, 0), 132, 128, 228 * KIB, 2048,
                       141 * 10**9, 4_800_000_000_000, 50 * 2**20, 1.98),
    "a100": GpuFigures("NVIDIA A100-SXM4-40GB", (8, 0), 108, 64, 164 * KIB, 2048,
                       40 * GIB, 1_555_000_000_000, 40 * 2**20, 1.41),
    "a100_80gb": GpuFigures("NVIDIA A100-SXM4-80GB", (8, 0), 108, 64, 164 * KIB, 2048,
                            80 * GIB, 2_039_000_000_000, 40 * 2**20, 1.41),
    "v100": GpuFigures("Tesla V100-SXM2-16GB", (7, 0), 80, 64, 96 * KIB, 2048,
                       16 * GIB, 900_000_000_000, 6 * 2**20, 1.53),
    "t4": GpuFigures("Tesla T4", (7, 5), 40, 64, 64 * KIB, 1024, 15 * GIB,
                     320_000_000_000, 4 * 2**20, 1.59),
    "l4": GpuFigures("NVIDIA L4", (8, 9), 58, 128, 100 * KIB, 1536, 24 * 10**9,
                     300_000_000_000, 48 * 2**20, 2.04),
    "a10g": GpuFigures("NVIDIA A10G", (8, 6), 80, 128, 100 * KIB, 1536,
                       23028 * 2**20, 600_000_000_000, 6 * 2**20, 1.71),
}


@dataclasses.dataclass(frozen=True)
class Target:
  name: str
  kind: str  # a kind of devices.py
  num_devices: int
  tpu_topology: tuple = ()  # (topology_name, chip_config_name, chips_per_host_bounds)
  gpu: str = ""  # a key of GPUS
  num_slices: int = 1  # TPU slices of tpu_topology each, joined by the data-center network
  gpu_hosts: int = 1  # GPU nodes (JAX processes), num_devices // gpu_hosts GPUs each

  @property
  def platform(self) -> str:
    return "tpu" if self.tpu_topology else "gpu"

  @property
  def hosts(self) -> int:
    """Hosts (JAX processes) of the slice(s), or GPU nodes."""
    if not self.tpu_topology:
      return self.gpu_hosts
    return self.num_devices // math.prod(self.tpu_topology[2])


def _tpu(name, kind, num_devices, topology, chip_config, bounds, num_slices=1):
  return Target(name, kind, num_devices, tpu_topology=(topology, chip_config, bounds),
                num_slices=num_slices)


TARGETS = {t.name: t for t in [
    _tpu("tpu-v4-8", "tpu_v4", 4, "v4:2x2x1", "megacore", (2, 2, 1)),
    _tpu("tpu-v5e-1", "tpu_v5e", 1, "v5e:1x1", "default", (1, 1, 1)),  # Colab's TPU runtime
    _tpu("tpu-v5e-8", "tpu_v5e", 8, "v5e:2x4", "default", (2, 4, 1)),
    _tpu("tpu-v5p-8", "tpu_v5p", 4, "v5:2x2x1", "megacore", (2, 2, 1)),
    # Pod slices: several hosts of 4 (v4, v5p) or 8 (v5e) chips; the slice's topology is the
    # whole torus, chips_per_host_bounds one host's share of it.
    _tpu("tpu-v4-32", "tpu_v4", 16, "v4:2x2x4", "megacore", (2, 2, 1)),
    _tpu("tpu-v5e-32", "tpu_v5e", 32, "v5e:4x8", "default", (2, 4, 1)),
    _tpu("tpu-v5p-32", "tpu_v5p", 16, "v5:2x2x4", "megacore", (2, 2, 1)),
    # Multislice: two v5e-16 slices (4x4 chips on 2 hosts each), 32 chips; config.dcn_mesh
    # (default: the data axis) says which axis crosses the data-center network.
    _tpu("tpu-v5e-16x2", "tpu_v5e", 32, "v5e:4x4", "default", (2, 4, 1), num_slices=2),
    *(Target(f"gpu-{gpu}x{n}", gpu, n, gpu=gpu)
      for gpu, counts in [("h100", (1, 8)), ("h200", (1, 8)), ("a100", (1, 8)),
                          ("a100_80gb", (1, 8)), ("v100", (1, 8)), ("t4", (1,)), ("l4", (1,)),
                          ("a10g", (1, 4))]
      for n in counts),
    # Two nodes of 8 H100s. (XLA's deviceless GPU topology numbers the hosts' processes but
    # gives every device slice_index 0, where a real cluster gives each host its own: the mesh
    # is the same for meshes that keep a model axis within a node, docs/MULTI_HOST.md.)
    Target("gpu-h100x8x2", "h100", 16, gpu="h100", gpu_hosts=2),
]}


def target(name: str) -> Target:
  if name not in TARGETS:
    raise ValueError(f"--target={name}: unknown; known targets: {', '.join(TARGETS)}")
  return TARGETS[name]


def topology_devices(target_: Target) -> list:
  """The target's devices as jax describes them (they can compile, not run). Needs libtpu for
  TPUs and jax-cuda12-plugin for GPUs (pip install -e '.[aot]'), and jax on its CPU backend."""
  import os
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # another jax process may hold it
  compiler = "libtpu" if target_.tpu_topology else "jax_cuda12_plugin"
  try:
    importlib.import_module(compiler)
  except ImportError:
    raise ValueError(f"--target={target_.name}: compiling for {target_.platform} needs "
                     f"{compiler}, which is not installed: pip install -e '.[aot]' -c "
                     "requirements.lock (libtpu, the CUDA plugin and ptxas)") from None
  import jax
  from jax.experimental import topologies
  jax.config.update("jax_platforms", "cpu")  # nothing here may claim a real accelerator
  try:
    if target_.tpu_topology:
      name, chip_config, bounds = target_.tpu_topology
      description = topologies.get_topology_desc(
          platform="tpu", topology_name=name, chip_config_name=chip_config,
          chips_per_host_bounds=bounds, num_slices=target_.num_slices,
          wrap=(False, False, False))
    else:
      description = topologies.get_topology_desc(
          platform="cuda", target_config=GPUS[target_.gpu].target_config(),
          topology=f"1x{target_.gpu_hosts}x{target_.num_devices // target_.gpu_hosts}")
  except (NotImplementedError, RuntimeError) as e:  # no libtpu / CUDA plugin, or started late
    raise ValueError(f"--target={target_.name}: jax cannot compile for {target_.platform} here "
                     f"({str(e).splitlines()[0][:120]}); pip install -e '.[aot]', and run with "
                     "JAX_PLATFORMS=cpu") from None
  return list(description.devices)
