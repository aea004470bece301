"""Resuming a run: the config fields that may change between a run and its resumption, the
parameters' digest that compares two runs, and the restore of the newest readable checkpoint."""
import hashlib
import json

import jax
import numpy as np
from absl import logging

from aiayn_flax import config_checks, sharding
from aiayn_flax.data import bucketing
from aiayn_flax.runtime import checkpoints

# Fields that may differ on resume when the batches are checked to be the same (the batch plan
# saved with each checkpoint): where the prepared tfds data lives (a bucket in place of process
# 0's boot disk, say).
SAME_BATCHES_ON_RESUME = config_checks.names_on_resume(config_checks.SAME_BATCHES)
# Fields that earlier versions saved and that no longer exist: name -> the saved value that
# resumes without a conflict (config_checks.ANY: any, the field was never read).
REMOVED_FIELDS = config_checks.removed_fields()


def config_dict(config) -> dict:
  return json.loads(config.to_json_best_effort(sort_keys=True))


def resume_conflicts(saved: dict, current: dict, prefix: str = "",
                     same_batches: bool = False, allowed: frozenset | None = None
                     ) -> list[str]:
  """Dotted names of the fields that differ and matter, e.g. ["model.d_model: 256 -> 512"];
  with `same_batches` (the run's batches are those it was trained on), not those of
  SAME_BATCHES_ON_RESUME."""
  conflicts = []
  if allowed is None:  # the top level: the fields this saved config lets change
    allowed = config_checks.names_on_resume(config_checks.FREE, saved) | (
        SAME_BATCHES_ON_RESUME if same_batches else frozenset())
  for key in sorted(set(saved) | set(current)):
    name = prefix + key
    old, new = saved.get(key, config_checks.ADDED_FIELDS.get(name)), current.get(key)
    if isinstance(old, dict) and isinstance(new, dict):
      conflicts += resume_conflicts(old, new, name + ".", same_batches, allowed)
    elif name in REMOVED_FIELDS and new is None:
      if REMOVED_FIELDS[name] is not config_checks.ANY and old != REMOVED_FIELDS[name]:
        conflicts.append(f"{name}: {old!r} -> removed (resumes only where it was "
                         f"{REMOVED_FIELDS[name]!r})")
    elif old != new and name not in allowed:
      conflicts.append(f"{name}: {old!r} -> {new!r}" + (
          " (may change where the data there gives the batches trained on, as the checkpoint "
          "records them: these differ)" if name in SAME_BATCHES_ON_RESUME else ""))
  return conflicts


def params_digest(params) -> str:
  """sha256 of the parameters (names, shapes, dtypes and bytes), to compare two runs; the same
  on every process, however the parameters are spread over the hosts."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(sharding.host_copy(params))[0]:
    array = np.ascontiguousarray(leaf)
    digest.update(f"{jax.tree_util.keystr(path)}{array.shape}{array.dtype}".encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


def restore_or_init(config, workdir, mngr, abstract_state, new_state, force_resume: bool,
                    data_shards: int, batch_plan: list[str] | None = None):
  """(state, data position): from the newest checkpoint that can be read, when there is one,
  restored into `abstract_state` (ShapeDtypeStructs with their shardings); else new_state().
  Newer ones that cannot be read are moved to workdir/unreadable_checkpoints/ (never deleted),
  with a warning naming them, so that the run can save those steps again.

  The batch list depends on the number of data shards (a batch's rows are a multiple of it),
  so the saved data position means something else on another count: that resume is refused
  (--force_resume continues anyway, from the same position of a different batch list).
  `batch_plan`: the digests of this run's batch lists, which may let SAME_BATCHES_ON_RESUME
  fields differ (checkpoints record theirs)."""
  # The small metadata first: a checkpoint of another config (other shapes) is refused in one
  # line naming the keys, before orbax would fail on its arrays' shapes.
  newest_meta = checkpoints.newest_readable(mngr, lambda step: checkpoints.restore_meta(mngr, step))
  if not newest_meta:
    return new_state(), bucketing.BatchPosition()
  saved_meta = newest_meta[0][1]
  same_batches = batch_plan is not None and saved_meta.get("batch_plan") == batch_plan
  conflicts = resume_conflicts(saved_meta["config"], config_dict(config),
                               same_batches=same_batches)
  saved_shards = saved_meta.get("data_shards", data_shards)  # older runs did not record it
  if saved_shards != data_shards:
    conflicts.append(f"data shards (the mesh's data axis): {saved_shards} -> {data_shards}, "
                     "which changes the batch list")
  if conflicts and not force_resume:
    raise ValueError(f"{mngr.directory} was trained with "
                     f"another config ({'; '.join(conflicts)}); use a fresh --workdir, or "
                     "--force_resume to continue anyway")
  [(step, (restored, meta))] = checkpoints.newest_readable(
      mngr, lambda step: checkpoints.restore(mngr, step, abstract_state))
  checkpoints.set_aside(mngr, workdir, [s for s in mngr.all_steps() if s > step])
  logging.info("Resumed from step %d of %s", step, mngr.directory)
  return restored, bucketing.BatchPosition(**meta["position"])
