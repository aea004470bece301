"""The device mesh (sharding.make_mesh): config.dcn_mesh checked with one line naming it, and on
a deviceless multislice TPU topology (two v5e-16 slices, libtpu from the `aot` extra) the data
axis across the slices and along each slice's rings. (On CPU the mesh keeps jax.devices()'
order: sharded_decoding_check.py, with 8 devices.)"""
import dataclasses

import numpy as np
import pytest

from aiayn_flax.planning import accelerator_targets, compiled_plan
from aiayn_flax import sharding
from configs import toy


@pytest.mark.parametrize("spec,slices,message", [
    ("data:2", 1, r"config.dcn_mesh='data:2' spans 2 slice\(s\), but the devices are on 1$"),
    ("", 3, r"^the devices are on 3 slices \(TPU slices, or GPU hosts\) and config.mesh's data "
            r"axis \(8 devices\) does not split into 3: set --config.dcn_mesh=AXIS:3, AXIS a "
            r"mesh axis \(data, model\) whose size 3 divides$"),
    ("fsdp:2", 2, r"config.dcn_mesh='fsdp:2': expected 'axis:slices,...' over the axes of "
                  r"config.mesh \(data, model\), such as 'data:2'"),
    ("data:x", 2, r"config.dcn_mesh='data:x': expected"),
    ("model:2", 2, r"config.dcn_mesh='model:2': the mesh's model axis \(1 devices\) does not "
                   r"split into 2 slices"),
])
def test_a_bad_dcn_mesh_is_one_line_naming_the_key(spec, slices, message):
  with pytest.raises(ValueError, match=message):
    sharding.parse_dcn_mesh(spec, {"data": 8, "model": 1}, slices)


def test_a_dcn_mesh_says_how_many_slices_each_axis_spans():
  assert sharding.parse_dcn_mesh("", {"data": 8, "model": 2}, 1) == {"data": 1, "model": 1}
  assert sharding.parse_dcn_mesh("data:2", {"data": 8, "model": 2}, 2) == {"data": 2,
                                                                           "model": 1}
  # Unsaid, the data axis goes across the slices.
  assert sharding.parse_dcn_mesh("", {"data": 8, "model": 2}, 4) == {"data": 4, "model": 1}


@dataclasses.dataclass(frozen=True)
class GpuDevice:
  """A GPU as jax describes one of a multi-node run: XLA gives each host (each boot id) its own
  slice_index (xla/pjrt/distributed/topology_util.cc, BuildGlobalTopology)."""
  id: int
  process_index: int
  slice_index: int
  platform: str = "gpu"
  device_kind: str = "NVIDIA H100 80GB HBM3"


def gpu_nodes(nodes: int, gpus: int) -> list[GpuDevice]:
  return [GpuDevice(node * gpus + i, node, node) for node in range(nodes) for i in range(gpus)]


@pytest.mark.parametrize("spec, dcn_spec", [("data:-1", ""), ("data:-1", "data:2")])
def test_gpu_nodes_are_slices_and_the_data_axis_goes_across_them_unsaid(spec, dcn_spec):
  devices = gpu_nodes(2, 8)
  grid, axes = sharding.device_grid(spec, devices, dcn_spec)
  assert axes == ("data",) and grid.shape == (16,)
  assert [d.slice_index for d in grid] == [0] * 8 + [1] * 8
  assert sorted(d.id for d in grid) == list(range(16))


def test_on_gpu_nodes_a_model_axis_stays_within_a_node():
  grid, axes = sharding.device_grid("data:-1,model:8", gpu_nodes(4, 8))
  assert axes == ("data", "model") and grid.shape == (4, 8)
  assert [{d.slice_index for d in row} for row in grid] == [{0}, {1}, {2}, {3}]  # NVLink's share
  with pytest.raises(ValueError, match=r"the devices are on 4 slices .* data axis \(2 devices\) "
                                       r"does not split into 4: set --config.dcn_mesh=AXIS:4"):
    sharding.device_grid("data:2,model:-1", gpu_nodes(4, 8))
  grid, _ = sharding.device_grid("data:2,model:-1", gpu_nodes(4, 8), "data:2,model:2")
  assert grid.shape == (2, 16) and {d.slice_index for d in grid[0, :8]} == {0}


@pytest.fixture(scope="module")
def two_v5e_16_slices():
  target = accelerator_targets.target("tpu-v5e-16x2")
  devices = accelerator_targets.topology_devices(target)
  assert len(devices) == 32 and target.hosts == 4
  return devices


