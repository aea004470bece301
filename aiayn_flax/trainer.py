"""The training loop: config -> data -> model -> state -> loop, each step a named function."""
import contextlib
import hashlib
import json
import time

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from clu import metric_writers
from etils import epath

from aiayn_flax import (checkpoints, config_checks, host_agreement, paths, process_zero,
                        provenance, sharding, stops, storage_errors, tasks, train_step,
                        workdir_lease)
from aiayn_flax.data import bucketing, pipeline, prefetch
from aiayn_flax.programs import training_programs
from aiayn_flax.translator import Translator

# Config fields that may differ between a run and its resumption: they change neither the
# model, nor the optimizer, nor the batches it sees.
SAFE_TO_CHANGE_ON_RESUME = frozenset({
    "name", "num_train_steps", "log_every_steps", "eval_every_steps", "checkpoint_every_steps",
    "checkpoint_every_minutes",
    "keep_checkpoints", "eval_decode_sentences", "beam_size", "length_penalty_alpha",
    "decode_extra_length", "decode_batch_size", "decode_constrained", "average_last_checkpoints",
    "max_consecutive_nonfinite_steps", "device", "num_devices", "mfu",
    "checkpoint_asynchronously", "needs_accelerator", "dataset.test_split", "prefetch_batches",
    "compilation_cache_dir", "host_local_batches",
    "dcn_mesh"})  # dcn_mesh: where devices sit, not what they do
# Fields that may differ on resume when the batches are checked to be the same (the batch plan
# saved with each checkpoint): where the prepared tfds data lives (a bucket in place of process
# 0's boot disk, say).
SAME_BATCHES_ON_RESUME = frozenset({"dataset.data_dir"})
# Fields that earlier versions saved and that no longer exist (they were never read): a run
# that saved them resumes without a conflict.
REMOVED_FIELDS = frozenset({"weight_decay", "dataset.shuffle_buffer",
                            "eval_bleu_sentences"})  # renamed eval_decode_sentences


class NonFiniteTrainingError(RuntimeError):
  pass


# The trainer's clock for checkpoints by time (config.checkpoint_every_minutes); tests replace it.
clock = time.monotonic


def config_dict(config) -> dict:
  return json.loads(config.to_json_best_effort(sort_keys=True))


def resume_conflicts(saved: dict, current: dict, prefix: str = "",
                     same_batches: bool = False) -> list[str]:
  """Dotted names of the fields that differ and matter, e.g. ["model.d_model: 256 -> 512"];
  with `same_batches` (the run's batches are those it was trained on), not those of
  SAME_BATCHES_ON_RESUME."""
  conflicts = []
  allowed = SAFE_TO_CHANGE_ON_RESUME | REMOVED_FIELDS | (
      SAME_BATCHES_ON_RESUME if same_batches else frozenset())
  for key in sorted(set(saved) | set(current)):
    name = prefix + key
    old, new = saved.get(key, config_checks.ADDED_FIELDS.get(name)), current.get(key)
    if isinstance(old, dict) and isinstance(new, dict):
      conflicts += resume_conflicts(old, new, name + ".", same_batches)
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


def real_tokens(batch: dict) -> int:
  return int(np.count_nonzero(batch["inputs"]) + np.count_nonzero(batch["targets"]))


