"""Device mesh from the config, and where arrays live on it.

Batches are split along the mesh's `data` axis. Parameters carry logical axis names (set in
model.py); the rules below map them to mesh axes: with a `model` axis, attention heads, FFN
units and the vocabulary are split across it (tensor parallelism, Megatron-style); with
`fsdp`, the d_model axis of every parameter is also split over `data`. Optimizer moments
follow their parameters.

Multi-host (a TPU pod slice, several GPU hosts): `initialize_distributed` joins the processes
before anything touches a device; every host builds the same global batch (its order is a
function of seed and epoch) and hands over only the rows of its own devices (`put_batch`);
checkpoints are written collectively by orbax, and only host 0 writes logs.
"""
import os

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

TENSOR_PARALLEL_RULES = (("heads", "model"), ("mlp", "model"), ("vocab", "model"),
                         ("kv", None), ("embed", None))
FSDP_RULES = (("heads", "model"), ("mlp", "model"), ("vocab", "model"), ("kv", None),
              ("embed", "data"))


def parse_mesh(spec: str, num_devices: int) -> dict[str, int]:
  """"data:4,model:2" -> {"data": 4, "model": 2}; one size may be -1 (the remaining devices)."""
  axes = {}
  for part in spec.split(","):
    name, _, size = part.partition(":")
    if not name or not size.lstrip("-").isdigit():
      raise ValueError(f"config.mesh={spec!r}: expected 'axis:size,...' such as 'data:-1'")
    axes[name.strip()] = int(size)
  if "data" not in axes:
    raise ValueError(f"config.mesh={spec!r}: needs a 'data' axis")
  known = int(np.prod([s for s in axes.values() if s != -1]))
  for name, size in axes.items():
    if size == -1:
      axes[name] = num_devices // known
  if int(np.prod(list(axes.values()))) != num_devices:
    raise ValueError(f"config.mesh={spec!r} does not cover the {num_devices} devices")
  return axes


def make_mesh(spec: str, devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  axes = parse_mesh(spec, len(devices))
  return Mesh(np.asarray(devices).reshape(tuple(axes.values())), tuple(axes))


def initialize_distributed() -> bool:
  """jax.distributed.initialize() when the environment says this process is one of several:
  a multi-host TPU slice (TPU_WORKER_HOSTNAMES lists several hosts), a SLURM job of several
  tasks, or an explicit coordinator (JAX_COORDINATOR_ADDRESS, with JAX_NUM_PROCESSES and
  JAX_PROCESS_ID for a launcher JAX does not detect by itself). JAX reads the rest from the
  same environment. Returns whether it initialized."""
  tpu_hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  several = ("," in tpu_hosts or int(os.environ.get("SLURM_NTASKS", "1")) > 1
             or bool(os.environ.get("JAX_COORDINATOR_ADDRESS")))
  if several:
    explicit = {}
    if os.environ.get("JAX_NUM_PROCESSES") and os.environ.get("JAX_PROCESS_ID"):
      explicit = dict(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                      process_id=int(os.environ["JAX_PROCESS_ID"]))
    jax.distributed.initialize(**explicit)
  return several


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P("data"))


def stacked_batch_sharding(mesh: Mesh) -> NamedSharding:
  """Several batches stacked [K, rows, ...] (train_step.train_steps): rows split along `data`."""
  return NamedSharding(mesh, P(None, "data"))


def put_batch(batch: dict, sharding: NamedSharding) -> dict:
  """Places this host's copy of a global batch [rows, ...] (or [K, rows, ...]) on the mesh,
  rows split along `data`. With several processes each passes only its own block of rows
  (process i holds rows i * rows / processes onwards, the devices of a mesh built from
  jax.devices() being ordered by process)."""
  if jax.process_count() == 1:
    return jax.device_put(batch, sharding)
  rows_axis = list(sharding.spec).index("data")

  def local_rows(x):
    per_process = x.shape[rows_axis] // jax.process_count()
    start = jax.process_index() * per_process
    local = np.take(x, np.arange(start, start + per_process), axis=rows_axis)
    return jax.make_array_from_process_local_data(sharding, local, x.shape)
  return jax.tree.map(local_rows, batch)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape["data"]


def logical_axis_rules(mesh: Mesh, fsdp: bool = False):
  """Rules for this mesh: axes the mesh lacks (e.g. no `model` axis) map to None."""
  rules = FSDP_RULES if fsdp else TENSOR_PARALLEL_RULES
  return tuple((name, axis if axis in mesh.axis_names else None) for name, axis in rules)


def param_shardings(mesh: Mesh, logical_specs, fsdp: bool = False):
  """NamedShardings for parameters, from their logical PartitionSpecs."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, logical_axis_rules(mesh, fsdp))


def train_state_shardings(mesh: Mesh, abstract_state, logical_specs, fsdp: bool = False):
  """Shardings of a whole TrainState: parameters by their rules, Adam's moments like their
  parameters (optax.tree_map_params), counters and everything else replicated."""
  params = param_shardings(mesh, logical_specs, fsdp)
  opt_state = optax.tree_map_params(
      abstract_state.tx, lambda _, sharding: sharding, abstract_state.opt_state, params,
      transform_non_params=lambda _: replicated(mesh))
  return abstract_state.replace(step=replicated(mesh), params=params, opt_state=opt_state)
