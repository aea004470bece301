"""Stops and resumes on several hosts: two train.py processes joined by jax.distributed
(loopback, gloo, 2 simulated CPU devices each) form one run with its parameters split over both
(FSDP), taking two steps per call. Each test ends with the parameters of one uninterrupted run of
the same command (a module fixture: 2-process launches are the slowest part of the suite).

- A signal to one of them alone (a preemption notice or a Ctrl-C seldom reaches every host at the
  same step) must stop both after the same step, with one checkpoint and the documented exit
  status (143 for SIGTERM, 130 for SIGINT); the same command then resumes both.
- A newest checkpoint that one process alone cannot read: all agree on the one before, and a read
  that fails once is retried (tests/test_unreadable_checkpoints.py has the one-process cases).

The trainer sends itself the signal at a given step (AIAYN_TEST_SIGNAL_AT_STEP), so nothing
here races the run: the processes agree on the stop one call after the signal."""
import os
import re
import shutil

import pytest

from aiayn_flax.runtime import checkpoints
from conftest import TOY_ONE_LAYER, truncate_array_files
from multi_host_launch import DEVICES_PER_HOST, launch

FLAGS = ["train.py", "--config=configs/toy.py", TOY_ONE_LAYER, "--config.num_train_steps=12",
         "--config.fsdp=True", "--config.steps_per_call=2", "--config.log_every_steps=2",
         "--config.checkpoint_every_steps=6", "--config.keep_checkpoints=5",
         # No evaluation (about 11 s a launch across two hosts): these tests read parameters.
         "--config.checkpoint_asynchronously=false", "--config.eval_every_steps=0",
         "--config.dataset.toy_eval_examples=10", "--config.model.dropout_rate=0.1",
         "--config.label_smoothing=0.1"]


def digests(results) -> list[str]:
  for result in results:
    assert result.returncode == 0, result.stderr[-3000:]
  return [re.search(r"^params_digest: ([0-9a-f]{64})$", r.stdout, re.M).group(1)
          for r in results]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """The workdir and final parameter digests of the run never interrupted (checkpoints at 6
  and 12)."""
  workdir = tmp_path_factory.mktemp("uninterrupted")
  result = digests(launch([*FLAGS, f"--workdir={workdir}"], 2, DEVICES_PER_HOST))
  assert result[0] == result[1]
  return workdir, result


@pytest.mark.slow
def test_a_signal_to_one_host_stops_every_host_at_the_same_step_then_resumes_exactly(
    uninterrupted, tmp_path):
  run = [*FLAGS, f"--workdir={tmp_path / 'run'}"]

  # SIGTERM to process 1 alone after step 2: both stop after the next call's two steps, at 4.
  # Process 0 catches a Ctrl-C of its own after step 4, too late for that agreement: it stops
  # with the agreed SIGTERM (143, which wins over SIGINT), not with its own 130.
  stopped = launch(run, 2, DEVICES_PER_HOST,
                   process_env={1: {"AIAYN_TEST_SIGNAL_AT_STEP": "SIGTERM:2"},
                                0: {"AIAYN_TEST_SIGNAL_AT_STEP": "SIGINT:4"}})
  assert [r.returncode for r in stopped] == [143, 143], stopped[0].stderr[-3000:]
  for result in stopped:
    assert "stopped by SIGTERM at step 4 (checkpoint saved)" in result.stderr
  assert "SIGINT received" in stopped[0].stderr
  assert checkpoints.last_steps(str(tmp_path / "run"), 10) == [4]  # saved once, at that step

  resumed = launch(run, 2, DEVICES_PER_HOST,
                   env={"JAX_DEBUG_LOG_MODULES": "jax._src.compiler"})
  for result in resumed:
    assert "Resumed from step 4 of" in result.stderr
  assert digests(resumed) == uninterrupted[1]
  # Process 1 loads the train step that process 0 stored, as on a TPU or GPU cluster, rather
  # than compiling it while process 0 waits (tests/cluster_site/sitecustomize.py).
  assert "Persistent compilation cache hit for 'jit_train_steps'" in resumed[1].stderr


@pytest.mark.slow
def test_hosts_agree_on_the_checkpoint_to_resume_from_and_retry_a_failed_read(
    uninterrupted, tmp_path):
  """The newest checkpoint's shards written by process 1 are damaged, so that process 1 alone
  cannot read it, and reading the one before fails once on process 1 (a transient storage
  error). Both resume from that one, the damaged one is set aside once, and the run ends as the
  uninterrupted one."""
  workdir = tmp_path / "resumed"
  shutil.copytree(uninterrupted[0], workdir)
  truncate_array_files(str(workdir), 12, under="ocdbt.process_1")

  resumed = launch([*FLAGS, f"--workdir={workdir}"], 2, DEVICES_PER_HOST, process_env={
      1: {checkpoints.TEST_READ_ERROR_VARIABLE: "6"}})
  assert digests(resumed) == uninterrupted[1]
  damaged = f"{checkpoints.checkpoint_dir(str(workdir))}/12 cannot be read ("
  assert damaged + "read here, but not on another process)" in resumed[0].stderr
  assert damaged in resumed[1].stderr
  for result in resumed:
    assert "Resumed from step 6 of" in result.stderr
  assert re.search(r"reading checkpoint \S+/6 failed \(OSError: injected read error",
                   resumed[1].stderr)
  moves = [r.stderr.count("moved the unreadable checkpoint of step 12") for r in resumed]
  assert moves == [1, 0]  # by process 0 alone
  assert sorted(os.listdir(workdir / checkpoints.UNREADABLE_DIR)) == ["12", "README.txt"]
  assert checkpoints.last_steps(str(workdir), 10) == [6, 12]
