"""Orbax checkpoints of everything a resume needs, and checkpoint averaging (section 6.1).

With several processes (hosts), every one of them calls the reading functions below: which
checkpoint to read is decided once for all (`newest_readable`), so that no host resumes from
another step than its peers, and only process 0 moves the unreadable ones aside."""
import contextlib
import errno
import functools
import os
import re
import shutil
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from aiayn_flax.runtime import paths

CHECKPOINT_DIR = "checkpoints"
# Where training moves a checkpoint it cannot read (never deleted), so that the run can save
# that step again when it gets there.
UNREADABLE_DIR = "unreadable_checkpoints"
# A read that fails is tried again this many times in all, this long apart, before the
# checkpoint is called unreadable: a transient error (Cloud Storage, a busy filesystem) must not
# set a good checkpoint aside.
READ_ATTEMPTS = 3
RETRY_PAUSE_S = 1.0
# Test-only: "30,40" makes the first read of those steps' train state fail once in each process.
TEST_READ_ERROR_VARIABLE = "AIAYN_TEST_CHECKPOINT_READ_ERROR_AT"
_injected_read_errors = set()
# How long remove_unfinished waits for a failed save's folder to stay gone, and at most.
UNFINISHED_QUIET_S = 0.5
UNFINISHED_LIMIT_S = 10.0


def checkpoint_dir(workdir: str) -> epath.Path:
  return paths.workdir_path(workdir) / CHECKPOINT_DIR


def manager(workdir: str, keep: int | None = None, read_only: bool = False,
            asynchronous: bool = True) -> ocp.CheckpointManager:
  """A CheckpointManager over workdir/checkpoints. Saves are asynchronous and atomic: orbax
  writes into a temporary directory and renames it when complete, so a killed writer (or one
  whose disk filled up) never leaves a checkpoint that looks finished. A manager that writes
  removes the temporary directories an earlier run left (orbax's cleanup_tmp_directories, on
  process 0): a failed save's space comes back at the next start."""
  _save_whole_arrays_on_cpu()
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=not read_only, read_only=read_only,
      enable_async_checkpointing=asynchronous, cleanup_tmp_directories=not read_only)
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options,
                               item_names=("state", "meta"))


# Whether orbax copies an array to the host in slices (replica-parallel): None as below, False
# as on a GPU (what orbax does where JAX_PLATFORMS names one), True as orbax does on a CPU or
# TPU. Tests set it (a test cluster: tests/cluster_site/sitecustomize.py).
REPLICA_PARALLEL = None


@functools.cache
def _save_whole_arrays_on_cpu() -> None:
  """Orbax copies an array held by several devices to host memory in slices, one per device
  (replica-parallel: its default unless JAX_PLATFORMS names a GPU), which spreads the copy over the
  devices' links. CPU devices share the host's memory, so there it gains nothing and costs a
  compiled slicing program per array at a process's first save (96 programs, 3.4 s, for the toy
  model's state on 4 devices). Only how the bytes reach the host changes, not what is written.
  One process only, so that the test clusters save as a TPU pod does; a GPU cluster saves with
  it off, which tests/test_storage_failures.py runs on a CPU cluster (REPLICA_PARALLEL)."""
  if REPLICA_PARALLEL is None and (jax.default_backend() != "cpu" or jax.process_count() > 1):
    return
  if REPLICA_PARALLEL:
    return
  default = ocp.type_handlers.get_type_handler(jax.Array)
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(
          use_replica_parallel=False,
          array_metadata_store=default._array_metadata_store),  # noqa: SLF001 - kept as it was
      override=True)


def save(mngr: ocp.CheckpointManager, step: int, state, meta: dict) -> None:
  """`state`: any pytree of arrays (train state); `meta`: JSON (data position, config)."""
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                           meta=ocp.args.JsonSave(meta)))