class Progress:
  """Host-side figures between log lines: steps/s, real tokens/s, ETA, and the real tokens
  per optimizer step (per side) and padding of the batches trained on. `rows_split`: each host
  counts only its rows, and the counts are summed over the hosts at each update."""

  def __init__(self, start_step: int, total_steps: int, rows_split: bool = False):
    self.total_steps, self.rows_split = total_steps, rows_split
    self.last_step, self.last_time = start_step, time.time()
    self.sources = self.targets = self.slots = 0

  def add(self, batch: dict) -> None:
    self.sources += int(np.count_nonzero(batch["inputs"]))
    self.targets += int(np.count_nonzero(batch["targets"]))
    self.slots += batch["inputs"].size + batch["targets"].size

  def update(self, step: int) -> dict:
    now = time.time()
    elapsed = max(now - self.last_time, 1e-9)
    steps = max(step - self.last_step, 1)
    steps_per_s = (step - self.last_step) / elapsed
    if self.rows_split and jax.process_count() > 1:  # one small gather per log line
      self.sources, self.targets, self.slots = (int(n) for n in np.sum(
          multihost_utils.process_allgather(
              np.array([self.sources, self.targets, self.slots], np.int64)), axis=0))
    real = self.sources + self.targets
    rates = {"steps_per_s": steps_per_s, "tokens_per_s": real / elapsed,
             "eta_s": (self.total_steps - step) / max(steps_per_s, 1e-9),
             "source_tokens_per_step": self.sources / steps,
             "target_tokens_per_step": self.targets / steps,
             "padding": 1 - real / max(self.slots, 1)}
    self.last_step, self.last_time = step, now
    self.sources = self.targets = self.slots = 0
    return rates


class RunsOfOneShape:
  """Takes (position, batch) pairs from a batch stream in runs of consecutive batches of one
  shape, for `train_step.train_steps`; a batch of another shape waits for the next run."""

  def __init__(self, stream):
    self._stream, self._waiting = stream, None

  def take(self, limit: int) -> list[tuple]:
    run = []
    while len(run) < limit:
      item = self._waiting or next(self._stream)
      self._waiting = None
      if run and _shapes(item[1]) != _shapes(run[0][1]):
        self._waiting = item
        break
      run.append(item)
    return run


def _shapes(batch: dict) -> tuple:
  """Every array's shape: with each side padded to its own length (dataset.pad_each_side),
  two batches of one source shape may differ in their targets'."""
  return tuple((key, np.shape(value)) for key, value in sorted(batch.items()))


def stack_batches(batches: list[dict], size: int) -> dict:
  """[size, rows, length] arrays: the batches, then all-padding batches (never trained on)."""
  return {key: np.stack([b[key] for b in batches]
                        + [np.zeros_like(batches[0][key])] * (size - len(batches)))
          for key in batches[0]}


def steps_to_next_event(step: int, config) -> int:
  """Steps until the next log line, checkpoint, evaluation or the end of training."""
  return min([config.num_train_steps - step]
             + [every - step % every for every in (config.log_every_steps,
                                                   config.checkpoint_every_steps,
                                                   config.eval_every_steps) if every])


def evaluate_loss(eval_fn, params, batches, input_rows) -> dict:
  sums = None
  for _, batch in batches.iterate(num_epochs=1, rows_of=input_rows.rows_of):
    metrics = eval_fn(params, input_rows.put(batch))
    sums = metrics if sums is None else jax.tree.map(np.add, sums, metrics)
  return train_step.summarize(jax.device_get(sums))


def evaluate_translations(translator, params, sources, references, task) -> dict:
  """The task's metrics of greedy-decoded validation sentences: BLEU (sacreBLEU) and exact
  match (the toy task's metric) for translation, EVALB F1 for parsing (aiayn_flax/tasks/).
  The translator places the parameters whole on every device (once, not per batch) and splits
  each batch's rows over all of them (translator.py); that copy is dropped once they are
  decoded, so that it does not hold a whole model on every device through training (what FSDP
  or a `model` axis saved)."""
  translator.params = params
  try:
    return task.validation_metrics(sources, translator.translate(sources), references)
  finally:
    translator.params = None


class InputRows:
  """Which rows of each batch this host builds, and how they reach the devices: its own rows
  (config.host_local_batches, the default) or, to check against, every row of the batch."""

  def __init__(self, mesh, host_local: bool):
    self.batch_sharding = sharding.batch_sharding(mesh)
    self.stacked_sharding = sharding.stacked_batch_sharding(mesh)
    self.host_local = host_local
    self.rows_of = (lambda rows: sharding.process_row_indices(self.batch_sharding, rows)
                    ) if host_local else None

  def put(self, batch: dict) -> dict:
    if self.host_local:
      return sharding.put_process_rows(batch, self.batch_sharding)
    return sharding.put_batch(batch, self.batch_sharding)

  def put_stacked(self, stacked: dict) -> dict:
    if self.host_local:
      return sharding.put_process_rows(stacked, self.stacked_sharding, row_axis=1)
    return sharding.put_batch(stacked, self.stacked_sharding)


