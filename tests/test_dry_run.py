"""`train.py --dry_run`: the analytic plan, and with `--target` every program a run calls
compiled for a TPU or GPU that is not here (libtpu and jax-cuda12-plugin from the `aot`
extra), with XLA's memory figures and the collectives the mesh implies; a run that cannot fit
stops with one line; "auto" precision.

The GPU topologies need jax on its CPU backend from the start (with the CUDA plugin installed
and no GPU, a default backend start fails the plugin and drops its topology): conftest.py sets
JAX_PLATFORMS=cpu before any test imports jax.

Paper-size compiles take minutes on 2 cores: these tests compile small configs (the rules
they check do not depend on depth or width); the full ones are in docs/SCALE.md."""
import dataclasses
import os
import subprocess
import sys

import jax
import pytest

from aiayn_flax.planning import accelerator_targets, compiled_plan, flops
from aiayn_flax import devices, train_step
from aiayn_flax.data import bucketing
from configs import base, toy
from conftest import TOY_ONE_LAYER

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_py(*args, prelude: str = "pass", env: dict | None = None):
  """train.py's output; `prelude` runs first in the same interpreter (to hide a module);
  `env` adds to this process's environment."""
  code = f"{prelude}; import runpy, sys; sys.argv = ['train.py', *sys.argv[1:]]; " \
         "runpy.run_path('train.py', run_name='__main__')"
  return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                        text=True, timeout=600, env={**os.environ, **(env or {})})


def program_lines(stdout: str) -> dict[str, str]:
  """{"train_steps": "4x64x8 memory ...", ...}: the compiled_NAME: lines of one program each."""
  return {key[len("compiled_"):]: value for key, value in
          (line.split(": ", 1) for line in stdout.splitlines() if ": " in line)
          if key.startswith("compiled_") and " memory " in value}


def small_base_config(mesh: str = "data:-1"):
  """The base model's width at 1 of its 6 layers, a small token budget and one short bucket:
  minutes become seconds (the collectives and the memory rules do not depend on depth; with
  several buckets the dry run would compile two to choose the one that needs more memory)."""
  config = base.get_config()
  config.tokens_per_batch, config.mesh = 2048, mesh
  config.dataset.update(max_length=32, bucket_min_length=32)
  config.model.num_layers = 1
  return config


def state_bytes_per_device(config, model_shards: int) -> int:
  """f32 parameters and Adam's two f32 moments, split over the model axis (exactly: every
  split axis of the base model divides by 2)."""
  return 3 * 4 * flops.parameter_count(config.model) // model_shards


def hand_counted_train_flops(config, rows: int, length: int) -> float:
  """Matmul FLOPs of one training step, counted by hand from the paper's shapes: forward 2
  FLOPs per multiply-add, backward twice the forward. Per layer and token: Q, K, V, output
  projections (4 d^2; the decoder's cross-attention 4 more), the FFN (2 d f); per layer and
  query: the scores and the weighted sum over `length` keys (2 x d x length, self and cross
  attention in the decoder); the output projection onto the vocabulary."""
  m = config.model
  d, f, n, vocab = m.d_model, m.d_ff, m.num_layers, m.vocab_size
  tokens = rows * length
  encoder = n * tokens * (4 * d * d + 2 * d * f + 2 * d * length)
  decoder = n * tokens * (8 * d * d + 2 * d * f + 4 * d * length)
  logits = tokens * d * vocab
  return 3 * 2 * (encoder + decoder + logits)


@pytest.mark.slow  # compiles, or starts train.py
def test_dry_run_prints_the_plan_without_training():
  result = train_py("--config=configs/base.py", "--dry_run")
  assert result.returncode == 0, result.stderr[-2000:]
  lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
  for key in ("parameters", "padded_tokens_per_optimizer_step", "devices", "mesh", "flops_per_step",
              "bucket_boundaries"):
    assert key in lines, result.stdout
  assert lines["tokens_per_batch"] == "25000" and lines["padded_tokens_per_batch"] == "31250"
  # the budget, rounded up to whole tokens per device and micro-batch
  micro_batches = int(lines["devices"].split(" x ")[0]) * int(lines["accumulation_steps"])
  assert 0 <= int(lines["padded_tokens_per_optimizer_step"]) - 31250 < micro_batches
  assert int(lines["parameters"]) == 63082496
  assert not program_lines(result.stdout)  # nothing compiled without --target


