"""Room for checkpoints: the dry run's line on them (how often, how many, their bytes, and
whether they fit), the free-space check at a run's start, and the check before each save."""
import jax
from absl import logging

from aiayn_flax import train_step
from aiayn_flax.runtime import checkpoints, host_agreement, storage_errors


def planned_checkpoints_line(config, workdir: str | None) -> tuple[str, bool]:
  """(the dry run's line on checkpoints: how often, how many kept, their bytes, and with a
  workdir whether they fit in its free space; whether they fit)."""
  model = train_step.make_model(config)
  abstract = jax.eval_shape(lambda: train_step.create_train_state(config, model))
  keep = max(config.keep_checkpoints, config.average_last_checkpoints)
  minutes, steps = config.get("checkpoint_every_minutes", 0), config.checkpoint_every_steps
  every = " and ".join(([f"{minutes:g} minutes"] if minutes else [])
                       + ([f"{steps} steps"] if steps else []))
  if not workdir:
    one = checkpoints.state_bytes(abstract)
    size = checkpoints.size_text
    return (f"checkpoints every {every}: {keep} kept x {size(one)} = {size(keep * one)} "
            f"(+{size(one)} while one is written); add --workdir=DIR to check its free space"), True
  line, fits = checkpoints.room_line(workdir, checkpoints.checkpoint_bytes(workdir, abstract),
                                     keep)
  return line.replace("checkpoints:", f"checkpoints every {every}:", 1), fits


def check_room(workdir: str, abstract_state, keep: int) -> int:
  """One checkpoint's bytes, after saying in one line (the log) whether the checkpoints kept
  fit in the workdir's free space: a warning when they do not, WriteFailed when not even the
  next one does (rather than after hours of training)."""
  one_checkpoint = checkpoints.checkpoint_bytes(workdir, abstract_state)
  why_not = None
  if jax.process_index() == 0:  # (every host sees the workdir: the lease showed it)
    line, fits = checkpoints.room_line(workdir, one_checkpoint, keep)
    (logging.info if fits else logging.warning)("%s", line)
    free = checkpoints.free_bytes(workdir)
    if free is not None and free < one_checkpoint:
      why_not = storage_errors.one_line(
          checkpoints.checkpoint_dir(workdir),
          (f"the disk is too full for one checkpoint ({checkpoints.size_text(free)} free, "
           f"{checkpoints.size_text(one_checkpoint)} needed)", "free space there"),
          checkpoints.intact_text(workdir))
  host_agreement.stop_if_any_failed("the workdir's free space", why_not)
  if why_not:
    raise storage_errors.WriteFailed(why_not)
  return one_checkpoint


def cannot_save(workdir: str, one_checkpoint: int, step: int) -> str | None:
  """Why this process cannot write its part of a checkpoint now (one line), or None: its
  share of the bytes does not fit in the free space, or a small file cannot be written in the
  checkpoint folder (read-only, no permission, vanished)."""
  free = checkpoints.free_bytes(workdir)
  share = one_checkpoint // jax.process_count()
  intact = checkpoints.intact_text(workdir)
  if free is not None and free < share:
    return storage_errors.one_line(
        checkpoints.checkpoint_dir(workdir) / str(step),
        (f"the disk is full ({checkpoints.size_text(free)} free where the checkpoint of step "
         f"{step} needs {checkpoints.size_text(share)})", "free space there"), intact)
  probe = checkpoints.checkpoint_dir(workdir) / f".write_check.{jax.process_index()}"
  try:
    probe.write_bytes(b"a checkpoint is about to be written here\n")
    probe.unlink()
  except OSError as e:
    failure = storage_errors.write_failure(e, probe, intact)
    if failure is None:
      raise
    return str(failure)
  return None