def test_the_data_axis_spans_the_slices_and_the_model_axis_stays_in_one(two_v5e_16_slices):
  devices = two_v5e_16_slices
  assert sorted({d.slice_index for d in devices}) == [0, 1]
  mesh = sharding.make_mesh("data:-1,model:2", devices, "data:2")
  assert mesh.shape == {"data": 16, "model": 2}
  slices = np.vectorize(lambda d: d.slice_index)(mesh.devices)  # [data 16, model 2]
  # The first 8 data shards on slice 0, the last 8 on slice 1: only the data axis's
  # collectives (the gradient all-reduce) cross the data-center network.
  assert (slices[:8] == 0).all() and (slices[8:] == 1).all()
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)
  # Within a slice, the data axis is a ring of the 4x4 chips: each shard's neighbour (the last's
  # being the first) one ICI hop away, where jax.devices()' order jumps two.
  for ring in sharding.data_parallel_mesh(devices).devices.reshape(2, 16):
    coords = [np.array(d.coords[:2]) for d in ring]
    assert all(np.abs(a - b).sum() == 1 for a, b in zip(coords, coords[1:] + coords[:1]))
  listed = [np.array(d.coords[:2]) for d in devices[:16]]
  assert max(np.abs(a - b).sum() for a, b in zip(listed, listed[1:])) > 1
  # The decoding mesh (every device on data) is split across the slices the same way.
  decoding = np.vectorize(lambda d: d.slice_index)(sharding.data_parallel_mesh(devices).devices)
  assert decoding.tolist() == [0] * 16 + [1] * 16
  unsaid = sharding.make_mesh("data:-1", devices)  # dcn_mesh's default: the same mesh
  said = sharding.make_mesh("data:-1", devices, "data:2")
  assert unsaid.devices.tolist() == said.devices.tolist()


@pytest.mark.slow  # compiles for 32 TPU chips
def test_a_run_compiles_for_two_slices(two_v5e_16_slices):
  config = toy.get_config()
  config.model.num_layers = 1  # conftest.TOY_ONE_LAYER: the collectives do not depend on depth
  config.tokens_per_batch, config.dcn_mesh = 2000, "data:2"  # rows for 32 data shards
  config.decode_batch_size = 7  # sources per chip: 224 on the 32
  result = compiled_plan.compile_run(config, "tpu-v5e-16x2", include=("train", "evaluate"),
                                     length=8)
  assert result["target_hosts"] == 4 and result["target_mesh"] == "data:32"
  train, evaluate = result["programs"]
  # A slice's program: the gradient sum over its 16 chips, and across the slices through the
  # megascale runtime (the data-center network).
  assert {("all-reduce", 16), ("dcn-all-reduce", 0)} <= set(train.collectives), train
  # Decoding too spans both slices: 7 rows on each of the 32 chips, and the loop's stop test
  # reduces over every row.
  assert evaluate.name == "evaluate_greedy_decode" and evaluate.shape == "224x16"
  assert ("dcn-all-reduce", 0) in evaluate.collectives, evaluate
  assert result["fits"]


@pytest.mark.slow  # compiles for 16 GPUs
def test_a_run_compiles_for_two_gpu_nodes():
  """XLA's deviceless GPU topology "1x2x8": 2 hosts (processes) of 8 H100s. (It gives every
  device slice_index 0, where a real cluster gives each host its own: the data-only mesh is
  the same device order either way, as device_grid over per-host slices shows above.)"""
  target = accelerator_targets.target("gpu-h100x8x2")
  devices = accelerator_targets.topology_devices(target)
  assert sorted({d.process_index for d in devices}) == [0, 1] and len(devices) == 16
  per_host_slices = [GpuDevice(d.id, d.process_index, d.process_index) for d in devices]
  assert ([d.id for d in sharding.make_mesh("data:-1", devices).devices.flat]
          == [d.id for d in sharding.device_grid("data:-1", per_host_slices)[0]])
  config = toy.get_config()
  config.model.num_layers = 1  # conftest.TOY_ONE_LAYER
  config.tokens_per_batch = 2000
  result = compiled_plan.compile_run(config, "gpu-h100x8x2", include=("train",), length=8)
  assert result["target_hosts"] == 2 and result["target_mesh"] == "data:16"
  [train] = result["programs"]
  assert ("all-reduce", 16) in train.collectives and result["fits"]