@pytest.mark.parametrize("target,mesh,expected", [
    # data-parallel: the gradient sum is an all-reduce over the 8 devices
    ("tpu-v5e-8", "data:8", {("all-reduce", 8)}),
    # tensor-parallel: sums over the 2 devices of `model` (row-parallel matmuls) and the
    # gradient sum over the 4 of `data`
    ("gpu-a100x8", "data:4,model:2", {("all-reduce", 4), ("all-reduce", 2)}),
])
@pytest.mark.slow  # compiles, or starts train.py
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
  # XLA's count (the TPU compiler's, or the CPU lowering's for a GPU) against the hand count
  # of the matmuls: the rest (softmax, LayerNorm, Adam) adds a few percent.
  rows, length = map(int, train.shape.split("x"))
  hand = hand_counted_train_flops(config, rows, length)
  assert hand < result["compiled_flops_per_optimizer_step"] < 1.06 * hand


@pytest.mark.slow  # compiles
def test_the_tests_least_compiler_effort_changes_nothing_they_read_but_the_temporaries():
  """conftest.py has libtpu compile with its least effort on run time (half a dry run's CPU).
  The toy's step and evaluation's decoding for a v5e-8, at that effort and at the default a
  user's dry run compiles with: the same programs, shapes, arguments, outputs, aliases, FLOPs
  and collectives; only the temporaries differ, larger at the least effort."""
  config = toy.get_config()
  config.model.num_layers, config.mesh, config.tokens_per_batch = 1, "data:8", 2000
  config.decode_batch_size = 4
  plans, saved = {}, jax.config.jax_exec_time_optimization_effort
  for effort in (0.0, -1.0):
    jax.config.update("jax_exec_time_optimization_effort", effort)
    try:
      plans[effort] = compiled_plan.compile_run(config, "tpu-v5e-8",
                                                include=("train", "evaluate"))["programs"]
    finally:
      jax.config.update("jax_exec_time_optimization_effort", saved)
  read = lambda p: dataclasses.replace(p, temporary_bytes=0)  # noqa: E731
  assert [read(p) for p in plans[-1.0]] == [read(p) for p in plans[0.0]]
  assert [p.name for p in plans[0.0]] == ["train_step", "evaluate_greedy_decode"]
  assert ("all-reduce", 8) in plans[0.0][0].collectives
  assert all(low.temporary_bytes > default.temporary_bytes  # the setting took effect
             for low, default in zip(plans[-1.0], plans[0.0]))


@pytest.mark.slow  # compiles, or starts train.py
def test_accumulation_compiles_the_accumulate_and_apply_programs():
  config = small_base_config("data:8")
  # 2048 real tokens, 2560 padded slots = 8 devices x 160 x 2 micro-batches
  config.micro_batch_tokens_per_device = 160
  result = compiled_plan.compile_run(config, "gpu-h100x8", include=("train",))
  assert [p.name for p in result["programs"]] == ["accumulate_step", "apply_gradient_sums"]
  assert result["accumulation_steps"] == 2
  accumulate, _ = result["programs"]
  rows, length = map(int, accumulate.shape.split("x"))
  assert (rows, length) == (40, 32)  # half of the 80x32 batch a step without accumulation takes
  # Two micro-batches of 40 rows make up the FLOPs of one 80-row step (hand count).
  hand = hand_counted_train_flops(config, 2 * rows, length)
  assert hand < result["compiled_flops_per_optimizer_step"] < 1.06 * hand


@pytest.mark.slow  # compiles, or starts train.py
def test_every_program_a_run_calls_is_compiled_with_its_shape():
  # The toy run with 4 steps per call, beam search in evaluate.py, BLEU decoding in training;
  # one layer a side (which programs, and their shapes, do not depend on depth).
  result = train_py("--config=configs/toy.py", "--dry_run", "--target=tpu-v5e-1",
                    TOY_ONE_LAYER, "--config.steps_per_call=4", "--config.beam_size=4",
                    "--config.decode_batch_size=32")
  assert result.returncode == 0, result.stderr[-3000:]
  programs = program_lines(result.stdout)
  assert list(programs) == ["train_steps", "eval_step", "greedy_decode",
                            "evaluate_beam_search"], result.stdout
  config = toy.get_config()
  # The dry run compiles the estimate's bucket (the longest here) and the shortest, and keeps
  # the one that needs more memory (test_the_bucket_compiled_is_the_one_that_needs_the_most_memory).
  boundaries = bucketing.boundaries_for(config.dataset)
  length = int(programs["train_steps"].split()[0].split("x")[2])
  assert length in (min(boundaries), max(boundaries)), programs["train_steps"]
  rows = bucketing.batch_size_for(length, bucketing.padded_budget(config.tokens_per_batch), 1)
  assert programs["train_steps"].startswith(f"4x{rows}x{length} memory ")
  assert programs["eval_step"].startswith(f"{rows}x{length} memory ")
  # Decoding: 32 sources padded to 16 tokens (the toy's 12, to a multiple of 16).
  assert programs["greedy_decode"].startswith("32x16 memory ")
  assert programs["evaluate_beam_search"].startswith("32x16 memory ")
  memories = {name: int(line.split()[2]) for name, line in programs.items()}
  lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
  assert int(lines["compiled_memory_per_device"]) == max(memories.values())
  assert lines["compiled_memory_program"] == max(memories, key=memories.get)
  # Beam 4 keeps 4 hypotheses per source where greedy keeps one.
  assert memories["evaluate_beam_search"] > memories["greedy_decode"]
  assert lines["fits"] == "yes" and lines["target_hosts"] == "1"


