"""The device mesh (sharding.make_mesh): config.dcn_mesh checked with one line naming it, and on
a deviceless multislice TPU topology (two v5e-16 slices, libtpu from the `aot` extra) the data
axis across the slices and along each slice's rings. (On CPU the mesh keeps jax.devices()'
order: sharded_decoding_check.py, with 8 devices.)"""
import numpy as np
import pytest

from aiayn_flax import accelerator_targets, compiled_plan, sharding
from configs import toy


@pytest.mark.parametrize("spec,slices,message", [
    ("data:2", 1, r"config.dcn_mesh='data:2' spans 2 slice\(s\), but the devices are on 1$"),
    ("", 2, r"config.dcn_mesh='' spans 1 slice\(s\), but the devices are on 2; set "
            r"--config.dcn_mesh=data:2 \(data parallel across slices\)"),
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
  with pytest.raises(ValueError, match=r"set --config.dcn_mesh=data:2"):
    sharding.make_mesh("data:-1", devices)


@pytest.mark.slow  # compiles for 32 TPU chips
def test_a_run_compiles_for_two_slices(two_v5e_16_slices):
  config = toy.get_config()
  config.tokens_per_batch, config.dcn_mesh = 2000, "data:2"  # rows for 32 data shards
  result = compiled_plan.compile_run(config, "tpu-v5e-16x2", include=("train", "evaluate"),
                                     length=8)
  assert result["target_hosts"] == 4 and result["target_mesh"] == "data:32"
  train, evaluate = result["programs"]
  # A slice's program: the gradient sum over its 16 chips, and across the slices through the
  # megascale runtime (the data-center network).
  assert {("all-reduce", 16), ("dcn-all-reduce", 0)} <= set(train.collectives), train
  # Decoding too spans both slices: 200 rows padded to 224 (7 per chip), and the loop's stop
  # test reduces over every row.
  assert evaluate.name == "evaluate_greedy_decode" and evaluate.shape == "224x16"
  assert ("dcn-all-reduce", 0) in evaluate.collectives, evaluate
  assert result["fits"]
