"""Device mesh from the config, and where arrays live on it.

Batches are split along the mesh's `data` axis; parameters and optimizer state are replicated.
"""
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


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


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape["data"]