@pytest.mark.slow  # compiles, or starts train.py
def test_the_bucket_compiled_is_the_one_that_needs_the_most_memory(monkeypatch):
  """Every bucket's train step compiled once: the dry run's choice is the largest, and the
  dry run compiles each bucket it weighs once."""
  # One device holds the whole budget of 5120 slots in every bucket; 8 heads over a small
  # vocabulary: attention, which grows with the length, outweighs the logits. d_model 64 keeps
  # the shortest bucket the largest (118 MB against 9 MB) in 35 s of compiler CPU, not 50 s.
  config = toy.get_config()
  config.model.update(vocab_size=100, d_model=64, d_ff=256, num_heads=8, num_layers=1)
  config.dataset.update(max_length=128, bucket_min_length=8, bucket_growth=4.0)
  config.tokens_per_batch, config.mesh = 4096, "data:1"
  assert bucketing.boundaries_for(config.dataset) == [8, 32, 128]
  compiled = []
  compile_ = compiled_plan._compile

  def recording_compile(name, shape, *args):
    compiled.append(compile_(name, shape, *args))
    return compiled[-1]
  monkeypatch.setattr(compiled_plan, "_compile", recording_compile)
  chosen = compiled_plan.compile_run(config, "tpu-v5e-1", include=("train",))["largest"]
  # On TPU the shortest bucket needs the most here (its attention tensors pad to 128 lanes),
  # which the per-token estimate (the longest bucket) misses: the dry run compiles that one
  # too, once each, and keeps the larger.
  assert [program.shape.split("x")[1] for program in compiled] == ["128", "8"], compiled
  memory = {int(program.shape.split("x")[1]): program.memory_bytes for program in compiled}
  memory[32] = compiled_plan.compile_run(config, "tpu-v5e-1", include=("train",),
                                         length=32)["largest"].memory_bytes
  assert chosen.memory_bytes == max(memory.values()) == memory[8], (chosen.shape, memory)


@pytest.mark.slow  # compiles, or starts train.py
@pytest.mark.parametrize("target,hosts,devices_", [("tpu-v4-32", 4, 16), ("tpu-v5e-32", 4, 32)])
def test_multi_host_tpu_slices_compile(target, hosts, devices_):
  config = toy.get_config()
  config.model.num_layers = 1  # TOY_ONE_LAYER: the collectives do not depend on depth
  config.tokens_per_batch = 2000  # enough rows for 32 data shards
  config.decode_batch_size = -(-200 // devices_)  # per device: 200 sources or a few more
  result = compiled_plan.compile_run(config, target)
  assert result["target_hosts"] == hosts == accelerator_targets.target(target).hosts
  assert result["target_devices"].startswith(f"{devices_} x TPU v")
  names = [p.name for p in result["programs"]]
  assert names == ["train_step", "eval_step", "greedy_decode", "evaluate_greedy_decode"]
  train = result["programs"][0]
  assert ("all-reduce", devices_) in train.collectives  # the gradient sum crosses every host
  # Decoding spans every device of every host: decode_batch_size sources on each (it counts
  # per device), the parameters whole on each (no all-gather); the one collective is the
  # loop's test that every row has finished.
  rows = config.decode_batch_size * devices_
  for decoding in result["programs"][2:]:
    assert decoding.shape == f"{rows}x16", decoding
    assert decoding.collectives == (("all-reduce", devices_),), decoding
  assert result["fits"]


@pytest.mark.slow  # compiles, or starts train.py
@pytest.mark.parametrize("target", ["gpu-t4x1", "tpu-v5e-1"])
def test_a_run_that_cannot_fit_fails_with_one_line(target):
  # A 4M-token vocabulary: 2 GB of f32 embedding, 8 GB with Adam and gradients... on one layer
  # it compiles fast. On the T4 XLA compiles it and our check refuses; on the TPU the compiler
  # itself reports RESOURCE_EXHAUSTED, at the effort a user's dry run compiles with (the
  # conftest lowers it for the other tests).
  result = train_py("--config=configs/base.py", "--dry_run", f"--target={target}",
                    "--config.model.num_layers=1", "--config.model.vocab_size=4000000",
                    "--config.tokens_per_batch=512", "--config.dataset.max_length=16",
                    "--config.dataset.bucket_min_length=16",  # one bucket: one train compile
                    "--config.decode_batch_size=1",
                    env={"JAX_EXEC_TIME_OPTIMIZATION_EFFORT": "0"})
  assert result.returncode != 0
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("train.py: error: does not fit: ")
  # the fit tried the whole batch and accumulation; the update alone does not fit
  assert "tried the whole batch" in last and "apply_gradient_sums" in last
  assert "mesh" in last and "fsdp" in last
  assert "Traceback" not in result.stderr


@pytest.mark.slow  # compiles, or starts train.py
def test_an_unknown_target_lists_the_known_ones():
  result = train_py("--config=configs/base.py", "--dry_run", "--target=tpu-v9-8")
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      "train.py: error: --target=tpu-v9-8: unknown; known targets: "
      + ", ".join(accelerator_targets.TARGETS))


