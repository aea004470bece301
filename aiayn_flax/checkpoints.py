"""Orbax checkpoints of everything a resume needs, and checkpoint averaging (section 6.1)."""
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


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


def load_params(workdir: str, abstract_params, steps: list[int] | None = None):
  """Parameters of the given steps' checkpoints (default: the latest), averaged element-wise.

  `abstract_params` gives the parameter tree's structure, shapes and shardings.
  """
  mngr = manager(workdir, read_only=True)
  available = list(mngr.all_steps())
  if not available:
    raise FileNotFoundError(f"{checkpoint_dir(workdir)}: no checkpoint; train first "
                            f"(python train.py --workdir={workdir})")
  steps = steps or [max(available)]
  missing = sorted(set(steps) - set(available))
  if missing:
    raise ValueError(f"{checkpoint_dir(workdir)}: no checkpoint for steps {missing} "
                     f"(available: {sorted(available)})")
  total = None
  for step in steps:
    restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item={"params": abstract_params},
        restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                  {"params": abstract_params}),
        partial_restore=True)))
    params = restored.state["params"]
    total = params if total is None else jax.tree.map(np.add, total, params)
  mngr.close()
  return jax.tree.map(lambda x: (x / len(steps)).astype(np.float32), total)


def last_steps(workdir: str, n: int) -> list[int]:
  """The newest n checkpoint steps, oldest first."""
  mngr = manager(workdir, read_only=True)
  steps = sorted(mngr.all_steps())[-n:]
  mngr.close()
  return steps
