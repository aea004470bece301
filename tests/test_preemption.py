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


@pytest.mark.slow
def test_a_signal_to_one_host_stops_every_host_at_the_same_step_then_resumes_exactly(tmp_path):
  uninterrupted = digests(launch([*FLAGS, f"--workdir={tmp_path / 'uninterrupted'}"], 2, 4))
  assert uninterrupted[0] == uninterrupted[1]
  run = [*FLAGS, f"--workdir={tmp_path / 'run'}"]

  # SIGTERM to process 1 alone after step 6: both stop after the next call's two steps, at 8.
  # Process 0 catches a Ctrl-C of its own after step 8, too late for that agreement: it stops
  # with the agreed SIGTERM (143, which wins over SIGINT), not with its own 130.
  stopped = launch(run, 2, 4, process_env={1: {"AIAYN_TEST_SIGNAL_AT_STEP": "SIGTERM:6"},
                                           0: {"AIAYN_TEST_SIGNAL_AT_STEP": "SIGINT:8"}})
  assert [r.returncode for r in stopped] == [143, 143], stopped[0].stderr[-3000:]
  for result in stopped:
    assert "stopped by SIGTERM at step 8 (checkpoint saved)" in result.stderr
  assert "SIGINT received" in stopped[0].stderr
  assert checkpoints.last_steps(str(tmp_path / "run"), 10) == [8]  # saved once, at that step

  resumed = launch(run, 2, 4)
  for result in resumed:
    assert "Resumed from step 8 of" in result.stderr
  assert digests(resumed) == uninterrupted