@pytest.mark.parametrize("target,module", [("tpu-v4-8", "libtpu"),
                                           ("gpu-h100x1", "jax_cuda12_plugin")])
@pytest.mark.slow  # compiles, or starts train.py
def test_a_target_without_the_aot_packages_says_what_to_install(target, module):
  # sys.modules[name] = None makes `import name` fail as if it were not installed.
  result = train_py("--config=configs/toy.py", "--dry_run", f"--target={target}",
                    prelude=f"import sys; sys.modules[{module!r}] = None")
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f"train.py: error: --target={target}: compiling for {target[:3]} needs {module}, which "
      "is not installed: pip install -e '.[aot]' -c requirements.lock (libtpu, the CUDA plugin "
      "and ptxas)")


@pytest.mark.parametrize("kind,dtype", [("tpu_v4", "bfloat16"), ("tpu_v5e", "bfloat16"),
                                        ("h100", "bfloat16"), ("a100", "bfloat16"),
                                        ("l4", "bfloat16"), ("v100", "float32"),
                                        ("t4", "float32"), ("p100", "float32"),
                                        ("cpu", "float32")])
def test_auto_precision_is_bfloat16_only_where_the_device_has_bf16_units(kind, dtype):
  assert devices.compute_dtype("auto", devices.kind(kind)) == dtype
  assert devices.compute_dtype("float32", devices.kind(kind)) == "float32"
  assert devices.compute_dtype("bfloat16", devices.kind(kind)) == "bfloat16"


@pytest.mark.slow  # compiles, or starts train.py
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


@pytest.mark.slow  # compiles, or starts train.py
def test_a_mistyped_config_path_names_the_configs_there_are():
  result = train_py("--config=configs/multi30.py", "--dry_run")
  assert result.returncode == 1
  configs = sorted(f"configs/{name}" for name in os.listdir(os.path.join(REPO, "configs"))
                   if name.endswith(".py") and not name.startswith("_"))
  assert "configs/multi30k.py" in configs
  assert result.stderr.strip().splitlines() == [
      "train.py: error: --config=configs/multi30.py: no such file 'configs/multi30.py'; the "
      f"configs: {', '.join(configs)}"]


def test_the_decoding_copy_of_fsdp_parameters_is_counted_beside_the_training_state():
  """What the trainer holds around its validation decoding, per device, beside the programs:
  its state as sharded; the decoding's copy of the parameters that training splits (FSDP),
  whole on each device, not of those it keeps whole (read in place); while decoding, the state
  and the greedy decoding's program; and every later step, had the copy been kept."""
  from typing import NamedTuple
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  import numpy as np

  class State(NamedTuple):
    params: dict
    moments: dict

  chips = accelerator_targets.topology_devices(accelerator_targets.target("tpu-v4-32"))
  mesh = Mesh(np.array(chips), ("data",))
  split, whole = NamedSharding(mesh, P(None, "data")), NamedSharding(mesh, P())
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jax.numpy.float32)  # noqa: E731
  state = State({"kernel": f32(8, 64), "bias": f32(8)}, {"kernel": f32(8, 64)})
  shardings = State({"kernel": split, "bias": whole}, {"kernel": split})
  program = lambda name, memory: compiled_plan.CompiledProgram(  # noqa: E731
      name, "-", memory, 0, 0, 0, 0.0, ())
  figures = compiled_plan._training_decode_memory(
      state, shardings, [program("train_step", 10_000), program("eval_step", 50_000),
                         program("greedy_decode", 3_000)])
  # Per chip: 8 x 4 of each kernel (64 columns over 16 chips), the whole bias.
  assert figures["state_bytes_per_device"] == (2 * 8 * 4 + 8) * 4
  assert figures["decode_copy_bytes_per_device"] == 8 * 64 * 4  # the kernel, whole
  # The decoding's arguments hold the bias it reads in place, and the copy.
  assert figures["compiled_memory_while_decoding"] == 2 * 8 * 4 * 4 + 3_000
  assert figures["compiled_memory_training_with_decode_copy"] == 10_000 + 8 * 64 * 4
