"""What a config's training batches hold: real tokens per step, padded slots, padding.

  python bench/batch_shapes.py                                  # the quick start (Multi30k)
  python bench/batch_shapes.py --padded_slots=2560              # + rows sized the old way
  python bench/batch_shapes.py --config=configs/base.py --workdir=runs/base

The batches of one epoch of the config's training split, built by the project's own code
(vocabulary, tokenized cache, bucketing; the vocabulary is trained in --workdir unless one is
there). With --padded_slots=N it also builds the batches as tokens_per_batch meant before it
counted real tokens (each bucket of length L got N // L rows), so that a config's new
tokens_per_batch can be checked against the batches it replaced.
"""
import argparse
import importlib
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from aiayn_flax import tasks  # noqa: E402
from aiayn_flax.data import bucketing, pipeline  # noqa: E402
from aiayn_flax.data.ragged import EMPTY_ROW  # noqa: E402


def describe(batches) -> tuple[float, float, float, float]:
  """(real source tokens, real target tokens, padded slots per side, padding) per batch, over
  the full batches of one epoch (each bucket's last batch is partly empty rows)."""
  source, target, padding = batches.epoch_summary()
  full = [(boundary, indices) for boundary, indices in batches.epoch(0)
          if not (indices == EMPTY_ROW).any()]
  slots = float(np.mean([boundary * len(indices) for boundary, indices in full]))
  return source, target, slots, padding


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/multi30k.py")
  parser.add_argument("--workdir", default="/tmp/aiayn_bench_batch_shapes")
  parser.add_argument("--padded_slots", type=int, default=0,
                      help="Also size rows as N // bucket length (the rule before real tokens).")
  args = parser.parse_args()
  config = importlib.import_module(
      "configs." + os.path.splitext(os.path.basename(args.config))[0]).get_config()
  os.makedirs(args.workdir, exist_ok=True)
  vocab = pipeline.vocabulary_for(config, args.workdir, tasks.for_config(config))
  batches = pipeline.batches_for_split(config, vocab, config.dataset.train_split,
                                       batch_multiple=1, shuffle=True, task=tasks.for_config(config))
  source, target, slots, padding = describe(batches)
  print(f"tokens_per_batch {config.tokens_per_batch} (real): {source:.0f}/{target:.0f} real "
        f"tokens per step, {slots:.0f} padded slots per side, padding {100 * padding:.1f}%, "
        f"{len(batches.epoch(0))} batches per epoch")
  if args.padded_slots:
    # The retired rule: rows from the padded slots alone, whatever the bucket's lengths.
    batches.rows = [bucketing.batch_size_for(boundary, args.padded_slots, 1)
                    for boundary in batches.boundaries]
    old_source, old_target, old_slots, old_padding = describe(batches)
    print(f"padded_slots {args.padded_slots} (old rule): {old_source:.0f}/{old_target:.0f} real "
          f"tokens per step, {old_slots:.0f} padded slots per side, padding "
          f"{100 * old_padding:.1f}%, {len(batches.epoch(0))} batches per epoch")
    print(f"new/old: real tokens {source / old_source:.4f}/{target / old_target:.4f}, "
          f"padded slots {slots / old_slots:.4f}")


if __name__ == "__main__":
  main()
