"""Never lose a run: exact resume after SIGKILL or SIGTERM, atomic checkpoints, the non-finite
guard, and refusing to resume with a different config."""
import math
import os
import re
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from aiayn_flax.runtime import checkpoints, stops
from aiayn_flax.training import trainer
from conftest import REPO, TOY_ONE_LAYER
from configs import toy

TOY_FLAGS = ["--config=configs/toy.py", TOY_ONE_LAYER, "--config.num_train_steps=60",
             "--config.checkpoint_every_steps=20", "--config.log_every_steps=1",
             # No evaluation: these tests read parameters and logged losses.
             "--config.eval_every_steps=0", "--config.dataset.toy_eval_examples=20",
             # The paper's regularisation, so that resuming must reproduce dropout's masks
             # (a function of seed and step) and the smoothed loss.
             "--config.model.dropout_rate=0.1", "--config.label_smoothing=0.1",
             # Synchronous saves: a kill at step 30 then surely finds step 20 complete.
             "--config.checkpoint_asynchronously=false"]
LOSS_LINE = re.compile(r"step (\d+)/60: loss ([0-9.]+)")


def one_layer_toy():
  config = toy.get_config()
  config.model.num_layers = 1  # TOY_ONE_LAYER
  return config


def start_training(workdir, *extra, signal_at: str | None = None):
  """train.py on the toy task; `signal_at` ("SIGKILL:30"): the trainer sends itself that signal
  once it reaches that step (AIAYN_TEST_SIGNAL_AT_STEP), so that no test races the run."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop(stops.TEST_SIGNAL_VARIABLE, None)
  if signal_at:
    env[stops.TEST_SIGNAL_VARIABLE] = signal_at
  return subprocess.Popen([sys.executable, "train.py", f"--workdir={workdir}", *TOY_FLAGS, *extra],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env)


def finish(process, resumed_from: int | None = None) -> tuple[str, dict[int, str]]:
  """(params digest, {step: logged loss}) of a run that ends normally; with `resumed_from`, its
  log must say it resumed from that step's checkpoint."""
  output, _ = process.communicate(timeout=300)
  assert process.returncode == 0, output[-3000:]
  if resumed_from is not None:
    assert f"Resumed from step {resumed_from} of" in output, output[-3000:]
  digest = re.search(r"^params_digest: ([0-9a-f]{64})$", output, re.M).group(1)
  return digest, {int(s): loss for s, loss in LOSS_LINE.findall(output)}


def killed(process) -> str:
  output, _ = process.communicate(timeout=300)
  assert process.returncode == -signal.SIGKILL, output[-3000:]
  return output


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  return finish(start_training(tmp_path_factory.mktemp("uninterrupted")))


@pytest.mark.slow  # starts train.py
def test_same_config_and_seed_give_identical_parameters_with_or_without_prefetching(
    uninterrupted, tmp_path):
  assert toy.get_config().prefetch_batches > 0  # the uninterrupted run prefetched
  digest, losses = finish(start_training(tmp_path, "--config.prefetch_batches=0"))
  assert digest == uninterrupted[0] and losses == uninterrupted[1]


@pytest.mark.slow
def test_sigkill_between_checkpoints_then_restart_is_exact(uninterrupted, tmp_path):
  killed(start_training(tmp_path, signal_at="SIGKILL:30"))  # the last checkpoint is step 20
  digest, losses = finish(start_training(tmp_path), resumed_from=20)
  assert min(losses) == 21
  assert digest == uninterrupted[0]
  assert all(losses[s] == uninterrupted[1][s] for s in losses)  # identical losses after restart


@pytest.mark.slow
def test_sigterm_checkpoints_the_current_step_and_resumes_exactly(uninterrupted, tmp_path):
  process = start_training(tmp_path, signal_at="SIGTERM:27")
  output, _ = process.communicate(timeout=300)
  assert process.returncode == 128 + signal.SIGTERM, output[-3000:]  # 143, as train.py documents
  assert "SIGTERM: saved a checkpoint at step 27 in" in output
  assert checkpoints.last_steps(str(tmp_path), 10) == [20, 27]
  digest, losses = finish(start_training(tmp_path), resumed_from=27)
  assert min(losses) == 28
  assert digest == uninterrupted[0]


@pytest.mark.slow
def test_several_steps_per_call_resume_exactly_after_sigkill(tmp_path):
  # Runs of 3 steps of one batch shape per call (two shapes here: buckets of 8 and 12), never
  # across a log line (every 10 steps) or a checkpoint (every 20); killed after step 30,
  # resumed from step 20.
  flags = ["--config.steps_per_call=3", "--config.log_every_steps=10",
           "--config.dataset.bucket_min_length=8"]
  expected, losses = finish(start_training(tmp_path / "uninterrupted", *flags))
  assert sorted(losses) == [10, 20, 30, 40, 50, 60]
  killed(start_training(tmp_path / "killed", *flags, signal_at="SIGKILL:30"))
  digest, resumed_losses = finish(start_training(tmp_path / "killed", *flags), resumed_from=20)
  assert min(resumed_losses) == 30 and digest == expected
  assert all(resumed_losses[s] == losses[s] for s in (40, 50, 60))


