"""Checkpoints of a toy run: they hold the state training ended with, average as section 6.1
says, continue a run, and record the software that wrote them; and a failed save's folder is
removed even while a late writer recreates it."""
import shutil

import jax
import numpy as np
import pytest

from aiayn_flax.runtime import checkpoints
from aiayn_flax.training import trainer


def abstract_params(config):
  model = trainer.train_step.make_model(config)
  return checkpoints.abstract_of(trainer.train_step.create_train_state(config, model).params)


def test_the_last_checkpoint_holds_the_parameters_training_ended_with(toy_run):
  config, workdir, summary = toy_run
  model = trainer.train_step.make_model(config)
  template = trainer.train_step.create_train_state(config, model)
  mngr = checkpoints.manager(workdir, read_only=True)
  state, meta = checkpoints.restore(mngr, mngr.latest_step(), checkpoints.abstract_of(template))
  mngr.close()
  assert int(state.step) == config.num_train_steps
  assert meta["config"]["num_train_steps"] == config.num_train_steps
  # The digest the trainer took of its parameters in memory, after the last step: the truth
  # both readers of the checkpoint (the full state, the parameters alone) must give back.
  assert trainer.params_digest(state.params) == summary["params_digest"]
  loaded = checkpoints.load_params(workdir, abstract_params(config), [config.num_train_steps])
  assert trainer.params_digest(loaded) == summary["params_digest"]


def test_averaging_checkpoints_gives_the_elementwise_mean(toy_run):
  config, workdir, _ = toy_run
  abstract = abstract_params(config)
  steps = checkpoints.last_steps(workdir, 2)
  assert len(steps) == 2
  each = [checkpoints.load_params(workdir, abstract, [s]) for s in steps]
  mean = checkpoints.load_params(workdir, abstract, steps)
  for a, b, m in zip(*(jax.tree.leaves(t) for t in (*each, mean))):
    assert not np.array_equal(a, b)  # two different checkpoints, or the mean proves nothing
    np.testing.assert_allclose(m, (a + b) / 2, rtol=1e-6, atol=1e-7)


def test_averaging_more_checkpoints_than_the_run_holds_is_refused(toy_run):
  config, workdir, _ = toy_run
  abstract = abstract_params(config)
  held = len(checkpoints.last_steps(workdir, 100))
  _, steps = checkpoints.load_newest_params(workdir, abstract, held)
  assert steps == checkpoints.last_steps(workdir, held)
  with pytest.raises(ValueError, match=f"holds {held} checkpoints, fewer than --average_last="
                                       f"{held + 1}$"):
    checkpoints.load_newest_params(workdir, abstract, held + 1)


def test_second_run_in_the_same_workdir_continues_from_the_last_step(toy_run, tmp_path):
  config, workdir, summary = toy_run
  continued = str(tmp_path / "continued")
  shutil.copytree(workdir, continued)
  config = config.copy_and_resolve_references()
  config.num_train_steps += 20
  config.checkpoint_every_steps = 10
  more = trainer.train_and_evaluate(config, continued)
  assert more["start_step"] == 1000 and more["step"] == 1020  # not from scratch
  assert checkpoints.last_steps(continued, 10)[-2:] == [1010, 1020]
  assert more["params_digest"] != summary["params_digest"]  # and it did train


def test_checkpoints_record_the_software_versions(toy_run):
  import flax
  import orbax.checkpoint
  _, workdir, _ = toy_run
  mngr = checkpoints.manager(workdir, read_only=True)
  versions = checkpoints.restore_meta(mngr, mngr.latest_step())["versions"]
  mngr.close()
  assert (versions["jax"], versions["flax"], versions["orbax-checkpoint"]) == (
      jax.__version__, flax.__version__, orbax.checkpoint.__version__)


def test_a_failed_save_s_folder_that_a_late_writer_recreates_is_removed_again(tmp_path,
                                                                               monkeypatch):
  """Orbax's writer threads may still be failing after the error reached the trainer and
  recreate the unfinished save's folder just removed: remove_unfinished removes it again
  until the folder stays gone, and leaves the finished checkpoints as they were. The late
  writer here recreates the folder right after each of the first two removals (no thread, no
  timing: the test does not depend on the machine's load)."""
  monkeypatch.setattr(checkpoints, "UNFINISHED_QUIET_S", 0.05)
  directory = checkpoints.checkpoint_dir(str(tmp_path))
  (directory / "20").mkdir(parents=True)
  (directory / "20" / "kept").write_text("a finished checkpoint")
  unfinished = directory / "40.orbax-checkpoint-tmp-1" / "state"
  unfinished.mkdir(parents=True)
  original, removals = checkpoints._remove_tree, []

  def remove_then_a_late_write(path):
    problem = original(path)
    removals.append(path.name)
    if len(removals) <= 2:
      unfinished.mkdir(parents=True)
      (unfinished / f"chunk{len(removals)}").write_bytes(b"\0" * 64)
    return problem
  monkeypatch.setattr(checkpoints, "_remove_tree", remove_then_a_late_write)
  checkpoints.remove_unfinished(str(tmp_path))
  assert removals == ["40.orbax-checkpoint-tmp-1"] * 3
  assert sorted(p.name for p in directory.iterdir()) == ["20"]
  assert (directory / "20" / "kept").read_text() == "a finished checkpoint"
