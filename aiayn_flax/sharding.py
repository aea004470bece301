"""Device mesh from the config, and where arrays live on it.

Batches are split along the mesh's `data` axis. Parameters carry logical axis names (set in
model.py); the rules below map them to mesh axes: with a `model` axis, attention heads, FFN
units and the vocabulary are split across it (tensor parallelism, Megatron-style); with
`fsdp`, the d_model axis of every parameter is also split over `data`. Optimizer moments
follow their parameters.

Multi-host (a TPU pod slice, several GPU hosts): `cluster.initialize_distributed` joins the
processes before anything touches a device; every host follows the same global batch order (a
function of seed and epoch) and builds only the rows its own devices hold
(`process_row_indices`, `put_process_rows`); arrays no host holds whole are gathered for
reading with `host_copy`;
checkpoints are written collectively by orbax, and only host 0 writes logs.
"""

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


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P("data"))


def stacked_batch_sharding(mesh: Mesh) -> NamedSharding:
  """Several batches stacked [K, rows, ...] (train_step.train_steps): rows split along `data`."""
  return NamedSharding(mesh, P(None, "data"))


def put_batch(batch: dict, sharding: NamedSharding) -> dict:
  """Places a global batch [rows, ...] (or [K, rows, ...]), of which every process holds the
  same copy, on the mesh: each device takes its own block, whichever process it belongs to
  (the mesh may split rows over fewer devices than processes, e.g. a `model` axis spanning
  hosts)."""
  return jax.tree.map(
      lambda x: jax.make_array_from_callback(x.shape, sharding, lambda index: x[index]), batch)


def process_row_indices(batch_sharding: NamedSharding, rows: int) -> np.ndarray:
  """The rows of a [rows, ...] batch split along `data` that this process's devices hold, in
  order: what this host builds of a global batch (the rest is other hosts' work)."""
  spans = sorted({(index[0].start or 0, rows if index[0].stop is None else index[0].stop)
                  for index in batch_sharding.addressable_devices_indices_map((rows,)).values()})
  return np.concatenate([np.arange(start, stop) for start, stop in spans])


def put_process_rows(batch: dict, sharding: NamedSharding, row_axis: int = 0) -> dict:
  """Places a batch of which this process holds only its own rows (`process_row_indices`, in
  order; stacked [K, rows, ...] batches: row_axis 1) on the mesh, every process its part
  (jax.make_array_from_process_local_data). The global row count follows from the mesh: this
  process holds `held` of the `data` axis's blocks."""
  mesh = sharding.mesh
  blocks = data_parallel_size(mesh)
  held = len(process_row_indices(batch_sharding(mesh), blocks))

  def put(x):
    global_shape = list(x.shape)
    global_shape[row_axis] = x.shape[row_axis] * blocks // held
    return jax.make_array_from_process_local_data(sharding, x, tuple(global_shape))
  return jax.tree.map(put, batch)


def host_copy(tree):
  """Numpy copies of a tree of arrays, also of those that no process holds whole (FSDP across
  hosts, a `model` axis spanning hosts): such arrays are first copied to every device by a
  jitted identity, then read from a local one."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  everywhere = jax.tree.map(lambda x: NamedSharding(x.sharding.mesh, P()), tree)
  return jax.device_get(jax.jit(lambda t: t, out_shardings=everywhere)(tree))


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