@pytest.mark.slow
def test_half_written_newest_checkpoint_is_ignored(tmp_path, monkeypatch):
  # eval_every_steps=0 here and below: no validation at the end (its decoding's compile and
  # run) where the test reads parameters and steps alone.
  config = one_layer_toy()
  config.num_train_steps, config.checkpoint_every_steps, config.eval_every_steps = 20, 10, 0
  config.dataset.toy_eval_examples = 10
  created = []  # the initial states the trainer compiles and creates
  call_once = trainer.devices.call_once
  monkeypatch.setattr(trainer.devices, "call_once",
                      lambda *args, **kwargs: created.append(1) or call_once(*args, **kwargs))
  trainer.train_and_evaluate(config, str(tmp_path))
  assert len(created) == 1
  directory = checkpoints.checkpoint_dir(str(tmp_path))
  # A writer killed mid-save leaves orbax's temporary directory, never a finished step.
  partial = os.path.join(directory, "30.orbax-checkpoint-tmp-1795300000000000")
  shutil.copytree(os.path.join(directory, "20"), partial)
  for root, _, files in os.walk(partial):
    for name in files:
      with open(os.path.join(root, name), "r+b") as f:
        f.truncate(max(0, os.path.getsize(f.name) // 2))
  assert checkpoints.last_steps(str(tmp_path), 5) == [10, 20]
  config.num_train_steps = 25
  summary = trainer.train_and_evaluate(config, str(tmp_path))  # restores 20, not the fragment
  assert summary["start_step"] == 20 and summary["step"] == 25
  assert len(created) == 1  # resumed: no fresh state beside the one restored
  assert summary["params_digest"] == trainer.train_and_evaluate(
      config, str(tmp_path / "uninterrupted"))["params_digest"]


@pytest.mark.slow  # trains
def test_nonfinite_steps_are_skipped_then_training_stops_naming_the_last_good_checkpoint(
    tmp_path, monkeypatch):
  config = one_layer_toy()
  config.num_train_steps, config.checkpoint_every_steps, config.eval_every_steps = 10, 5, 0
  config.dataset.toy_eval_examples = 10
  trainer.train_and_evaluate(config, str(tmp_path))
  good = checkpoints.last_steps(str(tmp_path), 1)
  model = trainer.train_step.make_model(config)
  abstract = checkpoints.abstract_of(trainer.train_step.create_train_state(config, model).params)
  before = checkpoints.load_params(str(tmp_path), abstract, good)
  config.num_train_steps, config.log_every_steps, config.checkpoint_every_steps = 30, 1, 1
  config.max_consecutive_nonfinite_steps = 3
  finite_loss = trainer.train_step.loss.label_smoothed_nll

  def nan_loss(logits, targets, label_smoothing, form):  # every loss and gradient is now NaN
    loss_sum, nll_sum, tokens = finite_loss(logits, targets, label_smoothing, form)
    return loss_sum * math.nan, nll_sum, tokens
  monkeypatch.setattr(trainer.train_step.loss, "label_smoothed_nll", nan_loss)
  with pytest.raises(trainer.NonFiniteTrainingError, match=r"step 13: 3 consecutive .* step 12"):
    trainer.train_and_evaluate(config, str(tmp_path))
  after = checkpoints.load_params(str(tmp_path), abstract, [12])
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
    np.testing.assert_array_equal(a, b)  # the skipped updates changed nothing, and saved no NaN


@pytest.mark.slow  # trains
def test_resuming_with_a_different_model_is_refused_with_the_field_named_and_data_dir_is_not(
    tmp_path):
  config = one_layer_toy()
  config.num_train_steps, config.checkpoint_every_steps, config.eval_every_steps = 5, 5, 0
  config.dataset.toy_eval_examples = 10
  trainer.train_and_evaluate(config, str(tmp_path))
  config.model.d_ff, config.num_train_steps, config.log_every_steps = 256, 10, 1
  with pytest.raises(ValueError, match=r"model\.d_ff: 128 -> 256.*--force_resume"):
    trainer.train_and_evaluate(config, str(tmp_path))
  config.model.d_ff = 128  # logging and step counts may change
  # and where the data is prepared, since the batches (the checkpoint's plan) are the same
  config.dataset.data_dir = str(tmp_path / "prepared_elsewhere")
  assert trainer.train_and_evaluate(config, str(tmp_path))["step"] == 10


@pytest.mark.slow  # trains, then starts train.py
def test_resuming_on_another_number_of_data_shards_is_refused_naming_both(tmp_path):
  config = one_layer_toy()
  config.num_train_steps, config.checkpoint_every_steps, config.eval_every_steps = 5, 5, 0
  config.dataset.toy_eval_examples = 10
  trainer.train_and_evaluate(config, str(tmp_path))  # 1 device here
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  result = subprocess.run(
      [sys.executable, "train.py", "--config=configs/toy.py", f"--workdir={tmp_path}",
       TOY_ONE_LAYER, "--config.num_train_steps=10", "--config.eval_every_steps=0",
       "--config.dataset.toy_eval_examples=10", "--config.checkpoint_every_steps=5"],
      cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
  assert result.returncode == 1, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
      f"train.py: error: {checkpoints.checkpoint_dir(str(tmp_path))} was trained with another "
      "config (data shards (the mesh's data axis): 1 -> 2, which changes the batch list); use a "
      "fresh --workdir, or --force_resume to continue anyway")
