"""A newest checkpoint that cannot be read (bit rot, a truncated file) is skipped with a warning
naming it, never deleted: training resumes from the previous one and ends exactly as an
uninterrupted run; evaluation and translation use the newest checkpoints that read. Several hosts
agreeing on which checkpoint reads, and retrying a read that failed once, are tested in
tests/test_preemption.py beside the stops (they share one uninterrupted 2-process run)."""
import logging
import os

import pytest

from aiayn_flax.runtime import checkpoints
from aiayn_flax import run_dir
from aiayn_flax.training import trainer
from configs import toy
from conftest import truncate_array_files


def toy_config(steps: int):
  config = toy.get_config()
  config.model.num_layers = 1  # conftest.TOY_ONE_LAYER
  config.num_train_steps, config.checkpoint_every_steps = steps, 10
  config.eval_every_steps, config.log_every_steps = 0, 10
  config.dataset.toy_eval_examples = 10
  config.checkpoint_asynchronously, config.keep_checkpoints = False, 5
  return config


@pytest.fixture(scope="module")
def uninterrupted_40(tmp_path_factory):
  return trainer.train_and_evaluate(toy_config(40), str(tmp_path_factory.mktemp("straight")))


@pytest.mark.slow  # trains
def test_training_falls_back_to_the_newest_readable_checkpoint_and_resumes_exactly(
    uninterrupted_40, tmp_path, caplog):
  workdir = str(tmp_path)
  trainer.train_and_evaluate(toy_config(30), workdir)
  truncate_array_files(workdir, 30)
  with caplog.at_level(logging.WARNING):
    summary = trainer.train_and_evaluate(toy_config(40), workdir)
  assert summary["start_step"] == 20 and summary["step"] == 40
  assert summary["params_digest"] == uninterrupted_40["params_digest"]
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert any(f"{checkpoints.checkpoint_dir(workdir)}/30 cannot be read" in w for w in warnings)
  # Kept for inspection, out of the way of the new step-30 checkpoint.
  assert os.path.isdir(os.path.join(workdir, checkpoints.UNREADABLE_DIR, "30", "state"))
  assert checkpoints.last_steps(workdir, 10)[-3:] == [20, 30, 40]


@pytest.mark.slow  # trains
def test_evaluation_averages_the_newest_readable_checkpoints(uninterrupted_40, tmp_path,
                                                            caplog):
  workdir = str(tmp_path)
  trainer.train_and_evaluate(toy_config(30), workdir)
  truncate_array_files(workdir, 30)
  config = run_dir.load_config(workdir)  # the step-30 metadata still reads
  with caplog.at_level(logging.WARNING):
    _, _, steps = run_dir.load_model_and_params(workdir, config, average_last=2)
  assert steps == [10, 20]
  assert any("/30 cannot be read" in r.getMessage() for r in caplog.records)
  assert os.path.isdir(os.path.join(checkpoints.checkpoint_dir(workdir), "30"))  # not moved
  with pytest.raises(ValueError, match=r"2 readable checkpoints where 3 are needed; cannot "
                                       r"read step 30 \("):
    run_dir.load_model_and_params(workdir, config, average_last=3)
