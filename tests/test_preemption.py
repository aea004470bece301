"""Preemption on several hosts: two train.py processes joined by jax.distributed (loopback,
gloo, 4 simulated CPU devices each) form one data-parallel run taking two steps per call. A
signal to one of them alone (a preemption notice or a Ctrl-C seldom reaches every host at the
same step) must stop both after the same step, with one checkpoint and the documented exit
status (143 for SIGTERM, 130 for SIGINT); the same command then resumes both, and the run ends
with the parameters of a run never interrupted.

The trainer sends itself the signal at a given step (AIAYN_TEST_SIGNAL_AT_STEP), so nothing
here races the run: the processes agree on the stop one call after the signal."""
import re

import pytest

from aiayn_flax import checkpoints
from multi_host_launch import launch

FLAGS = ["train.py", "--config=configs/toy.py", "--config.num_train_steps=20",
         "--config.steps_per_call=2", "--config.log_every_steps=2",
         "--config.checkpoint_every_steps=1000", "--config.eval_every_steps=1000",
         "--config.dataset.toy_eval_examples=10", "--config.model.dropout_rate=0.1",
         "--config.label_smoothing=0.1"]


def digests(results) -> list[str]:
  for result in results:
    assert result.returncode == 0, result.stderr[-3000:]
  return [re.search(r"^params_digest: ([0-9a-f]{64})$", r.stdout, re.M).group(1)
          for r in results]


def signal_at(process: int, signal_and_step: str) -> dict:
  return {process: {"AIAYN_TEST_SIGNAL_AT_STEP": signal_and_step}}


@pytest.mark.slow
def test_a_signal_to_one_host_stops_every_host_at_the_same_step_then_resumes_exactly(tmp_path):
  uninterrupted = digests(launch([*FLAGS, f"--workdir={tmp_path / 'uninterrupted'}"], 2, 4))
  assert uninterrupted[0] == uninterrupted[1]
  run = [*FLAGS, f"--workdir={tmp_path / 'run'}"]

  # SIGTERM to process 1 after step 6; both stop after the next call's two steps.
  stopped = launch(run, 2, 4, process_env=signal_at(1, "SIGTERM:6"))
  assert [r.returncode for r in stopped] == [143, 143], stopped[0].stderr[-3000:]
  for result in stopped:
    assert "stopped by SIGTERM at step 8 (checkpoint saved)" in result.stderr
  assert checkpoints.last_steps(str(tmp_path / "run"), 10) == [8]  # saved once, at that step

  # Resumed; Ctrl-C on process 0 after step 12: both stop at 14 with 130.
  interrupted = launch(run, 2, 4, process_env=signal_at(0, "SIGINT:12"))
  assert [r.returncode for r in interrupted] == [130, 130], interrupted[1].stderr[-3000:]
  for result in interrupted:
    assert "Resumed from step 8 of" in result.stderr
    assert "stopped by SIGINT at step 14 (checkpoint saved)" in result.stderr
  assert checkpoints.last_steps(str(tmp_path / "run"), 10) == [8, 14]

  resumed = launch(run, 2, 4)
  for result in resumed:
    assert "Resumed from step 14 of" in result.stderr
  assert digests(resumed) == uninterrupted
