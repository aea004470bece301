"""The training loop: config -> data -> model -> state -> loop, each step a named function."""
import functools
import json
import os
import time

import jax
import numpy as np
from absl import logging
from clu import metric_writers

from aiayn_flax import checkpoints, optimizer, scoring, sharding, train_step
from aiayn_flax.data import bucketing, pipeline
from aiayn_flax.translator import Translator


def config_to_json(config) -> str:
  return config.to_json_best_effort(sort_keys=True)


def real_tokens(batch: dict) -> int:
  return int(np.count_nonzero(batch["inputs"]) + np.count_nonzero(batch["targets"]))


class Progress:
  """Host-side rates between log lines: steps/s, real tokens/s, ETA."""

  def __init__(self, start_step: int, total_steps: int):
    self.total_steps = total_steps
    self.last_step, self.last_time, self.tokens = start_step, time.time(), 0

  def update(self, step: int) -> dict:
    now = time.time()
    elapsed = max(now - self.last_time, 1e-9)
    steps_per_s = (step - self.last_step) / elapsed
    rates = {"steps_per_s": steps_per_s, "tokens_per_s": self.tokens / elapsed,
             "eta_s": (self.total_steps - step) / max(steps_per_s, 1e-9)}
    self.last_step, self.last_time, self.tokens = step, now, 0
    return rates


def evaluate_loss(eval_fn, params, batches, batch_sharding) -> dict:
  sums = None
  for _, batch in batches.iterate(num_epochs=1):
    metrics = eval_fn(params, jax.device_put(batch, batch_sharding))
    sums = metrics if sums is None else jax.tree.map(np.add, sums, metrics)
  return train_step.summarize(jax.device_get(sums))


def evaluate_translations(translator, params, sources, references) -> dict:
  """Greedy-decoded validation BLEU (sacreBLEU), and exact match (the toy task's metric)."""
  translator.params = params
  hypotheses = translator.translate(sources)
  exact = float(np.mean([h == r for h, r in zip(hypotheses, references)]))
  return {"bleu": scoring.sacrebleu_scores(hypotheses, references)["bleu"]["score"],
          "exact_match": exact}


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains `config` in `workdir`, resuming from its latest checkpoint. Returns final metrics."""
  os.makedirs(workdir, exist_ok=True)
  mesh = sharding.make_mesh(config.mesh)
  batch_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  logging.info("devices: %s; mesh: %s", jax.devices(), dict(mesh.shape))

  vocab = pipeline.vocabulary_for(config, workdir)
  data_shards = sharding.data_parallel_size(mesh)
  train_batches = pipeline.batches_for_split(config, vocab, config.dataset.train_split,
                                             data_shards, shuffle=True)
  eval_batches = pipeline.batches_for_split(config, vocab, config.dataset.eval_split,
                                            data_shards, shuffle=False)
  logging.info("training batches pad %.1f%% of their positions",
               100 * train_batches.padding_fraction())

  model = train_step.make_model(config)
  state = jax.device_put(train_step.create_train_state(config, model), replicated)
  mngr = checkpoints.manager(workdir, keep=max(config.keep_checkpoints,
                                               config.average_last_checkpoints))
  position = bucketing.BatchPosition()
  if mngr.latest_step() is not None:
    state, meta = checkpoints.restore(mngr, mngr.latest_step(), checkpoints.abstract_of(state))
    position = bucketing.BatchPosition(**meta["position"])
    logging.info("Resumed from step %d of %s", int(state.step), checkpoints.checkpoint_dir(workdir))

  schedule = optimizer.learning_rate_schedule(config)
  step_fn = jax.jit(
      functools.partial(train_step.train_step, model=model,
                        label_smoothing=config.label_smoothing, schedule=schedule),
      in_shardings=(replicated, batch_sharding, replicated), out_shardings=(replicated, replicated),
      donate_argnums=0)
  eval_fn = jax.jit(functools.partial(train_step.eval_step, model=model,
                                      label_smoothing=config.label_smoothing))
  rng = train_step.dropout_key(config.seed)
  num_bleu = config.eval_bleu_sentences or (
      config.dataset.toy_eval_examples if config.dataset.name == "toy_reverse" else 0)
  if num_bleu:
    bleu_sources, bleu_references = (
        lines[:num_bleu] for lines in pipeline.text_pairs(config, config.dataset.eval_split))
    translator = Translator(model, None, vocab, beam_size=1,
                            extra_length=config.decode_extra_length,
                            batch_size=config.decode_batch_size)
  # Simulated CPU devices can deadlock on collectives dispatched far ahead; wait for each step.
  wait_each_step = jax.default_backend() == "cpu" and jax.device_count() > 1

  writer = metric_writers.create_default_writer(workdir, just_logging=jax.process_index() > 0)
  if jax.process_index() == 0:
    writer.write_hparams({"config": config_to_json(config)})
    logging.info("TensorBoard: tensorboard --logdir %s", os.path.abspath(workdir))

  step = int(state.step)
  progress = Progress(step, config.num_train_steps)
  sums, summary = None, {}
  batches = train_batches.iterate(position)
  while step < config.num_train_steps:
    position, batch = next(batches)
    progress.tokens += real_tokens(batch)
    state, metrics = step_fn(state, jax.device_put(batch, batch_sharding), rng)
    if wait_each_step:
      jax.block_until_ready(state)
    step += 1
    sums = metrics if sums is None else jax.tree.map(jax.numpy.add, sums, metrics)

    if step % config.log_every_steps == 0 or step == config.num_train_steps:
      host = jax.device_get(sums)
      summary = train_step.summarize(host) | {
          "learning_rate": float(host["learning_rate"]) / (step - progress.last_step),
          "grad_norm": float(host["grad_norm"]) / (step - progress.last_step)}
      summary |= progress.update(step)
      writer.write_scalars(step, {f"train/{k}": v for k, v in summary.items()})
      logging.info("step %d/%d: loss %.3f nll %.3f ppl %.2f lr %.2e | %.2f steps/s %.0f tokens/s "
                   "| ETA %.0f min", step, config.num_train_steps, summary["loss"], summary["nll"],
                   summary["perplexity"], summary["learning_rate"], summary["steps_per_s"],
                   summary["tokens_per_s"], summary["eta_s"] / 60)
      sums = None

    if step % config.checkpoint_every_steps == 0 or step == config.num_train_steps:
      checkpoints.save(mngr, step, state, {"position": position.__dict__,
                                           "config": json.loads(config_to_json(config))})

    if step % config.eval_every_steps == 0 or step == config.num_train_steps:
      evaluation = {f"valid/{k}": v for k, v in evaluate_loss(
          eval_fn, state.params, eval_batches, batch_sharding).items()}
      if num_bleu:
        evaluation |= {f"valid/{k}": v for k, v in evaluate_translations(
            translator, state.params, bleu_sources, bleu_references).items()}
      writer.write_scalars(step, evaluation)
      logging.info("step %d: %s", step, " ".join(f"{k} {v:.4g}" for k, v in evaluation.items()))
      summary |= evaluation
      progress.last_time = time.time()  # evaluation time is not training time

  mngr.wait_until_finished()
  mngr.close()
  writer.flush()
  return summary
