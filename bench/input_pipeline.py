"""The host input pipeline alone, against the rate an accelerator would consume its batches.

  python bench/input_pipeline.py                      # base, a WMT-sized corpus, one core
  python bench/input_pipeline.py --config=configs/big.py
  python bench/input_pipeline.py --pairs=1000000 --batches=200
  python bench/input_pipeline.py --compare_feeders   # + prefetch thread and grain (if installed)
  python bench/input_pipeline.py --subword_sampling_alpha=0.2 --pairs=1000000  # + sampling

The corpus: newstest2014 EN-DE, the 3003 pairs evaluate.py scores (from $AIAYN_DATA_DIR/wmt14,
else tfds or sacrebleu's download), tokenized as training tokenizes (ids + EOS) with a
SentencePiece BPE vocabulary trained on it (8,000 pieces: 3,003 pairs cannot train the 37,000
of base), then tiled to --pairs pairs (4.5M: WMT14 EN-DE's size) in the tokenized cache's form
(flat ids + offsets). Lengths are real newstest lengths; the bucketing is the config's, at its
tokens_per_batch on one data shard.

Timed on one core (the process is pinned to CPU 0): building the batch list of an epoch
(lengths, buckets, shuffle), then --batches batches assembled as training takes them, both with
the rows gathered at once (what the trainer does) and, in the same run, copied one by one (what
it did before); the planned consumption is the step rate `train.py --dry_run` plans for the
config on each target (at the MFU the plan uses: measured where there is one, else 0.4).

With --subword_sampling_alpha (a unigram vocabulary then), the corpus' word lattices are built
and one epoch is drawn (data/subword_sampling.py), on the same core: the feed with sampling is
an epoch's batches over the time to assemble them plus the time to draw the epoch (the trainer
draws the next epoch on a thread while one trains). The tiled corpus holds newstest's distinct
words alone: building the lattices of a real corpus' words takes longer (per word: printed).
"""
import argparse
import functools
import importlib
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from aiayn_flax.planning import accelerator_targets, dry_run  # noqa: E402
from aiayn_flax import run_dir  # noqa: E402
from aiayn_flax.training import metrics  # noqa: E402
from aiayn_flax.data import bucketing, ragged, tokenized, vocabulary  # noqa: E402

TARGETS = ("tpu-v4-8", "gpu-a100x8")


def newstest_ids(config, workdir: str, model_type: str = "bpe"):
  """(newstest2014's token ids, the vocabulary)."""
  sources, targets = run_dir.newstest2014_pairs()
  vocab = vocabulary.train_vocabulary(sources + targets,
                                      os.path.join(workdir, f"bench-{model_type}.model"),
                                      8000, model_type, character_coverage=0.9995)
  return tokenized.tokenize_for_training(sources, targets, vocab,
                                         config.dataset.max_length), vocab


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


def drain(items) -> float:
  """Batches per second taken from an iterator of batches, to its end."""
  start, count = time.perf_counter(), 0
  for _ in items:
    count += 1
  return count / (time.perf_counter() - start)


def compare_feeders(batches, taken, gathered_rate: float) -> None:
  """The same batches, in the same order, through the trainer's prefetch thread and through
  grain (when installed: pip install grain), on the same core."""
  from aiayn_flax.data import prefetch
  feeders = {"prefetch thread, depth 2 (the trainer's)": lambda: prefetch.prefetched(
      (batches.batch(*item) for item in taken), 2)}
  try:
    import grain
  except ImportError:
    print("grain: not installed (pip install grain), not compared")
  else:
    from absl import flags
    flags.FLAGS(sys.argv[:1])  # grain reads its absl flags; this script's flags are argparse's
    source = lambda: grain.MapDataset.source(taken).map(  # noqa: E731
        lambda item: batches.batch(*item))
    feeders |= {
        "grain, 1 thread, buffer 2": lambda: source().to_iter_dataset(
            grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)),
        "grain, default ReadOptions (16 threads, buffer 500)": lambda: source().to_iter_dataset(),
        "grain, 1 worker process (mp_prefetch)": lambda: source().to_iter_dataset(
            grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)).mp_prefetch(
                grain.MultiprocessingOptions(num_workers=1)),
    }
  for name, feeder in feeders.items():
    rate = drain(feeder())
    print(f"{name}: {rate:.1f} batches/s ({rate / gathered_rate:.2f}x gathering on the "
          "training thread)")