def finished_steps(workdir: str) -> list[int]:
  """The steps of the finished checkpoints in workdir/checkpoints, read from its listing alone
  (no orbax manager, no other process: safe while a write is failing on this host only); []
  when there is none or the folder cannot be listed. On Cloud Storage, where a folder is no
  rename, a finished step is one with orbax's commit_success.txt."""
  try:
    entries = list(checkpoint_dir(workdir).iterdir())
  except OSError:
    return []
  return sorted(int(p.name) for p in entries if p.name.isdigit() and (
      not paths.is_url(p) or (p / "commit_success.txt").exists()))


def intact_text(workdir: str) -> str:
  """What a failed write leaves intact, for its one line."""
  steps = finished_steps(workdir)
  if not steps:
    return f"no checkpoint was saved in {checkpoint_dir(workdir)} yet"
  return (f"the newest intact checkpoint is step {steps[-1]} in {checkpoint_dir(workdir)} "
          f"(the same command resumes from it)")


_UNFINISHED_SAVE = re.compile(r"/checkpoints/(\d+)\.orbax-checkpoint-tmp")


def unfinished_step(workdir: str) -> int | None:
  """The step of a save begun and not finished (orbax's STEP.orbax-checkpoint-tmp* folder),
  the newest where there are several; None where there is none."""
  try:
    found = [unfinished_step_in(os.fspath(p)) for p in checkpoint_dir(workdir).iterdir()]
  except OSError:
    return None
  return max((step for step in found if step is not None), default=None)


def unfinished_step_in(path: str | None) -> int | None:
  """The step of the unfinished save that `path` is or lies in (.../checkpoints/STEP.orbax-
  checkpoint-tmp...[/FILE]), or None. Another process may have removed that folder already
  (remove_unfinished), where unfinished_step no longer finds it."""
  found = _UNFINISHED_SAVE.search(path or "")
  return int(found.group(1)) if found else None


def remove_unfinished(workdir: str) -> None:
  """Removes the temporary folders of saves that failed (orbax's NAME.orbax-checkpoint-tmp*),
  on process 0: they hold no finished checkpoint, and the space they take may be what the
  next save needs. The next run's manager would remove them too (cleanup_tmp_directories).

  Orbax's writer threads may still be failing at the same full disk after the error reached
  us, and recreate a folder just removed; so once one is removed, the listing is read again
  until it has shown none for UNFINISHED_QUIET_S (UNFINISHED_LIMIT_S at most)."""
  if jax.process_index() != 0 or paths.is_url(workdir):
    return
  deadline = time.monotonic() + UNFINISHED_LIMIT_S
  removed, quiet_since = False, None
  while time.monotonic() < deadline:
    try:
      unfinished = [p for p in checkpoint_dir(workdir).iterdir()
                    if ".orbax-checkpoint-tmp" in p.name]
    except FileNotFoundError:
      return  # no checkpoint folder yet
    except OSError as e:
      logging.warning("could not remove the unfinished saves in %s: %s",
                      checkpoint_dir(workdir), e)
      return
    if unfinished:
      for path in unfinished:
        if problem := _remove_tree(path):
          logging.warning("could not remove %s, an unfinished save: %s", path, problem)
          return
        if not removed:
          logging.warning("removed %s, the unfinished save", path)
      removed, quiet_since = True, None
    elif not removed:
      return  # nothing failed: no wait
    elif quiet_since is None:
      quiet_since = time.monotonic()
    elif time.monotonic() - quiet_since >= UNFINISHED_QUIET_S:
      return
    time.sleep(UNFINISHED_QUIET_S / 4)
  logging.warning("an unfinished save in %s was still being written after %.0f s; the next "
                  "start removes it", checkpoint_dir(workdir), UNFINISHED_LIMIT_S)


def _remove_tree(path) -> OSError | None:
  """Removes `path` and what it holds; the error that stopped it, unless the error is a sign of
  a writer still at work there (a file that vanished, a folder that filled again)."""
  errors = []

  def record(function, name, error):  # (error: the exception, or before 3.12 sys.exc_info())
    errors.append(error if isinstance(error, BaseException) else error[1])
  shutil.rmtree(path, **{"onexc" if sys.version_info >= (3, 12) else "onerror": record})
  return next((e for e in errors if getattr(e, "errno", None) not in (
      errno.ENOENT, errno.ENOTEMPTY)), None)


