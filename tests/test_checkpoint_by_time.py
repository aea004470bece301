"""Checkpoints by the clock (config.checkpoint_every_minutes, section 6.1's "10-minute
intervals"), with a fake clock: a run saves when the minutes are up, whatever its step count,
and a run that crashed resumes from its last checkpoint by minutes to the uninterrupted run's
parameters."""
import itertools
import re

import pytest

from aiayn_flax.runtime import checkpoints
from aiayn_flax import config_checks
from aiayn_flax.training import resume, trainer
from configs import base, big, toy
from conftest import TOY_ONE_LAYER

# A test cluster's process reads its clock's pace from this (tests/cluster_site/sitecustomize.py).
CLOCK_VARIABLE = "AIAYN_TEST_SECONDS_PER_CLOCK_READING"


def by_minutes_config():
  config = toy.get_config()
  config.model.num_layers = 1  # conftest.TOY_ONE_LAYER
  config.num_train_steps, config.log_every_steps, config.eval_every_steps = 14, 1, 0
  config.checkpoint_every_minutes, config.checkpoint_every_steps = 2, 0  # by the clock alone
  config.keep_checkpoints, config.checkpoint_asynchronously = 10, False
  config.dataset.toy_eval_examples = 10
  config.model.dropout_rate = 0.1  # so that a resume must reproduce dropout's masks
  return config


def thirty_seconds_a_reading(monkeypatch):
  """The trainer's clock: 30 s later at each reading (one a step, one after each save): with
  checkpoint_every_minutes=2, a checkpoint every fourth step."""
  readings = itertools.count()
  monkeypatch.setattr(trainer, "clock", lambda: 30.0 * next(readings))


@pytest.mark.slow
def test_a_run_checkpoints_by_minutes_and_resumes_exactly_after_a_crash(tmp_path, monkeypatch):
  config = by_minutes_config()
  thirty_seconds_a_reading(monkeypatch)
  uninterrupted = trainer.train_and_evaluate(config, str(tmp_path / "uninterrupted"))
  # Every 2 minutes of the clock (four steps of 30 s), and the last step.
  assert checkpoints.finished_steps(str(tmp_path / "uninterrupted")) == [4, 8, 12, 14]

  thirty_seconds_a_reading(monkeypatch)
  logged = trainer.log_train_metrics

  def crash_at_step_10(writer, step, *args):
    if step == 10:
      raise RuntimeError("crashed at step 10")
    return logged(writer, step, *args)
  monkeypatch.setattr(trainer, "log_train_metrics", crash_at_step_10)
  with pytest.raises(RuntimeError, match="crashed at step 10"):
    trainer.train_and_evaluate(config, str(tmp_path / "crashed"))
  assert checkpoints.finished_steps(str(tmp_path / "crashed")) == [4, 8]

  monkeypatch.setattr(trainer, "log_train_metrics", logged)
  thirty_seconds_a_reading(monkeypatch)
  resumed = trainer.train_and_evaluate(config, str(tmp_path / "crashed"))
  assert resumed["start_step"] == 8 and resumed["step"] == 14
  assert resumed["params_digest"] == uninterrupted["params_digest"]


def test_paper_configs_checkpoint_every_ten_minutes_and_a_run_needs_minutes_or_steps():
  for config in (base.get_config(), big.get_config()):
    assert (config.checkpoint_every_minutes, config.checkpoint_every_steps) == (10, 0)
  config = toy.get_config()
  config.checkpoint_every_minutes = config.checkpoint_every_steps = 0
  with pytest.raises(ValueError, match=r"checkpoint_every_minutes=0\.0: must be >= 0, and positive "
                                       r"where checkpoint_every_steps is 0"):
    config_checks.check_config(config)
  # The cadence may change on resume: it changes neither the model nor the batches.
  assert not resume.resume_conflicts({"checkpoint_every_minutes": 10},
                                     {"checkpoint_every_minutes": 5})


@pytest.mark.slow
def test_two_hosts_whose_clocks_disagree_save_where_either_finds_a_checkpoint_due(tmp_path):
  """Each host reads its own clock, and all must save after the same step (one collective
  save), or one would wait inside orbax for the others. Here host 0's clock runs 30 s a reading
  (a checkpoint due every 4 readings, at checkpoint_every_minutes=2) and host 1's stands still
  (never due): only the agreement (runtime/stops.py) makes host 1 save with host 0. Agreed one
  step late (the reduction is read one call later): due after steps 4 and 9, saved after 5 and
  10; 12 is the last step. A host deciding alone leaves host 0 waiting in orbax for host 1."""
  from multi_host_launch import launch
  results = launch(["train.py", "--config=configs/toy.py", f"--workdir={tmp_path}", TOY_ONE_LAYER,
                    "--config.num_train_steps=12", "--config.checkpoint_every_minutes=2",
                    "--config.checkpoint_every_steps=0", "--config.keep_checkpoints=20",
                    "--config.log_every_steps=4", "--config.eval_every_steps=0",
                    "--config.dataset.toy_eval_examples=10"], 2, 2, timeout=150,
                   process_env={0: {CLOCK_VARIABLE: "30"}, 1: {CLOCK_VARIABLE: "0"}})
  for result in results:
    assert result.returncode == 0, result.stderr[-3000:]
  digests = [re.search(r"^params_digest: ([0-9a-f]{64})$", r.stdout, re.M).group(1)
             for r in results]
  assert digests[0] == digests[1]
  assert checkpoints.finished_steps(str(tmp_path)) == [5, 10, 12]
