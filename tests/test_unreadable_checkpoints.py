"""A newest checkpoint that cannot be read (bit rot, a truncated file) is skipped with a warning
naming it, never deleted: training resumes from the previous one and ends exactly as an
uninterrupted run; evaluation and translation use the newest checkpoints that read. On several
hosts, all agree on which checkpoint reads, and a read that fails once is retried."""
import logging
import os
import re
import shutil

import pytest

from aiayn_flax import checkpoints, run_dir, trainer
from configs import toy
from multi_host_launch import launch


def toy_config(steps: int):
  config = toy.get_config()
  config.num_train_steps, config.checkpoint_every_steps = steps, 10
  config.eval_every_steps, config.log_every_steps = 1000, 10
  config.dataset.toy_eval_examples = 10
  config.checkpoint_asynchronously, config.keep_checkpoints = False, 5
  return config


def truncate_array_files(workdir, step: int, under: str = "") -> None:
  """Cuts every data file of a finished checkpoint's train state (or of its folder `under`) to
  half its size.

  Every file, not only the largest: which arrays share a file varies from run to run, and the
  parameters alone (all that evaluation reads) must be unreadable too.
  """
  state = os.path.join(checkpoints.checkpoint_dir(workdir), str(step), "state", under)
  data_files = [os.path.join(root, name) for root, _, names in os.walk(state)
                if os.path.basename(root) == "d" for name in names]
  assert data_files, f"no array data files under {state}"
  for path in data_files:
    os.truncate(path, os.path.getsize(path) // 2)


def digest_of(result) -> str:
  assert result.returncode == 0, result.stderr[-3000:]
  return re.search(r"^params_digest: ([0-9a-f]{64})$", result.stdout, re.M).group(1)


@pytest.fixture(scope="module")
def uninterrupted_40(tmp_path_factory):
  return trainer.train_and_evaluate(toy_config(40), str(tmp_path_factory.mktemp("straight")))


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


@pytest.mark.slow
def test_hosts_agree_on_the_checkpoint_to_resume_from_and_retry_a_failed_read(tmp_path):
  """Two processes (multi_host_launch), parameters split over both (FSDP): the newest
  checkpoint's shards written by process 1 are damaged, so that process 1 alone cannot read it,
  and reading the one before fails once on process 1 (a transient storage error). Both resume
  from that one, the damaged one is set aside once, and the run ends as the uninterrupted one."""
  flags = ["train.py", "--config=configs/toy.py", "--config.num_train_steps=30",
           "--config.fsdp=True", "--config.checkpoint_every_steps=10",
           "--config.keep_checkpoints=5", "--config.log_every_steps=10",
           "--config.eval_every_steps=1000", "--config.dataset.toy_eval_examples=10",
           "--config.model.dropout_rate=0.1", "--config.label_smoothing=0.1",
           "--config.checkpoint_asynchronously=false"]
  straight = launch([*flags, f"--workdir={tmp_path / 'straight'}"], 2, 4)
  expected = [digest_of(result) for result in straight]
  workdir = tmp_path / "resumed"
  shutil.copytree(tmp_path / "straight", workdir)
  truncate_array_files(str(workdir), 30, under="ocdbt.process_1")

  resumed = launch([*flags, f"--workdir={workdir}"], 2, 4, process_env={
      1: {checkpoints.TEST_READ_ERROR_VARIABLE: "20"}})
  assert [digest_of(result) for result in resumed] == expected
  damaged = f"{checkpoints.checkpoint_dir(str(workdir))}/30 cannot be read ("
  assert damaged + "read here, but not on another process)" in resumed[0].stderr
  assert damaged in resumed[1].stderr
  for result in resumed:
    assert "Resumed from step 20 of" in result.stderr
  assert re.search(r"reading checkpoint \S+/20 failed \(OSError: injected read error",
                   resumed[1].stderr)
  moves = [r.stderr.count("moved the unreadable checkpoint of step 30") for r in resumed]
  assert moves == [1, 0]  # by process 0 alone
  assert sorted(os.listdir(workdir / checkpoints.UNREADABLE_DIR)) == ["30", "README.txt"]
  assert checkpoints.last_steps(str(workdir), 10) == [10, 20, 30]