def checkpoint_bytes(workdir: str, abstract_state) -> int:
  """One checkpoint's size: the newest finished one's on disk, or the train state's bytes
  where there is none yet (orbax stores the arrays uncompressed)."""
  steps = finished_steps(workdir)
  if steps and not paths.is_url(workdir):
    on_disk = sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(
        os.fspath(checkpoint_dir(workdir) / str(steps[-1]))) for name in names)
    if on_disk:
      return on_disk
  return state_bytes(abstract_state)


def state_bytes(abstract_state) -> int:
  return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(abstract_state))


def free_bytes(workdir: str) -> int | None:
  """Free bytes on the workdir's filesystem (of its nearest existing parent); None on Cloud
  Storage, which has no such figure."""
  if paths.is_url(workdir):
    return None
  path = os.fspath(paths.workdir_path(workdir))
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return shutil.disk_usage(path).free


def room_needed(workdir: str, one_checkpoint: int, keep: int) -> int:
  """Bytes the run's checkpoints still need on top of those stored: `keep` of them, and one
  more while a save is written before the oldest is deleted (orbax's order)."""
  return max(1, keep + 1 - len(finished_steps(workdir))) * one_checkpoint


def room_line(workdir: str, one_checkpoint: int, keep: int) -> tuple[str, bool]:
  """(one line on the checkpoints' room, whether they fit), e.g. 'checkpoints: 5 kept x 0.78
  GB = 3.9 GB (+1 while one is written); /runs has 120.3 GB free: fits'."""
  free = free_bytes(workdir)
  one = size_text(one_checkpoint)
  text = (f"checkpoints: {keep} kept x {one} = {size_text(keep * one_checkpoint)} (+{one} while "
          "one is written)")
  if free is None:
    return f"{text}; {workdir} is on Cloud Storage (no free-space figure)", True
  needed = room_needed(workdir, one_checkpoint, keep)
  fits = free >= needed
  where = paths.workdir_path(workdir)
  return (f"{text}; {where} has {size_text(free)} free, {size_text(needed)} still needed: "
          + ("fits" if fits else "does not fit: free space there, lower "
             "--config.keep_checkpoints, or choose another --workdir")), fits


def size_text(n: int) -> str:
  """Bytes for people: "2.57 GB", "2.02 MB"."""
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if n >= scale:
      return f"{n / scale:.3g} {unit}"
  return f"{n} B"


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state):
  """(state, meta) of a step, shaped and sharded like `abstract_state`.

  Read with orbax's handlers, not `mngr.restore`: the manager's restore ends at a barrier of
  all processes, which a process whose read failed never reaches, so that the others would
  wait there for it; each process reads only its own devices' shards either way."""
  _maybe_inject_read_error(step)
  state = ocp.StandardCheckpointHandler().restore(
      _step_dir(mngr, step) / "state", args=ocp.args.StandardRestore(abstract_state))
  return state, restore_meta(mngr, step)


def restore_meta(mngr: ocp.CheckpointManager, step: int) -> dict:
  return ocp.JsonCheckpointHandler().restore(_step_dir(mngr, step) / "meta")


def _step_dir(mngr: ocp.CheckpointManager, step: int) -> epath.Path:
  return epath.Path(mngr.directory) / str(step)


def _maybe_inject_read_error(step: int) -> None:
  steps = os.environ.get(TEST_READ_ERROR_VARIABLE, "")
  if str(step) in steps.split(",") and step not in _injected_read_errors:
    _injected_read_errors.add(step)
    raise OSError(f"injected read error for step {step} ({TEST_READ_ERROR_VARIABLE})")


