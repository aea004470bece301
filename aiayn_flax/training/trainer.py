"""The training loop: config -> data -> model -> state -> loop, each step a named function.

What it reports is in metrics.py, resuming in resume.py, the checks on checkpoints' room in
checkpoint_room.py."""
import contextlib
import time

import jax
import numpy as np
from absl import logging
from etils import epath

from aiayn_flax import config_checks, devices, sharding, tasks, train_step
from aiayn_flax.data import pipeline, prefetch
from aiayn_flax.planning import run_plan
from aiayn_flax.programs import training_programs
from aiayn_flax.translator import Translator
from aiayn_flax.runtime import (checkpoints, host_agreement, paths, process_zero, provenance,
                                stops, storage_errors, workdir_lease)
from aiayn_flax.training.checkpoint_room import cannot_save, check_room
# Called through this module's names, which tests replace (log_train_metrics, evaluate_loss)
from aiayn_flax.training.metrics import (CacheOnlyWriter, Progress, evaluate_loss,
                                         evaluate_translations, log_train_metrics)
from aiayn_flax.training.resume import config_dict, params_digest, restore_or_init


class NonFiniteTrainingError(RuntimeError):
  pass


# The trainer's clock for checkpoints by time (config.checkpoint_every_minutes); tests replace it
# (a test cluster's hosts each read a clock of their own: tests/cluster_site/sitecustomize.py).
clock = time.monotonic


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


def train_and_evaluate(config, workdir: str, force_resume: bool = False) -> dict:
  """Trains `config` in `workdir`, resuming from its latest checkpoint. Returns final metrics,
  with the final parameters' digest. Refuses a workdir that a live run holds.

  A write that fails for a reason of storage (a full disk, a read-only or vanished workdir, a
  bucket that refuses it: the lease, the vocabulary, a checkpoint) stops the run with
  storage_errors.WriteFailed, one line naming the path, the cause, the newest intact
  checkpoint and what to do; the libraries' tracebacks go to the debug log (-v 1)."""
  config_checks.check_config(config)
  # On several hosts, one that stops alone (its part of a save failed) ends the others too,
  # wherever they wait for it (inside orbax, in a collective): host_agreement.peers_watched.
  with storage_errors.library_tracebacks_to_debug_log(), host_agreement.peers_watched(
      "train.py"):
    opened = []  # the run's checkpoint manager, once there is one
    try:
      return _held_and_checked(config, workdir, force_resume, opened)
    except Exception as e:
      unfinished = checkpoints.unfinished_step(workdir)  # a save that failed mid-way
      if unfinished is None:  # its folder already removed by process 0: the path says which
        unfinished = checkpoints.unfinished_step_in(storage_errors.failed_path(e))
      failure = storage_errors.write_failure(
          e, checkpoints.checkpoint_dir(workdir) / str(unfinished) if unfinished is not None
          else checkpoints.checkpoint_dir(workdir), checkpoints.intact_text(workdir),
          name_where=unfinished is not None)
      another_host = isinstance(e, (process_zero.ProcessZeroFailed,
                                    host_agreement.AnotherHostFailed))
      if failure is None and not another_host:
        raise
      # Before anything that may wait: the other hosts may be waiting for this one inside
      # orbax (a save whose part failed here alone); they stop with this line.
      host_agreement.say_stopped(None if another_host else str(failure))
      if storage_errors.cause(e):  # orbax's threads end here, their errors off the terminal
        for mngr in opened:
          _close_quietly(mngr)
      # This process's orbax threads may still be failing at the same full disk after its
      # one line: their records go to the debug log, so that the line stays the last.
      storage_errors.stopping()
      if another_host:
        raise  # (another process's failure is one line already: it names that process)
      checkpoints.remove_unfinished(workdir)
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
  # The mesh, the micro-batches that fit the devices, the forms that compiled: decided once.
  plan = run_plan.for_training(config)
  config, mesh, micro_config = plan.config, plan.mesh, plan.micro_config
  data_shards, accumulation = plan.data_shards, plan.accumulation
  steps_per_call = config.steps_per_call
  input_rows = InputRows(mesh, config.host_local_batches)

  task = tasks.for_config(config)
  vocab = pipeline.vocabulary_for(config, workdir, task)
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
  abstract_state, logical_specs = train_step.state_shapes_and_logical_specs(config, model)
  one_checkpoint = check_room(workdir, abstract_state, keep)
  state_sharding = sharding.train_state_shardings(mesh, abstract_state, logical_specs,
                                                  config.fsdp)
  # Created only where no checkpoint is restored: a resumed run neither compiles nor holds a
  # fresh state beside the one it reads.
  new_state = lambda: train_step.create_train_state(config, model, abstract_state.tx)  # noqa: E731
  state, position = restore_or_init(
      config, workdir, mngr, sharding.placed(abstract_state, state_sharding),
      lambda: devices.call_once(new_state, mesh.devices.flat[0].platform,
                                out_shardings=state_sharding),
      force_resume, data_shards, batch_plan)

  programs = training_programs(config, model, mesh, state_sharding)
  rng = train_step.dropout_key(config.seed)
  # With eval_every_steps 0 nothing is decoded: no validation text read, no translator.
  num_bleu = task.validation_sentences(config) if config.eval_every_steps else 0
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

      if config.eval_every_steps and (step % config.eval_every_steps == 0 or last):
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
