"""Start-up of a paper-scale run on a WMT-sized corpus: vocabulary, tokenization, bucketing.

  python bench/startup.py                          # base, 4.5M pairs (WMT14 EN-DE's size)
  python bench/startup.py --pairs=500000 --vocab_sample_sentences=1000000

What a first `train.py --config=configs/base.py` run does before its first step, timed stage
by stage with the project's own functions, and the process's peak memory after each stage:
  1. the vocabulary: a uniform sample of the training sentences drawn in one streaming pass
     (config.dataset.vocab_sample_sentences), then SentencePiece trained on it;
  2. the training split tokenized chunk by chunk and written to the tokenized cache;
  3. the epoch's batch list (lengths, buckets, shuffle) over the whole corpus.
Then what a resumed run does instead: the cache read back and the batch list built again.

The corpus is synthetic but made of real text: newstest2013/2014 EN-DE and Multi30k's training
pairs (from $AIAYN_DATA_DIR, else downloaded), recombined into --pairs new pairs, each the first
half of one real pair's words followed by the second half of another's, on both sides. It is
generated chunk by chunk where training would read tfds' wmt14_translate (which is not
prepared here), so tfds' own reading time is not in the figures.
"""
import argparse
import importlib
import os
import resource
import shutil
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from aiayn_flax.runtime import garbage_collection  # noqa: E402
garbage_collection.collect_less_often()  # as train.py, before JAX's imports

import numpy as np  # noqa: E402

from aiayn_flax import run_dir, tasks  # noqa: E402
from aiayn_flax.data import (  # noqa: E402
    bucketing, multi30k, pipeline, source_text, text_files, tokenized)


def real_pairs() -> tuple[list[list[str]], list[list[str]]]:
  """Word lists of the real EN-DE pairs the synthetic corpus is made of."""
  sources, targets = run_dir.newstest2014_pairs()
  local = os.path.join(os.environ.get("AIAYN_DATA_DIR", ""), "wmt14")
  if os.path.exists(os.path.join(local, "newstest2013.en")):
    more = text_files.read_parallel_lines(os.path.join(local, "newstest2013.en"),
                                          os.path.join(local, "newstest2013.de"))
    sources, targets = sources + more[0], targets + more[1]
  more = multi30k.read_split_pairs("train")
  sources, targets = sources + more[0], targets + more[1]
  return [s.split() for s in sources], [t.split() for t in targets]


def synthetic_chunks(words, pairs: int, chunk_pairs: int, seed: int):
  """`pairs` recombined pairs, `chunk_pairs` at a time; chunk k depends on (seed, k) only."""
  sources, targets = words
  for k, start in enumerate(range(0, pairs, chunk_pairs)):
    rng = np.random.default_rng([seed, k])
    count = min(chunk_pairs, pairs - start)
    firsts, seconds = rng.integers(len(sources), size=(2, count))
    chunk = ([], [])
    for a, b in zip(firsts.tolist(), seconds.tolist()):
      for side, lines in enumerate((sources, targets)):
        head, tail = lines[a], lines[b]
        chunk[side].append(" ".join(head[:len(head) // 2] + tail[len(tail) // 2:]))
    yield chunk


def peak_memory_gib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/base.py")
  parser.add_argument("--pairs", type=int, default=4_500_000)
  parser.add_argument("--vocab_sample_sentences", type=int, default=None,
                      help="Overrides the config's sample size.")
  parser.add_argument("--workdir", default="/tmp/aiayn_bench_startup")
  args = parser.parse_args()
  shutil.rmtree(args.workdir, ignore_errors=True)

  config = importlib.import_module(
      "configs." + os.path.splitext(os.path.basename(args.config))[0]).get_config()
  if args.vocab_sample_sentences is not None:
    config.dataset.vocab_sample_sentences = args.vocab_sample_sentences
  words = real_pairs()
  train_split = config.dataset.train_split
  task = tasks.for_config(config)

  def chunks(dataset, split, chunk_pairs):
    if split != train_split:
      raise ValueError(f"the bench serves only the {train_split!r} split, not {split!r}")
    return synthetic_chunks(words, args.pairs, chunk_pairs, config.seed)
  source_text._tfds_pair_chunks = chunks  # where tfds would be read
  print(f"corpus: {args.pairs} pairs recombined from {len(words[0])} real EN-DE pairs; "
        f"{os.cpu_count()} cores; vocabulary {config.model.vocab_size} "
        f"{config.dataset.vocab_model_type} pieces, sample of "
        f"{config.dataset.vocab_sample_sentences or 'all'} sentences")
  base_memory = peak_memory_gib()

  timings = {}

  def stage(name, fn):
    start = time.perf_counter()
    result = fn()
    timings[name] = time.perf_counter() - start
    print(f"{name}: {timings[name]:.1f} s, peak memory {peak_memory_gib():.2f} GiB", flush=True)
    return result

  vocab = stage("vocabulary (sample + SentencePiece)",
                lambda: pipeline.vocabulary_for(config, args.workdir, task))
  print(f"vocabulary: {vocab.vocab_size} pieces")
  split_ids = stage("tokenize + cache",
                    lambda: tokenized.split_ids(config, vocab, train_split, task))
  boundaries = bucketing.boundaries_for(config.dataset)
  first = stage("batch list", lambda: bucketing.TokenBucketedBatches(
      split_ids.sources, split_ids.targets, boundaries, config.tokens_per_batch,
      seed=config.seed).epoch(0))
  del split_ids
  resumed = stage("resumed run: cache read + batch list", lambda: pipeline.batches_for_split(
      config, vocab, train_split, batch_multiple=1, shuffle=True, task=task).epoch(0))
  assert len(resumed) == len(first)
  total = sum(timings[k] for k in list(timings)[:3])
  print(f"start-up: {total:.0f} s on a first run ({timings['vocabulary (sample + SentencePiece)']:.0f}"
        f" s vocabulary), {timings['resumed run: cache read + batch list']:.1f} s on a resumed "
        f"run; peak memory {peak_memory_gib():.2f} GiB ({base_memory:.2f} GiB before the "
        f"first stage); {args.pairs} pairs, {len(first)} batches per epoch")


if __name__ == "__main__":
  main()
