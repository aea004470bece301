"""Host memory of the training input on each of P hosts: the token cache and the batches.

  python bench/host_input_memory.py                    # 4.5M pairs (WMT14 EN-DE), 1 vs 4 hosts
  python bench/host_input_memory.py --pairs=400000 --batches=50

A synthetic token cache of WMT14 EN-DE's size (--pairs sentence pairs, lengths drawn around
newstest's mean of about 30 pieces a side, ids of a 37,000-piece vocabulary) is written in the
cache's own format (tokenized._write_tokenized), then read and batched as the trainer does, for
--batches batches of base's 25k tokens on 8 data shards, in a fresh process per case:

  before  every host read the whole cache into its heap and built every row of every batch
          (the reader as it was: np.load of each array), then kept its own rows;
  P hosts the cache memory-mapped (tokenized._read_tokenized) and host 0 of P building only
          the rows its devices hold (a block of 1/P of each batch: process_row_indices on a mesh
          whose data axis spans the P hosts).

Reported per case: the peak of the process's heap (tracemalloc: numpy's arrays are traced) and
the growth of its peak resident memory over what it held before reading (VmHWM - VmRSS at the
start: this also counts the pages of the mapped cache that were read, page cache that the
kernel reclaims, where it cannot reclaim the heap).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

MiB = 2**20
VOCAB = 37_000
TOKENS_PER_BATCH, DATA_SHARDS, MAX_LENGTH = 25_000, 8, 256


def write_cache(path: str, pairs: int, seed: int = 0) -> None:
  from aiayn_flax.data import ragged, tokenized
  rng = np.random.default_rng(seed)
  sides = []
  for _ in range(2):
    lengths = np.clip(rng.lognormal(np.log(27), 0.55, pairs).astype(np.int64), 2, MAX_LENGTH)
    flat = rng.integers(3, VOCAB, int(lengths.sum()), dtype=np.uint16)
    sides.append(ragged.from_parts([flat], [lengths], np.uint16))
  tokenized._write_tokenized(tokenized.epath.Path(path), "bench",
                             tokenized.TokenizedSplit(*sides))


def measure(path: str, hosts: int, batches: int, before: bool) -> dict:
  """One case, in this process: peak heap and resident memory while reading and batching."""
  from aiayn_flax.data import bucketing, ragged, tokenized
  start_resident = _status_bytes("VmRSS")
  tracemalloc.start()
  if before:
    with open(path, "rb") as f, np.load(f) as arrays:
      ids = [ragged.RaggedIds(arrays[f"{side}_ids"], arrays[f"{side}_offsets"])
             for side in ("source", "target")]
  else:
    split = tokenized._read_tokenized(tokenized.epath.Path(path), "bench")
    ids = [split.sources, split.targets]
  stream = bucketing.TokenBucketedBatches(
      *ids, bucketing.bucket_boundaries(8, MAX_LENGTH, 1.25), TOKENS_PER_BATCH, DATA_SHARDS)
  rows_of = None if before else (lambda n: np.arange(n // hosts))  # host 0's block
  real = 0
  for count, (_, batch) in enumerate(stream.iterate(rows_of=rows_of)):
    real += int(np.count_nonzero(batch["targets"]))
    if count + 1 == batches:
      break
  peak_heap = tracemalloc.get_traced_memory()[1]
  return {"heap_mib": peak_heap / MiB,
          "resident_mib": (_status_bytes("VmHWM") - start_resident) / MiB,
          "target_tokens": real}


def _status_bytes(field: str) -> int:
  with open("/proc/self/status") as status:
    return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--pairs", type=int, default=4_500_000)
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--hosts", type=int, nargs="+", default=[1, 4])
  parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: "before" or a host count
  parser.add_argument("--cache", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.case:
    print(json.dumps(measure(args.cache, 1 if args.case == "before" else int(args.case),
                             args.batches, args.case == "before")))
    return
  with tempfile.TemporaryDirectory() as folder:
    cache = os.path.join(folder, "cache.npz")
    write_cache(cache, args.pairs)
    print(f"synthetic token cache: {args.pairs} pairs, {os.path.getsize(cache) / MiB:.0f} MiB; "
          f"{args.batches} batches of {TOKENS_PER_BATCH} tokens on {DATA_SHARDS} data shards")
    results = {}
    for case in ["before", *map(str, args.hosts)]:
      output = subprocess.run([sys.executable, __file__, f"--case={case}", f"--cache={cache}",
                               f"--batches={args.batches}"], check=True, capture_output=True,
                              text=True).stdout
      results[case] = json.loads(output.strip().splitlines()[-1])
    for case, r in results.items():
      label = "before (whole cache, every row)" if case == "before" else f"host 0 of {case}"
      print(f"{label:34s} heap {r['heap_mib']:7.0f} MiB ({r['heap_mib'] / results['before']['heap_mib']:.2f} of before)"
            f"   resident {r['resident_mib']:7.0f} MiB   target tokens built {r['target_tokens']}")


if __name__ == "__main__":
  main()