def restore_or_init(config, workdir, mngr, state, force_resume: bool, data_shards: int,
                    batch_plan: list[str] | None = None):
  """(state, data position): from the newest checkpoint that can be read, when there is one.
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
    return state, bucketing.BatchPosition()
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
  abstract = checkpoints.abstract_of(state)
  [(step, (restored, meta))] = checkpoints.newest_readable(
      mngr, lambda step: checkpoints.restore(mngr, step, abstract))
  checkpoints.set_aside(mngr, workdir, [s for s in mngr.all_steps() if s > step])
  logging.info("Resumed from step %d of %s", step, mngr.directory)
  return restored, bucketing.BatchPosition(**meta["position"])


def train_and_evaluate(config, workdir: str, force_resume: bool = False) -> dict:
  """Trains `config` in `workdir`, resuming from its latest checkpoint. Returns final metrics,
  with the final parameters' digest. Refuses a workdir that a live run holds.

  A write that fails for a reason of storage (a full disk, a read-only or vanished workdir, a
  bucket that refuses it: the lease, the vocabulary, a checkpoint) stops the run with
  storage_errors.WriteFailed, one line naming the path, the cause, the newest intact
  checkpoint and what to do; the libraries' tracebacks go to the debug log (-v 1)."""
  config_checks.check_config(config)
  with storage_errors.library_tracebacks_to_debug_log():
    opened = []  # the run's checkpoint manager, once there is one
    try:
      return _held_and_checked(config, workdir, force_resume, opened)
    except Exception as e:
      if storage_errors.cause(e):  # orbax's threads end here, their errors off the terminal
        for mngr in opened:
          _close_quietly(mngr)
      unfinished = checkpoints.unfinished_step(workdir)  # a save that failed mid-way
      failure = storage_errors.write_failure(
          e, checkpoints.checkpoint_dir(workdir) / str(unfinished) if unfinished is not None
          else checkpoints.checkpoint_dir(workdir), checkpoints.intact_text(workdir),
          name_where=unfinished is not None)
      if failure is None or isinstance(e, (process_zero.ProcessZeroFailed,
                                           host_agreement.AnotherHostFailed)):
        raise  # (another process's failure is one line already: it names that process)
      checkpoints.remove_unfinished(workdir)
      storage_errors.stopping()
      raise failure from e


def _close_quietly(mngr) -> None:
  try:
    mngr.close()
  except Exception as e:  # noqa: BLE001 - the run is stopping on an error raised already
    logging.debug("closing the checkpoint manager after the error: %s", e)


def _held_and_checked(config, workdir: str, force_resume: bool, opened: list) -> dict:
  with workdir_lease.held(workdir) as lease:  # one run per workdir (process 0 holds it)
    # Before any host reads data: the hosts must share the workdir (the vocabulary, the token
    # cache and the checkpoints are there), which they do if all see process 0's lease.
    # And they must train the same config: checked now, as a config that tokenizes otherwise
    # would stop one host alone at the token cache.
    seen = workdir_lease.read_lease(paths.workdir_path(workdir) / workdir_lease.LEASE_FILENAME)
    host_agreement.check({
        "view of the workdir's run.lease": (seen or {}).get("run"),
        "config": config_dict(config)}, {
        "view of the workdir's run.lease": f"{workdir} must be one folder that every host of "
        "the run sees (gs://BUCKET/..., or a filesystem all hosts mount), not a local disk"})
    return _train_and_evaluate(config, workdir, force_resume, lease, opened)


