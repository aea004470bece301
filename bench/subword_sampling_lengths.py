"""How much longer subword sampling makes the quick start's training pairs (docs/TRAIN.md).

  python bench/subword_sampling_lengths.py                 # alpha 0.2 and 0.5, 3 epochs each
  python bench/subword_sampling_lengths.py --alphas=0.1,0.2,0.3,0.5 --epochs=1
  python bench/subword_sampling_lengths.py --alphas=0.2 --nbest=2   # each word's 2 likeliest

Multi30k's training split with configs/multi30k.py's vocabulary (8,000 unigram pieces, trained
as the quick start trains it, into --workdir): pieces per sentence (EOS not counted) of the plain
segmentation and of the epochs our sampler draws (data/subword_sampling.py), each side; beside
them, sentencepiece's own sampler at the same alpha over the whole lattice (not reproducible
between processes, so not what training uses; the same distribution, so about the same
lengths); and the pairs an epoch keeps plain for being longer than max_length.
"""
import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from aiayn_flax import tasks  # noqa: E402
from aiayn_flax.data import pipeline, subword_sampling, tokenized  # noqa: E402
from configs import multi30k  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--alphas", default="0.2,0.5")
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--nbest", type=int, default=-1,
                      help="dataset.subword_sampling_nbest (-1: each word's whole lattice)")
  parser.add_argument("--workdir", default="/tmp/aiayn_bench_subword_sampling")
  args = parser.parse_args()
  config = multi30k.get_config()
  task = tasks.for_config(config)
  vocab = pipeline.vocabulary_for(config, args.workdir, task)
  split = tokenized.tokenize_split(config, vocab, config.dataset.train_split, task)
  plain = [side.lengths() - 1 for side in (split.sources, split.targets)]
  print(f"Multi30k train, {len(plain[0])} pairs, plain: {plain[0].mean():.2f} source and "
        f"{plain[1].mean():.2f} target pieces per sentence")
  texts = [vocab.decode_batch(side) for side in (split.sources, split.targets)]
  processor = vocab._processor  # noqa: SLF001 - sentencepiece's own sampler, for comparison
  for alpha in map(float, args.alphas.split(",")):
    start = time.perf_counter()
    config.dataset.update(subword_sampling_alpha=alpha, subword_sampling_nbest=args.nbest)
    sampling = subword_sampling.SampledEpochs(vocab, split.sources, split.targets,
                                              config.dataset, config.seed)
    build_s = time.perf_counter() - start
    means, too_long = [], []
    start = time.perf_counter()
    for epoch in range(args.epochs):
      sides = [sampling.sample(epoch, side).lengths() - 1 for side in (0, 1)]
      means.append([side.mean() for side in sides])
      too_long.append((np.maximum(*sides) + 1 > config.dataset.max_length).sum())
    draw_s = (time.perf_counter() - start) / args.epochs
    ours = np.mean(means, axis=0)
    theirs = [np.mean([len(ids) for ids in processor.encode(
        side, out_type=int, enable_sampling=True, alpha=alpha, nbest_size=-1)])
        for side in texts]
    print(f"alpha {alpha}: {ours[0]:.2f} source ({ours[0] / plain[0].mean():.3f}x) and "
          f"{ours[1]:.2f} target ({ours[1] / plain[1].mean():.3f}x) pieces per sentence, "
          f"{(ours.sum()) / (plain[0].mean() + plain[1].mean()):.3f}x in all, over "
          f"{args.epochs} epochs (nbest {args.nbest}); sentencepiece's sampler (whole lattice): "
          f"{theirs[0] / plain[0].mean():.3f}x and {theirs[1] / plain[1].mean():.3f}x; "
          f"{np.mean(too_long):.1f} pairs an epoch over max_length {config.dataset.max_length} "
          f"(kept plain); lattices built in {build_s:.1f} s, an epoch drawn in {draw_s:.2f} s")


if __name__ == "__main__":
  main()
