"""What the training loop reports: the progress between log lines (steps/s, tokens/s, ETA,
padding), the training metrics written to TensorBoard and the log, and the validation loss
and task metrics of an evaluation."""
import time

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from aiayn_flax import train_step
from aiayn_flax.runtime import storage_errors
from aiayn_flax.training import event_files


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


class CacheOnlyWriter:
  """The metrics' writer (TensorBoard event files in the workdir, and the log; event_files.py),
  whose event files are only a copy of what the log says: a write to them that fails (a full
  disk) warns once and the run goes on, writing the log alone."""

  def __init__(self, workdir: str, just_logging: bool):
    self.workdir = workdir
    self._writer = event_files.create_writer(workdir, just_logging=True)
    if not just_logging:
      self._call("open")

  def _call(self, name: str, *args):
    try:
      if name == "open":
        self._writer = event_files.create_writer(self.workdir)
      else:
        getattr(self._writer, name)(*args)
    except Exception as e:  # noqa: BLE001 - gcsfs and the OS raise their own error classes
      reason = storage_errors.cause(e)
      if reason is None:
        raise
      logging.warning("%s: cannot write TensorBoard's event file: %s; the metrics go on in the "
                      "log alone (%s, then restart to have them in TensorBoard again)",
                      self.workdir, reason[0], reason[1])
      self._writer = event_files.create_writer(self.workdir, just_logging=True)
      if name not in ("open", "flush"):  # the event file is written first: the log is not yet
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