def abstract_of(tree):
  """ShapeDtypeStructs (with shardings) describing `tree`, for restoring into its layout."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def newest_readable(mngr: ocp.CheckpointManager, read, limit: int = 1) -> list[tuple]:
  """[(step, read(step)), ...] for the newest `limit` checkpoints that can be read, newest
  first. A failed read is retried (READ_ATTEMPTS); a checkpoint that still cannot be read (bit
  rot, a truncated or missing file) is skipped with a warning naming it and the error, and left
  where it is. [] when there is no checkpoint; a ValueError in one line when there are some but
  too few can be read.

  With several processes, all try the same steps in the same order and a step counts as read
  only when every process read it, so that all of them use the same checkpoints."""
  found, unreadable = [], []
  for step in sorted(mngr.all_steps(), reverse=True):
    if len(found) == limit:
      break
    value, reason = _read_with_retries(mngr, read, step)
    if not _failed_on_any_process(reason is not None):
      found.append((step, value))
      continue
    reason = reason or "read here, but not on another process"
    unreadable.append(f"{step} ({reason})")
    logging.warning("checkpoint %s/%d cannot be read (%s); skipped (not deleted)",
                    mngr.directory, step, reason)
  if unreadable and len(found) < limit:
    raise ValueError(f"{mngr.directory}: {len(found)} readable checkpoints where {limit} are "
                     f"needed; cannot read step {'; step '.join(unreadable)}")
  return found


def _read_with_retries(mngr, read, step: int) -> tuple:
  """(read(step), None), or (None, the last error in one line) after READ_ATTEMPTS failures."""
  for attempt in range(1, READ_ATTEMPTS + 1):
    try:
      return read(step), None
    except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise plain Exceptions here
      reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
      if attempt < READ_ATTEMPTS:
        logging.warning("reading checkpoint %s/%d failed (%s); trying again in %g s (attempt %d "
                        "of %d)", mngr.directory, step, reason, RETRY_PAUSE_S, attempt + 1,
                        READ_ATTEMPTS)
        time.sleep(RETRY_PAUSE_S)
  return None, reason


def _failed_on_any_process(failed: bool) -> bool:
  if jax.process_count() == 1:
    return failed
  return bool(np.any(multihost_utils.process_allgather(np.int32(failed))))


def set_aside(mngr: ocp.CheckpointManager, workdir: str, steps: list[int]) -> None:
  """Moves the given steps' checkpoints to workdir/unreadable_checkpoints/ (kept for
  inspection), so that training can write those steps again. Process 0 moves them; every
  process calls this, and waits until they are moved."""
  if not steps:
    return
  if jax.process_index() == 0:
    aside = paths.workdir_path(workdir) / UNREADABLE_DIR
    # A file in it makes the folder exist on Cloud Storage too, where a rename needs one.
    aside.mkdir(parents=True, exist_ok=True)
    (aside / "README.txt").write_text(
        "Checkpoints that training could not read, moved here and never deleted.\n")
    for step in steps:
      _step_dir(mngr, step).rename(aside / str(step))
      logging.warning("moved the unreadable checkpoint of step %d to %s", step, aside)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("unreadable checkpoints set aside")
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


def load_params_ending_at(workdir: str, abstract_params, step: int, n: int):
  """(params, steps): parameters averaged over the n stored checkpoints ending at `step`
  (`step` and the n - 1 before it), and their steps, oldest first. A ValueError in one line
  listing the stored steps when there is no checkpoint of `step`, or fewer than n up to it."""
  with _params_reader(workdir, abstract_params) as (mngr, read):
    available = sorted(mngr.all_steps())
    there = f"the steps there: {', '.join(map(str, available))}"
    if step not in available:
      raise ValueError(f"{checkpoint_dir(workdir)}: no checkpoint of step {step}; {there}")
    steps = available[:available.index(step) + 1][-n:]
    if len(steps) < n:
      raise ValueError(f"{checkpoint_dir(workdir)}: {len(steps)} checkpoints up to step {step}, "
                       f"fewer than --average_last={n}; {there}")
    return _mean([read(s) for s in steps]), steps


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
