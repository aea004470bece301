"""Orbax checkpoints of everything a resume needs, and checkpoint averaging (section 6.1)."""
import contextlib
import functools

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from aiayn_flax import paths

CHECKPOINT_DIR = "checkpoints"
# Where training moves a checkpoint it cannot read (never deleted), so that the run can save
# that step again when it gets there.
UNREADABLE_DIR = "unreadable_checkpoints"


def checkpoint_dir(workdir: str) -> epath.Path:
  return paths.workdir_path(workdir) / CHECKPOINT_DIR


def manager(workdir: str, keep: int | None = None, read_only: bool = False,
            asynchronous: bool = True) -> ocp.CheckpointManager:
  """A CheckpointManager over workdir/checkpoints. Saves are asynchronous and atomic: orbax
  writes into a temporary directory and renames it when complete, so a killed writer never
  leaves a checkpoint that looks finished."""
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                         read_only=read_only, enable_async_checkpointing=asynchronous)
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options,
                               item_names=("state", "meta"))


def save(mngr: ocp.CheckpointManager, step: int, state, meta: dict) -> None:
  """`state`: any pytree of arrays (train state); `meta`: JSON (data position, config)."""
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                           meta=ocp.args.JsonSave(meta)))


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state):
  """(state, meta) of a step, shaped and sharded like `abstract_state`."""
  restored = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
  return restored.state, restored.meta


def restore_meta(mngr: ocp.CheckpointManager, step: int) -> dict:
  return mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta


def abstract_of(tree):
  """ShapeDtypeStructs (with shardings) describing `tree`, for restoring into its layout."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def newest_readable(mngr: ocp.CheckpointManager, read, limit: int = 1) -> list[tuple]:
  """[(step, read(step)), ...] for the newest `limit` checkpoints that can be read, newest
  first. A checkpoint that cannot be read (bit rot, a truncated or missing file) is skipped
  with a warning naming it, and left where it is. [] when there is no checkpoint; a ValueError
  in one line when there are some but too few can be read."""
  found, unreadable = [], []
  for step in sorted(mngr.all_steps(), reverse=True):
    if len(found) == limit:
      break
    try:
      found.append((step, read(step)))
    except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise plain Exceptions here
      reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
      unreadable.append(f"{step} ({reason})")
      logging.warning("checkpoint %s/%d cannot be read (%s); skipped (not deleted)",
                      mngr.directory, step, reason)
  if unreadable and len(found) < limit:
    raise ValueError(f"{mngr.directory}: {len(found)} readable checkpoints where {limit} are "
                     f"needed; cannot read step {'; step '.join(unreadable)}")
  return found


def set_aside(mngr: ocp.CheckpointManager, workdir: str, steps: list[int]) -> None:
  """Moves the given steps' checkpoints to workdir/unreadable_checkpoints/ (kept for
  inspection), so that training can write those steps again."""
  aside = paths.workdir_path(workdir) / UNREADABLE_DIR
  # A file in it makes the folder exist on Cloud Storage too, where a rename needs one.
  aside.mkdir(parents=True, exist_ok=True)
  (aside / "README.txt").write_text(
      "Checkpoints that training could not read, moved here and never deleted.\n")
  for step in steps:
    (epath.Path(mngr.directory) / str(step)).rename(aside / str(step))
    logging.warning("moved the unreadable checkpoint of step %d to %s", step, aside)
  mngr.reload()


def load_params(workdir: str, abstract_params, steps: list[int] | None = None):
  """Parameters of the given steps' checkpoints (default: the latest), averaged element-wise.

  `abstract_params` gives the parameter tree's structure, shapes and shardings.
  """
  with _params_reader(workdir, abstract_params) as (mngr, read):
    available = list(mngr.all_steps())
    steps = steps or [max(available)]
    missing = sorted(set(steps) - set(available))
    if missing:
      raise ValueError(f"{checkpoint_dir(workdir)}: no checkpoint for steps {missing} "
                       f"(available: {sorted(available)})")
    return _mean([read(step) for step in steps])


def load_newest_params(workdir: str, abstract_params, n: int):
  """(params, steps): parameters averaged over the newest n checkpoints that can be read (an
  unreadable one is skipped with a warning), and their steps, oldest first."""
  with _params_reader(workdir, abstract_params) as (mngr, read):
    stored = len(mngr.all_steps())
    if stored < n:
      raise ValueError(f"{checkpoint_dir(workdir)} holds {stored} checkpoints, "
                       f"fewer than --average_last={n}")
    steps, each = zip(*reversed(newest_readable(mngr, read, n)))
    return _mean(each), list(steps)


@contextlib.contextmanager
def _params_reader(workdir: str, abstract_params):
  """(manager, read): read(step) gives a checkpoint's parameters as host arrays, nothing else
  of its train state. FileNotFoundError when there is no checkpoint."""
  mngr = manager(workdir, read_only=True)
  try:
    if not mngr.all_steps():
      raise FileNotFoundError(f"{checkpoint_dir(workdir)}: no checkpoint; train first "
                              f"(python train.py --workdir={workdir})")

    def read(step):
      restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          item={"params": abstract_params},
          restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                    {"params": abstract_params}),
          partial_restore=True)))
      return restored.state["params"]

    yield mngr, read
  finally:
    mngr.close()


def _mean(trees):
  total = functools.reduce(lambda a, b: jax.tree.map(np.add, a, b), trees)
  return jax.tree.map(lambda x: (x / len(trees)).astype(np.float32), total)


def last_steps(workdir: str, n: int) -> list[int]:
  """The newest n checkpoint steps, oldest first."""
  mngr = manager(workdir, read_only=True)
  steps = sorted(mngr.all_steps())[-n:]
  mngr.close()
  return steps