def _train_and_evaluate(config, workdir: str, force_resume: bool,
                        lease: workdir_lease.Lease | None, opened: list) -> dict:
  workdir = str(paths.workdir_path(workdir))  # a local folder or gs://bucket/run
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  mesh = sharding.make_mesh(config.mesh, dcn_spec=config.dcn_mesh)
  input_rows = InputRows(mesh, config.host_local_batches)
  logging.info("devices: %s; mesh: %s", jax.devices(), dict(mesh.shape))

  task = tasks.for_config(config)
  vocab = pipeline.vocabulary_for(config, workdir, task)
  data_shards = sharding.data_parallel_size(mesh)
  accumulation = train_step.accumulation_steps(config, data_shards)
  steps_per_call = config.steps_per_call
  if steps_per_call < 1 or (steps_per_call > 1 and accumulation > 1):
    raise ValueError(f"config.steps_per_call={steps_per_call}: must be >= 1, and 1 when a step "
                     f"accumulates micro-batches ({accumulation} here, from "
                     "micro_batch_tokens_per_device)")
  micro_config = config.copy_and_resolve_references()
  # Rounded down, so that a micro-batch's padded budget stays within
  # micro_batch_tokens_per_device x data shards.
  micro_config.tokens_per_batch = config.tokens_per_batch // accumulation
  logging.info("%d micro-batch(es) of about %d real tokens per side (at most %d padded) per "
               "optimizer step", accumulation, micro_config.tokens_per_batch,
               bucketing.padded_budget(micro_config.tokens_per_batch))
  train_batches = pipeline.batches_for_split(micro_config, vocab, config.dataset.train_split,
                                             data_shards, shuffle=True, task=task,
                                             group=steps_per_call)
  # Evaluation batches hold no more than training's micro-batches: a run whose device fits
  # only a micro-batch must not run out of memory at its first evaluation.
  eval_batches = pipeline.batches_for_split(micro_config, vocab, config.dataset.eval_split,
                                            data_shards, shuffle=False, task=task)
  source_tokens, target_tokens, padding = train_batches.epoch_summary()
  logging.info("training batches: %.0f source and %.0f target real tokens per batch on average "
               "(tokens_per_batch %d), %.1f%% of their positions padding", source_tokens,
               target_tokens, micro_config.tokens_per_batch, 100 * padding)

  model = train_step.make_model(config)
  keep = max(config.keep_checkpoints, config.average_last_checkpoints)
  checkpoints.remove_unfinished(workdir)  # a failed save's folder: its space is needed now
  mngr = checkpoints.manager(workdir, keep=keep, asynchronous=config.checkpoint_asynchronously)
  opened.append(mngr)
  batch_plan = [train_batches.plan_digest(), eval_batches.plan_digest()]
  host_agreement.check({  # or every host stops, naming the first difference
      "vocabulary": host_agreement.file_digest(getattr(vocab, "model_path", None)),
      "batch plan": batch_plan,
      "checkpoint steps": sorted(mngr.all_steps())})
  new_state = lambda: train_step.create_train_state(config, model)  # noqa: E731
  abstract_state = jax.eval_shape(new_state)
  one_checkpoint = check_room(workdir, abstract_state, keep)
  state_sharding = sharding.train_state_shardings(
      mesh, abstract_state, train_step.logical_param_specs(model), config.fsdp)
  state = jax.jit(new_state, out_shardings=state_sharding)()
  state, position = restore_or_init(config, workdir, mngr, state, force_resume, data_shards,
                                    batch_plan)

  programs = training_programs(config, model, mesh, state_sharding)
  rng = train_step.dropout_key(config.seed)
  num_bleu = task.validation_sentences(config)
  if num_bleu:
    bleu_sources, bleu_references = process_zero.read_once(  # hosts' disks may differ
        "validation text", lambda: [lines[:num_bleu] for lines in task.sources_and_references(
            config, config.dataset.eval_split)])
    translator = Translator(model, None, vocab, beam_size=1,
                            extra_length=config.decode_extra_length,
                            # per device: over every device (the translator's mesh)
                            batch_size=sharding.over_decoding_devices(
                                config.decode_batch_size),
                            constraint_for=task.decoding_constraint(vocab))
  # Simulated CPU devices can deadlock on collectives dispatched far ahead; wait for each step.
  wait_each_step = jax.default_backend() == "cpu" and jax.device_count() > 1

  writer = CacheOnlyWriter(workdir, just_logging=jax.process_index() > 0)
  if jax.process_index() == 0:
    writer.write_hparams({"config": config.to_json_best_effort(sort_keys=True)})
    logging.info("TensorBoard: tensorboard --logdir %s", workdir)

  run_meta = {"data_shards": data_shards, "batch_plan": batch_plan,
              "config": config_dict(config),
              "versions": provenance.software_versions()}

  def save(step):
    # Not into a workdir that another run has taken over (this one's heartbeat went stale):
    # process 0 reads the lease, and every process stops with its verdict (LeaseLost there).
    try:
      process_zero.read_once("the workdir's lease", lambda: lease and lease.check_still_ours())
    except Exception:
      mngr.wait_until_finished()  # a checkpoint begun while this run held the workdir
      raise
    # Every host stops here, in one line, when one cannot write its part: not inside orbax,
    # where the others would wait for it at a barrier.
    why_not = cannot_save(workdir, one_checkpoint, step)
    host_agreement.stop_if_any_failed(f"the checkpoint of step {step}", why_not)
    if why_not:
      mngr.wait_until_finished()  # the checkpoint before, if it is still being written
      raise storage_errors.WriteFailed(why_not)
    checkpoints.save(mngr, step, state, {"position": position.__dict__} | run_meta)
    nonlocal last_save
    last_save = clock()

  step = start_step = int(state.step)
  last_save = clock()
  by_minutes = config.get("checkpoint_every_minutes", 0) * 60
  progress = Progress(step, config.num_train_steps, rows_split=input_rows.host_local)
  sums, summary = None, {}
  stopped_by = None
  with stops.StopSignals() as signals, contextlib.closing(prefetch.prefetched(
      train_batches.iterate(position, rows_of=input_rows.rows_of),
      config.prefetch_batches)) as batches:
    stop_agreement = stops.StopAgreement(
        signals, wait=wait_each_step, lease_lost=lease.lost if lease else None,
        checkpoint_due=(lambda: clock() - last_save >= by_minutes) if by_minutes else None)
    runs = RunsOfOneShape(batches)
    while step < config.num_train_steps:
      if steps_per_call > 1:  # up to steps_per_call steps of one shape, stopping at events
        run = runs.take(min(steps_per_call, steps_to_next_event(step, config)))
        position = run[-1][0]
        for _, batch in run:
          progress.add(batch)
        stacked = stack_batches([batch for _, batch in run], steps_per_call)
        state, metrics = programs.steps_fn(state, input_rows.put_stacked(stacked), len(run),
                                           rng)
        step += len(run)
      elif accumulation == 1:
        position, batch = next(batches)
        progress.add(batch)
        state, metrics = programs.step_fn(state, input_rows.put(batch), rng)
        step += 1
      else:  # sum gradients over micro-batches, then one update per real target token
        accumulated = None
        for micro_step in range(accumulation):
          position, batch = next(batches)
          progress.add(batch)
          accumulated = programs.accumulate_fn(
              accumulated, state.params, input_rows.put(batch), rng, state.step, micro_step)
          if wait_each_step:
            jax.block_until_ready(accumulated)
        state, metrics = programs.apply_fn(state, *accumulated)
        step += 1
      if wait_each_step:
        jax.block_until_ready(state)
      sums = metrics if sums is None else jax.tree.map(jax.numpy.add, sums, metrics)
      last = step == config.num_train_steps

      if step % config.log_every_steps == 0 or last:
        summary = log_train_metrics(writer, step, config, jax.device_get(sums), progress, state)
        sums = None
        if summary["consecutive_nonfinite_steps"] >= config.max_consecutive_nonfinite_steps:
          mngr.wait_until_finished()
          raise NonFiniteTrainingError(
              f"step {step}: {summary['consecutive_nonfinite_steps']} consecutive steps with a "
              f"non-finite loss or gradient (none was applied); the last good checkpoint is step "
              f"{mngr.latest_step()} in {mngr.directory}")

      stopped_by = stop_agreement.poll(step)
      if stopped_by == stops.LEASE_LOST:  # another run owns the workdir now: save nothing
        mngr.wait_until_finished()  # a checkpoint begun while this run held it
        raise workdir_lease.lost_error(lease)
      by_steps = config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0
      if by_steps or stop_agreement.checkpoint_due or last or stopped_by:
        save(step)
      if stopped_by:
        mngr.wait_until_finished()
        logging.warning("%s: saved a checkpoint at step %d in %s; run the same command to "
                        "continue", stopped_by, step, mngr.directory)
        break

      if step % config.eval_every_steps == 0 or last:
        evaluation = {f"valid/{k}": v for k, v in evaluate_loss(
            programs.eval_fn, state.params, eval_batches, input_rows).items()}
        if num_bleu:
          evaluation |= {f"valid/{k}": v for k, v in evaluate_translations(
              translator, state.params, bleu_sources, bleu_references, task).items()}
        writer.write_scalars(step, evaluation)
        logging.info("step %d: %s", step, " ".join(f"{k} {v:.4g}" for k, v in evaluation.items()))
        summary |= evaluation
        progress.last_time = time.time()  # evaluation time is not training time

  mngr.wait_until_finished()
  mngr.close()
  writer.flush()
  return summary | {"start_step": start_step, "step": step, "stopped_by": stopped_by,
                    "params_digest": params_digest(state.params)}


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


