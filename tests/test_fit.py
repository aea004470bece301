"""Fit by itself (aiayn_flax/planning/fit.py): at start the trainer, and `train.py --dry_run`,
compile the training step for the devices and, where the whole batch does not fit their
memory, choose the smallest gradient accumulation that does, keeping the config's tokens per
step; one line says what was tried and chosen. The dry run's time estimate names its MFU."""
import os
import re

import numpy as np
import pytest

from aiayn_flax import config_checks, devices, train_step
from aiayn_flax.data import bucketing
from aiayn_flax.planning import dry_run, fit, run_plan
from conftest import TOY_ONE_LAYER, run_script
from configs import base, big, toy

EIGHT_CPU_DEVICES = {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "")
                     + " --xla_force_host_platform_device_count=8"}
CHOSEN = re.compile(r"\(micro_batch_tokens_per_device=(\d+)\)")
SIZE = re.compile(r"the whole batch: ([\d.]+) (MiB|GiB)")
LOSS = re.compile(r"step (\d+)/\d+: loss ([0-9.]+)")
DIGEST = re.compile(r"^params_digest: ([0-9a-f]{64})$", re.M)


@pytest.mark.parametrize("shards", [1, 8])
@pytest.mark.parametrize("accumulation", [1, 2, 3, 7, 32])
def test_the_micro_batch_written_gives_the_accumulation_chosen(accumulation, shards):
  """fit's micro_batch_tokens_per_device gives the accumulation chosen, each micro-batch the
  trainer builds (run_plan.micro_batch_config) fits the slots written, and an optimizer step's
  micro-batches hold the config's real tokens: counted as the batcher sizes them
  (bucketing.rows_per_bucket) over a corpus of one length, against tokens_per_batch, within
  the rounding of each batch's rows to a multiple of the shards."""
  config = base.get_config()
  config.micro_batch_tokens_per_device = fit.micro_batch_tokens(config, accumulation, shards)
  assert train_step.accumulation_steps(config, shards) == accumulation
  micro = run_plan.micro_batch_config(config, accumulation)
  if accumulation > 1:
    assert (bucketing.padded_budget(micro.tokens_per_batch)
            <= config.micro_batch_tokens_per_device * shards)
  length = 24  # every example: 24 tokens a side (the bucket of 24)
  lengths = np.full(1000, length)
  # (the buckets up to it: 32 micro-batches on 8 shards hold no row of the longest ones)
  boundaries = [b for b in bucketing.boundaries_for(config.dataset) if b <= length]
  rows = bucketing.rows_per_bucket(lengths, lengths, boundaries, micro.tokens_per_batch, shards)
  step_tokens = accumulation * rows[-1] * length
  assert abs(step_tokens - config.tokens_per_batch) <= accumulation * (shards * length / 2 + 1)
  if accumulation == shards == 1:
    assert step_tokens == 25008  # 1042 rows of 24: the rows nearest 25,000 tokens


