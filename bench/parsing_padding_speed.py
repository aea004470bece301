"""Training steps per second on the treebank sample, with the sentences padded to the trees'
length (one-sided, as before issue 45) and with each side padded to its own length
(`dataset.pad_each_side`, data/bucketing.py), on the same batches of real pairs.

  python bench/parsing_padding_speed.py [--config=configs/parsing_sample.py] [--rounds=3]

Both ways train one epoch of the config's batches (the same examples in the same order, the
config's steps_per_call steps per compiled call, as train.py runs them) in alternating rounds,
A B B A ..., so both see the same machine load, after an untimed epoch each that compiles
every shape (into the persistent compilation cache under --workdir: a second call with the same
workdir loads them instead).
Prints each round and the median steps/s of each way. Time it on an otherwise idle machine.
"""
import functools
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from aiayn_flax.runtime import compilation_cache  # noqa: E402
from aiayn_flax import optimizer, tasks, train_step  # noqa: E402
from aiayn_flax.training import trainer  # noqa: E402
from aiayn_flax.data import bucketing, pipeline, tokenized  # noqa: E402

config_flags.DEFINE_config_file("config", os.path.join(REPO, "configs/parsing_sample.py"),
                                "A parsing config.")
flags.DEFINE_integer("rounds", 3, "Rounds of one epoch each way.")
flags.DEFINE_string("workdir", None, "Where the vocabulary and token cache are (default: a "
                    "temporary folder, the vocabulary trained there).")
FLAGS = flags.FLAGS


def epoch_calls(batches: bucketing.TokenBucketedBatches, steps_per_call: int) -> list[tuple]:
  """(stacked batches, steps) of each call of one epoch: runs of up to steps_per_call
  consecutive batches of one bucket, as the trainer takes them."""
  calls, run = [], []

  def flush():
    if run:
      calls.append((trainer.stack_batches([batches.batch(*b) for b in run], steps_per_call),
                    len(run)))
      run.clear()

  for boundary, indices in batches.epoch(0):
    if run and (run[0][0] != boundary or len(run) == steps_per_call):
      flush()
    run.append((boundary, indices))
  flush()
  return calls


def main(argv):
  del argv
  config = FLAGS.config
  task = tasks.for_config(config)
  workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="padding_speed_")
  compilation_cache.enable(config, workdir)  # a second call compiles nothing
  vocab = pipeline.vocabulary_for(config, workdir, task)
  split = tokenized.split_ids(config, vocab, config.dataset.train_split, task)
  ways = {}
  for name, each in (("one-sided", False), ("each side", True)):
    batches = bucketing.TokenBucketedBatches(
        split.sources, split.targets, bucketing.boundaries_for(config.dataset),
        config.tokens_per_batch, 1, config.seed, group=config.steps_per_call, pad_each_side=each,
        quantum=config.dataset.bucket_quantum)
    ways[name] = epoch_calls(batches, config.steps_per_call)
    slots = sum(c["inputs"][:n].size + c["targets"][:n].size for c, n in ways[name])
    print(f"{name}: {sum(n for _, n in ways[name])} steps in {len(ways[name])} calls, "
          f"{slots / sum(n for _, n in ways[name]):.0f} padded slots per step", flush=True)
  model = train_step.make_model(config)
  steps_fn = jax.jit(functools.partial(
      train_step.train_steps, model=model, label_smoothing=config.label_smoothing,
      schedule=optimizer.learning_rate_schedule(config)), donate_argnums=0)
  rng = train_step.dropout_key(config.seed)
  states = {name: train_step.create_train_state(config, model) for name in ways}

  def run_epoch(name):
    start = time.perf_counter()
    state = states[name]
    for stacked, steps in ways[name]:
      state, metrics = steps_fn(state, stacked, steps, rng)
    jax.block_until_ready((state, metrics))
    states[name] = state
    return sum(n for _, n in ways[name]) / (time.perf_counter() - start)

  for name in ways:  # compile every shape (and the state's types after a first step): untimed
    print(f"{name}: one epoch to compile and warm up, {run_epoch(name):.2f} steps/s", flush=True)
  rates = {name: [] for name in ways}
  order = list(ways)
  for round_ in range(FLAGS.rounds):
    for name in (order if round_ % 2 == 0 else order[::-1]):
      rates[name].append(run_epoch(name))
      print(f"round {round_}: {name} {rates[name][-1]:.2f} steps/s", flush=True)
  if not FLAGS.rounds:
    return
  medians = {name: statistics.median(r) for name, r in rates.items()}
  print(" ; ".join(f"{name}: median {m:.2f} steps/s" for name, m in medians.items())
        + f" ; ratio {medians['each side'] / medians['one-sided']:.3f}")


if __name__ == "__main__":
  app.run(main)
