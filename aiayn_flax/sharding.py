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

It lies in the model layer although it is planning too (planning/ reads it): the optimizer,
the train step and the translator place arrays with it, so in planning/ the two
layers would import each other.
"""

import flax.linen as nn
import jax
import numpy as np
import optax
from absl import logging
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

TENSOR_PARALLEL_RULES = (("heads", "model"), ("mlp", "model"), ("vocab", "model"),
                         ("kv", None), ("embed", None))
FSDP_RULES = (("heads", "model"), ("mlp", "model"), ("vocab", "model"), ("kv", None),
              ("embed", "data"))


def mesh_axis_sizes(spec: str) -> dict[str, int]:
  """"data:-1,model:2" -> {"data": -1, "model": 2}, as written (-1: the remaining devices)."""
  axes = {}
  for part in spec.split(","):
    name, _, size = part.partition(":")
    if not name or not size.lstrip("-").isdigit():
      raise ValueError(f"config.mesh={spec!r}: expected 'axis:size,...' such as 'data:-1'")
    axes[name.strip()] = int(size)
  return axes


def parse_mesh(spec: str, num_devices: int) -> dict[str, int]:
  """"data:4,model:2" -> {"data": 4, "model": 2}; one size may be -1 (the remaining devices)."""
  axes = mesh_axis_sizes(spec)
  if "data" not in axes:
    raise ValueError(f"config.mesh={spec!r}: needs a 'data' axis")
  known = int(np.prod([s for s in axes.values() if s != -1]))
  for name, size in axes.items():
    if size == -1:
      axes[name] = num_devices // known
  if int(np.prod(list(axes.values()))) != num_devices:
    raise ValueError(f"config.mesh={spec!r} does not cover the {num_devices} devices")
  return axes


def parse_dcn_mesh(spec: str, mesh_axes: dict[str, int], num_slices: int) -> dict[str, int]:
  """config.dcn_mesh ("data:2": the data axis spans 2 slices) -> how many slices each axis of
  the mesh spans, {axis: 1} where it stays within a slice. "" puts the data axis across every
  slice there is (data parallel between slices: the gradient all-reduce is the one collective
  that crosses their network), so that several GPU nodes, each its own slice, need no flag."""
  spans = dict.fromkeys(mesh_axes, 1)
  if not spec.strip() and num_slices > 1:
    if mesh_axes["data"] % num_slices:
      raise ValueError(f"the devices are on {num_slices} slices (TPU slices, or GPU hosts) and "
                       f"config.mesh's data axis ({mesh_axes['data']} devices) does not split "
                       f"into {num_slices}: set --config.dcn_mesh=AXIS:{num_slices}, AXIS a "
                       f"mesh axis ({', '.join(mesh_axes)}) whose size {num_slices} divides")
    return spans | {"data": num_slices}
  for part in filter(None, (p.strip() for p in spec.split(","))):
    name, _, size = part.partition(":")
    if name.strip() not in mesh_axes or not size.isdigit() or int(size) < 1:
      raise ValueError(f"config.dcn_mesh={spec!r}: expected 'axis:slices,...' over the axes of "
                       f"config.mesh ({', '.join(mesh_axes)}), such as 'data:2'")
    spans[name.strip()] = int(size)
  if int(np.prod(list(spans.values()))) != num_slices:
    raise ValueError(f"config.dcn_mesh={spec!r} spans {int(np.prod(list(spans.values())))} "
                     f"slice(s), but the devices are on {num_slices}")
  for name, slices in spans.items():
    if mesh_axes[name] % slices:
      raise ValueError(f"config.dcn_mesh={spec!r}: the mesh's {name} axis ({mesh_axes[name]} "
                       f"devices) does not split into {slices} slices")
  return spans


def make_mesh(spec: str, devices=None, dcn_spec: str = "") -> Mesh:
  """The mesh of config.mesh (`spec`) over `devices` (default: all): `device_grid`."""
  grid, axis_names = device_grid(spec, jax.devices() if devices is None else list(devices),
                                 dcn_spec)
  return Mesh(grid, axis_names)


def device_grid(spec: str, devices: list, dcn_spec: str = "") -> tuple[np.ndarray, tuple]:
  """(the devices as an array shaped like config.mesh (`spec`), its axis names), laid out
  along the hardware's links: on a TPU slice, mesh_utils.create_device_mesh maps each axis
  onto the torus's rings (splitting a physical axis where needed); on CPUs and GPUs it keeps
  the devices' order (on CPU exactly the plain reshape of jax.devices()). Devices of several
  slices (`slice_index`: TPU multislice; on GPUs, XLA gives every host its own) are joined by
  a slower network: config.dcn_mesh (`dcn_spec`, e.g. "data:2"; "" puts the data axis across
  them) says which axes cross it, and create_hybrid_device_mesh lays the rest within each
  slice (a TPU slice's ICI, a GPU node's NVLink)."""
  axes = parse_mesh(spec, len(devices))
  num_slices = len({getattr(d, "slice_index", 0) for d in devices})
  spans = parse_dcn_mesh(dcn_spec, axes, num_slices)
  if num_slices == 1:
    grid = mesh_utils.create_device_mesh(tuple(axes.values()), devices,
                                         allow_split_physical_axes=True)
  else:
    logging.info("mesh %s over %d slices: %s across them", spec, num_slices, ", ".join(
        f"{name} ({slices} slices)" for name, slices in spans.items() if slices > 1))
    grid = mesh_utils.create_hybrid_device_mesh(
        tuple(axes[name] // spans[name] for name in axes), tuple(spans.values()), devices,
        allow_split_physical_axes=True)
  return grid, tuple(axes)


def data_parallel_mesh(devices=None) -> Mesh:
  """Every device (default: of every process) on one `data` axis, across slices too: the mesh
  that decodes (translator.py), each device taking its share of a batch's rows."""
  return make_mesh("data:-1", devices)  # across every slice: dcn_mesh's default


def over_decoding_devices(per_device: int, mesh: Mesh | None = None) -> int:
  """A decoding batch's limit (sentences, padded source tokens) over the decoding mesh
  (default: every device of every process, `data_parallel_mesh`): `per_device` for each of
  its data devices. config.decode_batch_size and evaluate.py's and translate.py's --batch_size
  and --max_tokens count per device, as the Flax WMT example's eval_per_device_batch_size,
  MaxText's per_device_batch_size and fairseq's --max-tokens do: one config fills every chip
  of a pod slice, where a global count would leave most rows of each batch padding (64
  sentences on 64 chips: one each). On one device: the count as given."""
  return per_device * data_parallel_size(mesh if mesh is not None else data_parallel_mesh())


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


def placed(shapes, shardings):
  """ShapeDtypeStructs of `shapes` (jax.eval_shape's) laid out by `shardings`: what a program
  is compiled for, and what a checkpoint is restored into, without the arrays."""
  return jax.tree.map(lambda shape, sharding: jax.ShapeDtypeStruct(
      shape.shape, shape.dtype, sharding=sharding), shapes, shardings)


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
