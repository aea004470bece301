"""The host input pipeline alone, against the rate an accelerator would consume its batches.

  python bench/input_pipeline.py                      # base, a WMT-sized corpus, one core
  python bench/input_pipeline.py --config=configs/big.py
  python bench/input_pipeline.py --pairs=1000000 --batches=200

The corpus: newstest2013 + newstest2014 EN-DE (../shared/data/wmt14, or $AIAYN_DATA_DIR)
tokenized with a SentencePiece BPE vocabulary trained on them (8,000 pieces: 6,000 sentence
pairs cannot train the 37,000 of base), then tiled to --pairs pairs (4.5M: WMT14 EN-DE's size)
as the tokenized cache holds them (flat ids + offsets). Lengths are real newstest lengths; the
bucketing is the config's, at its tokens_per_batch on one data shard.

Timed on one core (the process is pinned to CPU 0): building the batch list of an epoch
(lengths, buckets, shuffle), then --batches batches assembled as training takes them, both with
the rows gathered at once (what the trainer does) and, in the same run, copied one by one (what
it did before); the planned consumption is the step rate `train.py --dry_run` plans for the
config on each target (config.mfu of the peak FLOPs).
"""
import argparse
import importlib
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from aiayn_flax import dry_run  # noqa: E402
from aiayn_flax.data import bucketing, ragged, vocabulary  # noqa: E402
from aiayn_flax.data.text_files import read_parallel_lines  # noqa: E402

TARGETS = {"tpu-v4-8": ("tpu_v4", 4), "gpu-a100x8": ("a100", 8)}


def newstest_ids(data_dir: str, workdir: str):
  """(sources, targets) RaggedIds of newstest2013 + 2014 EN->DE, ids + EOS."""
  sources, targets = [], []
  for year in (2013, 2014):
    en, de = read_parallel_lines(os.path.join(data_dir, "wmt14", f"newstest{year}.en"),
                                 os.path.join(data_dir, "wmt14", f"newstest{year}.de"))
    sources += en
    targets += de
  vocab = vocabulary.train_vocabulary(sources + targets, os.path.join(workdir, "bench.model"),
                                      8000, "bpe", character_coverage=0.9995)
  eos = [vocabulary.EOS_ID]
  return (ragged.from_sequences([np.array(ids + eos, np.uint16)
                                 for ids in vocab.encode_batch(side)])
          for side in (sources, targets))


def tiled(ids: ragged.RaggedIds, pairs: int) -> ragged.RaggedIds:
  """The sequences repeated in order until there are `pairs` of them."""
  repeats = -(-pairs // len(ids))
  lengths = np.tile(ids.lengths(), repeats)[:pairs]
  flat = np.tile(ids.flat[ids.offsets[0]:ids.offsets[-1]], repeats)[:lengths.sum()]
  return ragged.from_parts([flat], [lengths], ids.flat.dtype)


def rows_one_by_one(sequences, indices: np.ndarray, length: int) -> np.ndarray:
  """The assembly the trainer used before: a Python loop over the rows."""
  out = np.full((len(indices), length), vocabulary.PAD_ID, dtype=np.int32)
  for row, i in enumerate(indices):
    if i != ragged.EMPTY_ROW:
      seq = sequences[i]
      out[row, :len(seq)] = seq
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/base.py")
  parser.add_argument("--pairs", type=int, default=4_500_000)
  parser.add_argument("--batches", type=int, default=500)
  parser.add_argument("--data_dir", default=os.environ.get("AIAYN_DATA_DIR")
                      or os.path.join(os.path.dirname(REPO), "shared", "data"))
  parser.add_argument("--workdir", default="/tmp/aiayn_bench_input_pipeline")
  args = parser.parse_args()
  os.sched_setaffinity(0, {0})
  os.makedirs(args.workdir, exist_ok=True)

  config = importlib.import_module(
      "configs." + os.path.splitext(os.path.basename(args.config))[0]).get_config()
  sources, targets = newstest_ids(args.data_dir, args.workdir)
  keep = np.maximum(sources.lengths(), targets.lengths()) <= config.dataset.max_length
  assert keep.all(), "a newstest pair is longer than max_length"
  sources, targets = tiled(sources, args.pairs), tiled(targets, args.pairs)
  print(f"corpus: {len(sources)} pairs, {sources.lengths().sum() + targets.lengths().sum()} "
        "tokens (newstest2013+2014 tiled)")

  dataset = config.dataset
  boundaries = bucketing.bucket_boundaries(dataset.bucket_min_length, dataset.max_length,
                                           dataset.bucket_growth, dataset.bucket_quantum)
  start = time.perf_counter()
  batches = bucketing.TokenBucketedBatches(sources, targets, boundaries, config.tokens_per_batch,
                                           seed=config.seed)
  epoch = batches.epoch(0)
  setup_s = time.perf_counter() - start
  print(f"epoch batch list: {len(epoch)} batches in {setup_s:.2f} s")

  taken = epoch[:args.batches]
  start = time.perf_counter()
  real = np.zeros(2)
  padded = 0
  for boundary, indices in taken:
    batch = batches.batch(boundary, indices)
    real += [np.count_nonzero(batch["inputs"]), np.count_nonzero(batch["targets"])]
    padded += 2 * batch["inputs"].size
  gathered_s = time.perf_counter() - start
  start = time.perf_counter()
  for boundary, indices in taken:
    rows_one_by_one(sources, indices, boundary)
    rows_one_by_one(targets, indices, boundary)
  loop_s = time.perf_counter() - start

  rate = len(taken) / gathered_s
  mean_source, mean_target = real / len(taken)
  padding = 100 * (1 - real.sum() / padded)
  print(f"gathered at once: {rate:.1f} batches/s, {real.sum() / gathered_s:.3g} real tokens/s; "
        f"one row at a time: {len(taken) / loop_s:.1f} batches/s ({loop_s / gathered_s:.1f}x "
        "slower)")
  planned = {}
  for target, (device, count) in TARGETS.items():
    planned_config = config.copy_and_resolve_references()
    planned_config.device, planned_config.num_devices = device, count
    planned[target] = 1 / dry_run.plan(planned_config)["step_time_s"]
    print(f"planned consumption on {target}: {planned[target]:.2f} steps/s "
          f"({rate / planned[target]:.1f}x covered)")
  hungriest = max(planned, key=planned.get)
  print(f"input pipeline: {rate:.1f} batches/s, {rate / planned[hungriest]:.1f}x the planned "
        f"consumption of {config.name} on {hungriest}; real tokens per step "
        f"{mean_source:.0f}/{mean_target:.0f}, padding {padding:.1f}%")


if __name__ == "__main__":
  main()