class CacheOnlyWriter:
  """clu's default writer (TensorBoard event files in the workdir, and the log), whose event
  files are only a copy of what the log says: a write to them that fails (a full disk) warns
  once and the run goes on, writing the log alone."""

  def __init__(self, workdir: str, just_logging: bool):
    self.workdir = workdir
    self._writer = metric_writers.create_default_writer(workdir, just_logging=just_logging)

  def _call(self, name: str, *args):
    try:
      getattr(self._writer, name)(*args)
    except Exception as e:  # noqa: BLE001 - TensorFlow raises its own error classes
      reason = storage_errors.cause(e)
      if reason is None:
        raise
      logging.warning("%s: cannot write TensorBoard's event file: %s; the metrics go on in the "
                      "log alone (%s, then restart to have them in TensorBoard again)",
                      self.workdir, reason[0], reason[1])
      self._writer = metric_writers.LoggingWriter()
      if name != "flush":
        getattr(self._writer, name)(*args)

  def write_hparams(self, hparams):
    self._call("write_hparams", hparams)

  def write_scalars(self, step, scalars):
    self._call("write_scalars", step, scalars)

  def flush(self):
    self._call("flush")


def log_train_metrics(writer, step, config, sums, progress, state) -> dict:
  """Averages since the last log line, written to TensorBoard and the log."""
  steps = step - progress.last_step
  summary = train_step.summarize(sums) | {
      "learning_rate": float(sums["learning_rate"]) / steps,
      "grad_norm": float(sums["grad_norm"]) / steps,
      "consecutive_nonfinite_steps": int(state.opt_state.notfinite_count),
      "skipped_nonfinite_steps": int(state.opt_state.total_notfinite)}
  summary |= progress.update(step)
  writer.write_scalars(step, {f"train/{k}": v for k, v in summary.items()})
  logging.info("step %d/%d: loss %.3f nll %.3f ppl %.2f lr %.2e | %.2f steps/s %.0f tokens/s "
               "| %.0f/%.0f real tokens/step, %.0f%% padding | ETA %.0f min%s", step,
               config.num_train_steps, summary["loss"], summary["nll"], summary["perplexity"],
               summary["learning_rate"], summary["steps_per_s"], summary["tokens_per_s"],
               summary["source_tokens_per_step"], summary["target_tokens_per_step"],
               100 * summary["padding"], summary["eta_s"] / 60,
               f" | {summary['skipped_nonfinite_steps']} non-finite steps skipped"
               if summary["skipped_nonfinite_steps"] else "")
  return summary
