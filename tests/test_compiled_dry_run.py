"""The compiled dry run: the run's programs compiled for a TPU and a GPU that are not here
(libtpu and jax-cuda12-plugin from the `aot` extra), with XLA's memory figures and the
collectives the mesh implies; a run that cannot fit stops with one line; "auto" precision.

The GPU topologies need jax on its CPU backend from the start (with the CUDA plugin installed
and no GPU, a default backend start fails the plugin and drops its topology): conftest.py sets
JAX_PLATFORMS=cpu before any test imports jax."""
import os
import subprocess
import sys

import jax
import pytest

from aiayn_flax import accelerator_targets, compiled_plan, devices, flops, train_step
from configs import base

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_base_config(mesh: str = "data:-1"):
  """The base model's width at 2 of its 6 layers, a small token budget and short buckets:
  minutes become seconds (the collectives and the memory rules do not depend on depth)."""
  config = base.get_config()
  config.tokens_per_batch, config.dataset.max_length, config.mesh = 2048, 32, mesh
  config.model.num_layers = 2
  return config


def state_bytes_per_device(config, model_shards: int) -> int:
  """f32 parameters and Adam's two f32 moments, split over the model axis (exactly: every
  split axis of the base model divides by 2)."""
  return 3 * 4 * flops.parameter_count(config.model) // model_shards


@pytest.mark.parametrize("target,mesh,expected", [
    # data-parallel: the gradient sum is an all-reduce over the 8 devices
    ("tpu-v5e-8", "data:8", {("all-reduce", 8)}),
    # tensor-parallel: sums over the 2 devices of `model` (row-parallel matmuls) and the
    # gradient sum over the 4 of `data`
    ("gpu-a100x8", "data:4,model:2", {("all-reduce", 4), ("all-reduce", 2)}),
])
def test_train_step_compiles_for_the_target_with_its_collectives(target, mesh, expected):
  config = small_base_config(mesh)
  result = compiled_plan.compile_run(config, target, include=("train",))
  (train,) = result["programs"]
  model_shards = 2 if "model" in mesh else 1
  assert train.name == "train_step" and result["fits"]
  # Arguments hold the whole sharded state (plus a batch and a key); outputs alias it.
  state = state_bytes_per_device(config, model_shards)
  assert state <= train.argument_bytes < state * 1.05
  assert train.alias_bytes >= state
  assert 0 < train.temporary_bytes < devices.kind(accelerator_targets.target(target).kind
                                                  ).memory_bytes
  assert expected <= set(train.collectives)
  assert result["target_compute_dtype"] == "bfloat16"
  assert result["compiled_flops_per_optimizer_step"] > 0


def test_accumulation_compiles_the_accumulate_and_apply_programs():
  config = small_base_config("data:8")
  # 2048 real tokens, 2560 padded slots = 8 devices x 160 x 2 micro-batches
  config.micro_batch_tokens_per_device = 160
  result = compiled_plan.compile_run(config, "gpu-h100x8", include=("train",))
  names = [p.name for p in result["programs"]]
  assert names == ["accumulate_step", "apply_gradient_sums"] and result["accumulation_steps"] == 2
  accumulate, apply = result["programs"]
  assert result["compiled_flops_per_optimizer_step"] == 2 * accumulate.flops + apply.flops


def _train_py(*args):
  return subprocess.run([sys.executable, "train.py", "--config=configs/base.py", "--dry_run",
                         *args], cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("target", ["gpu-t4x1", "tpu-v5e-1"])
def test_a_run_that_cannot_fit_fails_with_one_line(target):
  # A 4M-token vocabulary: 2 GB of f32 embedding, 8 GB with Adam and gradients... on one layer
  # it compiles fast. On the T4 XLA compiles it and our check refuses; on the TPU the compiler
  # itself reports RESOURCE_EXHAUSTED.
  result = _train_py(f"--target={target}", "--config.model.num_layers=1",
                     "--config.model.vocab_size=4000000", "--config.tokens_per_batch=512",
                     "--config.dataset.max_length=16", "--config.decode_batch_size=1")
  assert result.returncode != 0
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("train.py: error: does not fit: ")
  assert "micro_batch_tokens_per_device" in last and "mesh" in last and "fsdp" in last
  assert "Traceback" not in result.stderr


def test_an_unknown_target_lists_the_known_ones():
  result = _train_py("--target=tpu-v9-8")
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      "train.py: error: --target=tpu-v9-8: unknown; known targets: "
      + ", ".join(accelerator_targets.TARGETS))


@pytest.mark.parametrize("kind,dtype", [("tpu_v4", "bfloat16"), ("tpu_v5e", "bfloat16"),
                                        ("h100", "bfloat16"), ("a100", "bfloat16"),
                                        ("l4", "bfloat16"), ("v100", "float32"),
                                        ("t4", "float32"), ("p100", "float32"),
                                        ("cpu", "float32")])
def test_auto_precision_is_bfloat16_only_where_the_device_has_bf16_units(kind, dtype):
  assert devices.compute_dtype("auto", devices.kind(kind)) == dtype
  assert devices.compute_dtype("float32", devices.kind(kind)) == "float32"
  assert devices.compute_dtype("bfloat16", devices.kind(kind)) == "bfloat16"


def test_make_model_resolves_auto_for_the_device_it_builds_for():
  config = base.get_config()
  assert config.model.dtype == "auto"
  assert train_step.make_model(config).config.dtype == "float32"  # this machine's CPU
  (tpu,) = accelerator_targets.topology_devices(accelerator_targets.target("tpu-v5e-1"))
  assert train_step.make_model(config, tpu).config.dtype == "bfloat16"
  (t4,) = accelerator_targets.topology_devices(accelerator_targets.target("gpu-t4x1"))
  assert train_step.make_model(config, t4).config.dtype == "float32"
  (l4,) = accelerator_targets.topology_devices(accelerator_targets.target("gpu-l4x1"))
  assert train_step.make_model(config, l4).config.dtype == "bfloat16"
  config.model.dtype = "float32"
  assert train_step.make_model(config, tpu).config.dtype == "float32"
  assert jax.devices()[0].platform == "cpu"  # the targets claimed no device here