def sampled_feed(config, alpha, vocab, sources, targets, boundaries, epoch_batches: int,
                 plain_rate: float) -> float:
  """Builds the lattices and draws one epoch; the batches per second an epoch is fed at, the
  draw included."""
  from aiayn_flax.data import subword_sampling
  config = config.copy_and_resolve_references()
  config.dataset.subword_sampling_alpha = alpha  # both sides, each word's whole lattice
  start = time.perf_counter()  # the lattices, and the batch plan (a fraction of a second)
  batches = bucketing.TokenBucketedBatches(
      sources, targets, boundaries, config.tokens_per_batch, seed=config.seed,
      sampling=functools.partial(subword_sampling.SampledEpochs, vocab, sources, targets,
                                 config.dataset, config.seed))
  build_s = time.perf_counter() - start
  sampling = batches.sampling
  words = sum(len(lattices.node_base) for _, _, lattices in sampling._sides)
  units = sum(len(types) for _, types, _ in sampling._sides)
  start, start_cpu = time.perf_counter(), time.process_time()  # the sampling thread's work
  fitted = sampling.fitted(sampling.sample(0, 0), sampling.sample(0, 1))
  draw_s, draw_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
  drawn = fitted[:2]
  sampling.pairs = lambda epoch: fitted  # the epoch drawn above, not drawn again
  epoch = batches.epoch(0)
  start = time.perf_counter()
  for boundary, indices in epoch[:500]:
    batches.batch(boundary, indices, 0)
  sampled_rate = min(500, len(epoch)) / (time.perf_counter() - start)
  fed = len(epoch) / (len(epoch) / sampled_rate + draw_s)
  fed_cpu = len(epoch) / (len(epoch) / sampled_rate + draw_cpu_s)
  tokens = sum(side.lengths().sum() for side in drawn) / (
      sources.lengths().sum() + targets.lengths().sum())
  print(f"subword sampling, alpha {alpha}: {units} words indexed and the lattices of the "
        f"{words} distinct ones built in {build_s:.1f} s, an epoch drawn in {draw_s:.1f} s "
        f"({draw_cpu_s:.1f} s of CPU) "
        f"({len(epoch)} batches, {epoch_batches} plain; {tokens:.3f}x the plain tokens); "
        f"batches assembled at {sampled_rate:.1f}/s ({plain_rate:.1f}/s plain); fed with the "
        f"draw: {fed:.1f} batches/s ({fed_cpu:.1f}/s counting the draw's CPU seconds: on a "
        "shared machine, its wall seconds hold other jobs' too)")
  return fed


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/base.py")
  parser.add_argument("--pairs", type=int, default=4_500_000)
  parser.add_argument("--batches", type=int, default=500)
  parser.add_argument("--workdir", default="/tmp/aiayn_bench_input_pipeline")
  parser.add_argument("--compare_feeders", action="store_true",
                      help="Also feed the batches through the prefetch thread and grain.")
  parser.add_argument("--subword_sampling_alpha", type=float, default=0.0,
                      help="Also draw an epoch of sampled segmentations (unigram vocabulary).")
  args = parser.parse_args()
  os.sched_setaffinity(0, {0})
  os.makedirs(args.workdir, exist_ok=True)

  config = importlib.import_module(
      "configs." + os.path.splitext(os.path.basename(args.config))[0]).get_config()
  alpha = args.subword_sampling_alpha
  newstest, vocab = newstest_ids(config, args.workdir, "unigram" if alpha else "bpe")
  sources, targets = tiled(newstest.sources, args.pairs), tiled(newstest.targets, args.pairs)
  print(f"corpus: {len(sources)} pairs, {sources.lengths().sum() + targets.lengths().sum()} "
        f"tokens (newstest2014 tiled; {newstest.skipped_long} pairs over max_length left out)")

  boundaries = bucketing.boundaries_for(config.dataset)
  start = time.perf_counter()
  batches = bucketing.TokenBucketedBatches(sources, targets, boundaries, config.tokens_per_batch,
                                           seed=config.seed)
  epoch = batches.epoch(0)
  setup_s = time.perf_counter() - start
  print(f"epoch batch list: {len(epoch)} batches in {setup_s:.2f} s")

  taken = epoch[:args.batches]
  start = time.perf_counter()
  real_sources = real = padded = 0
  for boundary, indices in taken:
    batch = batches.batch(boundary, indices)
    real += metrics.real_tokens(batch)
    real_sources += np.count_nonzero(batch["inputs"])
    padded += 2 * batch["inputs"].size
  gathered_s = time.perf_counter() - start
  start = time.perf_counter()
  for boundary, indices in taken:
    rows_one_by_one(sources, indices, boundary)
    rows_one_by_one(targets, indices, boundary)
  loop_s = time.perf_counter() - start

  rate = len(taken) / gathered_s
  if args.compare_feeders:
    compare_feeders(batches, taken, rate)
  mean_source, mean_target = real_sources / len(taken), (real - real_sources) / len(taken)
  padding = 100 * (1 - real / padded)
  print(f"gathered at once: {rate:.1f} batches/s, {real / gathered_s:.3g} real tokens/s; "
        f"one row at a time: {len(taken) / loop_s:.1f} batches/s ({loop_s / gathered_s:.1f}x "
        "slower)")
  if alpha:  # the rate compared with the planned consumption: with the draws
    rate = sampled_feed(config, alpha, vocab, sources, targets, boundaries, len(epoch), rate)
  planned = {}
  for target in TARGETS:
    planned_config = config.copy_and_resolve_references()
    named = accelerator_targets.target(target)
    planned_config.device, planned_config.num_devices = named.kind, named.num_devices
    planned[target] = 1 / dry_run.plan(planned_config)["step_time_s"]
    print(f"planned consumption on {target}: {planned[target]:.2f} steps/s "
          f"({rate / planned[target]:.1f}x covered)")
  hungriest = max(planned, key=planned.get)
  print(f"input pipeline: {rate:.1f} batches/s, {rate / planned[hungriest]:.1f}x the planned "
        f"consumption of {config.name} on {hungriest}; real tokens per step "
        f"{mean_source:.0f}/{mean_target:.0f}, padding {padding:.1f}%")


if __name__ == "__main__":
  main()