def test_the_most_micro_batches_still_hold_a_row_of_the_longest_bucket_per_shard():
  config = toy.get_config()  # 420 tokens, 525 padded slots; longest bucket 12
  longest = bucketing.boundaries_for(config.dataset)[-1]
  k = fit.max_accumulation(config, 8, longest)
  assert bucketing.padded_budget(config.tokens_per_batch // k) // longest >= 8
  assert bucketing.padded_budget(config.tokens_per_batch // (k + 1)) // longest < 8


def test_the_plan_printed_beside_a_fit_has_the_accumulation_compiled_and_chosen():
  # An L4's case: the estimate asks for micro-batches, the compiled whole batch fits.
  config = base.get_config()
  config.device, config.num_devices = "l4", 1
  assert dry_run.plan(config)["accumulation_steps"] > 1
  whole = fit.Trial(1, 0, {}, 14 * 2**30)
  fitted = fit.Fit(config, 1, True, "...", whole, data_shards=1)
  lines = dict(line.split(": ", 1) for line in
               dry_run.plan_text(fitted.plan_config(), compiled_fit=True).splitlines())
  assert lines["accumulation_steps"] == "1" and "accumulation_chosen_by" not in lines
  assert lines["fits_in_memory"].startswith("yes, compiled")
  assert int(lines["padded_tokens_per_optimizer_step"]) == 31250


def test_a_budget_and_an_mfu_are_checked():
  config = toy.get_config()
  config.device_memory_bytes = -1
  with pytest.raises(ValueError, match=r"config.device_memory_bytes=-1: must be 0"):
    config_checks.check_config(config)
  config = toy.get_config()
  config.mfu = 1.5
  with pytest.raises(ValueError, match=r"config.mfu=1.5: must be in \[0, 1\]"):
    config_checks.check_config(config)


def test_the_time_estimate_uses_the_measured_mfu_where_there_is_one_and_says_which():
  config = base.get_config()
  config.device, config.num_devices = "h200", 1
  plan = dry_run.plan(config)
  assert plan["flops_batch_shape"] == "976x32"  # the batch the H200 was measured on
  assert plan["mfu"] == pytest.approx(0.21, abs=0.005)
  assert plan["mfu_source"].startswith("measured")
  assert plan["step_time_s"] == pytest.approx(0.0585)
  config.device = "h100"  # nothing measured there
  plan = dry_run.plan(config)
  assert plan["mfu"] == 0.4 and plan["mfu_source"].startswith("assumed")
  config.mfu = 0.3
  plan = dry_run.plan(config)
  assert plan["mfu"] == 0.3 and plan["mfu_source"].startswith("given")
  config = big.get_config()
  config.device, config.num_devices = "h200", 1
  assert dry_run.plan(config)["mfu_source"].startswith("assumed")  # measured for base only


def test_the_common_gpus_are_targets():
  from aiayn_flax.planning import accelerator_targets
  for name in ("gpu-l4x1", "gpu-a10gx1", "gpu-t4x1", "gpu-a100x1", "gpu-a100_80gbx1",
               "gpu-h100x1", "gpu-h200x1", "tpu-v5e-1", "tpu-v4-8"):
    target = accelerator_targets.target(name)
    assert devices.kind(target.kind).memory_bytes > 0


def toy_run(workdir, *flags, cache=None):
  """train.py on the toy task for 2 steps, on 8 simulated CPU devices, with a batch whose
  activations outweigh the state (so that accumulating needs less memory) and one bucket (one
  training shape); `cache`: a fresh persistent compilation cache, whose hits it logs."""
  env = dict(EIGHT_CPU_DEVICES)
  if cache:
    env |= {"JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_DEBUG_LOG_MODULES": "jax._src.compiler,jax._src.compilation_cache"}
  return run_script("train.py", "--config=configs/toy.py", f"--workdir={workdir}", TOY_ONE_LAYER,
                    "--config.tokens_per_batch=4096", "--config.dataset.bucket_min_length=12",
                    "--config.num_train_steps=2", "--config.checkpoint_every_steps=2",
                    "--config.dataset.toy_eval_examples=16", "--config.eval_every_steps=0",
                    "--config.log_every_steps=1", *flags, env=env)


def fit_line(result) -> str:
  (line,) = [line for line in result.stderr.splitlines() if "fit: on 8 x " in line]
  return line


def cache_hits(result) -> set[str]:
  return set(re.findall(r"Persistent compilation cache hit for '([^']+)'", result.stderr))


@pytest.mark.slow  # three train.py processes on 8 simulated devices
@pytest.mark.timeout(1800)  # 14 minutes on the 2-core CPU beside other work
def test_the_trainer_accumulates_to_fit_a_budget_and_trains_as_with_the_flag_by_hand(tmp_path):
  # A budget that holds the whole batch: one compile, the step the run then loads.
  whole = toy_run(tmp_path / "whole", "--config.device_memory_bytes=1000000000000",
                  cache=tmp_path / "cache_whole")
  assert whole.returncode == 0, whole.stderr[-3000:]
  line = fit_line(whole)
  assert "chose the whole batch" in line and line.count("(fits)") == 1, line
  assert "jit_train_step" in cache_hits(whole)  # compiled once, for the fit and the run
  # A budget below the whole batch's memory on these devices.
  size, unit = SIZE.search(line).groups()
  budget = int(0.95 * float(size) * (2**20 if unit == "MiB" else 2**30))
  chosen = toy_run(tmp_path / "chosen", f"--config.device_memory_bytes={budget}",
                   cache=tmp_path / "cache_chosen")
  assert chosen.returncode == 0, chosen.stderr[-3000:]
  line = fit_line(chosen)
  micro = int(CHOSEN.search(line).group(1))
  config = toy.get_config()
  config.tokens_per_batch, config.micro_batch_tokens_per_device = 4096, micro
  accumulation = train_step.accumulation_steps(config, 8)
  assert accumulation >= 2 and f"chose {accumulation} micro-batches" in line, line
  assert "tried the whole batch: " in line and "MiB (no)" in line  # first, and it did not fit
  assert "jit_apply_gradient_sums" in cache_hits(chosen)  # the fit's compile, loaded
  # The flag by hand, in the chosen run's cache: the very programs the fit compiled, loaded.
  by_hand = toy_run(tmp_path / "by_hand", f"--config.micro_batch_tokens_per_device={micro}",
                    cache=tmp_path / "cache_chosen")
  assert by_hand.returncode == 0, by_hand.stderr[-3000:]
  assert f"--config.micro_batch_tokens_per_device={micro} given, which wins" in by_hand.stderr
  assert {"jit_accumulate_step", "jit_apply_gradient_sums"} <= cache_hits(by_hand)
  assert LOSS.findall(chosen.stderr) == LOSS.findall(by_hand.stderr) != []
  assert DIGEST.search(chosen.stdout).group(1) == DIGEST.search(by_hand.stdout).group(1)


@pytest.mark.slow  # compiles base's width for a GPU several times: a minute or two each
# Base's width and batch at fewer layers (the fit's rule does not depend on depth; base's six
# layers take 4 minutes a target on 2 cores: docs/SCALE.md has their figures), and its longest
# bucket alone (the one whose batch needs the most memory on a GPU: the same GiB as with every
# bucket, one compile of each program instead of two). On the T4 (float32) two layers' whole
# batch needs 13.5 GiB of 11.25, so it accumulates; on the L4 one layer's whole batch fits.
# No validation BLEU and greedy decoding in evaluate.py: the fit does not weigh the decoding
# programs, whose compiles took most of the time (T4 60 -> 38 s, L4 56 -> 41 s, beside another
# worker); test_dry_run.py compiles every program.
@pytest.mark.parametrize("target,layers,accumulation", [("gpu-t4x1", 2, 2), ("gpu-l4x1", 1, 1)])
def test_the_dry_run_for_a_small_gpu_fits_with_the_accumulation_the_trainer_will_choose(
    target, layers, accumulation):
  result = run_script("train.py", "--config=configs/base.py", "--dry_run", f"--target={target}",
                      f"--config.model.num_layers={layers}",
                      "--config.dataset.bucket_min_length=256",
                      "--config.eval_decode_sentences=0", "--config.beam_size=1")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
  assert lines["fits"] == "yes"
  fit_line = lines["fit"]
  assert "chose " in fit_line and "tried the whole batch" in fit_line
  assert "accumulate_with" not in lines and "accumulation_chosen_by" not in lines
  assert int(lines["accumulation_steps"]) == accumulation
  if accumulation > 1:
    assert f"chose {accumulation} micro-batches" in fit_line
    assert int(lines["padded_tokens_per_optimizer_step"]) >= 31250
  else:
    assert "chose the whole batch" in fit_line


def test_the_plan_decides_the_micro_batches_once_and_refuses_several_steps_a_call_of_them():
  """The trainer's plan (run_plan.for_training), on the CPU without a budget: the
  micro-batches that a given micro_batch_tokens_per_device asks for, each micro-batch's config
  with its share of the step's tokens, the dry run's text ending in the fit's line and the
  same as the dry run's own plan's (run_plan.for_local_devices); several steps a call of a
  step that accumulates refused in one line."""
  import jax
  config = toy.get_config()
  shards = jax.device_count()
  config.micro_batch_tokens_per_device = -(-525 // (3 * shards))  # 525 padded slots: 3 micro
  plan = run_plan.for_training(config)
  assert (plan.accumulation, plan.data_shards) == (3, shards)
  assert plan.micro_config.tokens_per_batch == 420 // 3
  assert plan.text().endswith(f"\nfit: {plan.fit.line}") and "given, which wins" in plan.fit.line
  dry = run_plan.for_local_devices(config)
  assert (dry.accumulation, dry.data_shards, dry.text()) == (3, shards, plan.text())
  assert dict(dry.mesh.shape) == dict(plan.mesh.shape)
  config.steps_per_call = 2
  with pytest.raises(ValueError, match=r"^config.steps_per_call=2: must be >= 1, and 1 when a "
                     r"step accumulates micro-batches \(3 here"):
    run_plan.for_training(config)
