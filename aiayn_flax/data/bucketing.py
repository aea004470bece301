"""Token-bucketed batches (section 5.1: "sentence pairs were batched together by approximate
sequence length; each training batch contained ... approximately 25000 source tokens and 25000
target tokens").

Examples are grouped by length into buckets; a bucket with boundary L gives batches of shape
[tokens_per_batch // L, L] (rounded down to a multiple of the data-parallel shards), so XLA sees
one shape per bucket and never recompiles. The last, partial batch of a bucket is completed
with empty rows (all padding, weight 0) instead of being dropped: every example is seen exactly
once per epoch.

This is plain numpy rather than tf.data's bucket_by_sequence_length because the order must be a
pure function of (seed, epoch), so that a resumed run sees exactly the batches that an
uninterrupted run would have seen (`BatchPosition`).
"""
import dataclasses
import math
from collections.abc import Iterator

import numpy as np

from aiayn_flax.data.ragged import EMPTY_ROW, RaggedIds
from aiayn_flax.data.vocabulary import PAD_ID


def bucket_boundaries(min_length: int, max_length: int, growth: float,
                      quantum: int = 8) -> list[int]:
  """Geometric boundaries rounded up to multiples of `quantum`, ending at max_length."""
  boundaries = [min(min_length, max_length)]
  while boundaries[-1] < max_length:
    grown = math.ceil(boundaries[-1] * growth / quantum) * quantum
    boundaries.append(min(max(grown, boundaries[-1] + quantum), max_length))
  return boundaries


def batch_size_for(boundary: int, tokens_per_batch: int, batch_multiple: int) -> int:
  """Rows in a batch of padded length `boundary`: at most tokens_per_batch tokens per side."""
  rows = tokens_per_batch // boundary // batch_multiple * batch_multiple
  if rows < batch_multiple:
    raise ValueError(f"tokens_per_batch={tokens_per_batch} is too small for a bucket of length "
                     f"{boundary} on {batch_multiple} data-parallel shards")
  return rows


@dataclasses.dataclass(frozen=True)
class BatchPosition:
  """Where the batch stream stands: the next batch is number `index` of epoch `epoch`."""
  epoch: int = 0
  index: int = 0


def bucket_of(lengths: np.ndarray, boundaries: list[int]) -> np.ndarray:
  """Index of the smallest boundary >= each length."""
  return np.searchsorted(np.asarray(boundaries), lengths, side="left")


def epoch_batches(lengths: np.ndarray, boundaries: list[int], tokens_per_batch: int,
                  batch_multiple: int, seed: int, epoch: int,
                  shuffle: bool = True, group: int = 1) -> list[tuple[int, np.ndarray]]:
  """One epoch as a list of (boundary, example indices with EMPTY_ROW padding).

  `lengths` is max(source length, target length) per example, all <= boundaries[-1]. With
  `group` > 1, each bucket's batches come in runs of `group` consecutive batches (the last run
  of a bucket may be shorter), and the runs are shuffled rather than the batches, so that the
  trainer can take `group` steps of one shape in a single call (`steps_per_call`). group=1 is
  the plain shuffle of batches.
  """
  rng = np.random.default_rng([seed, epoch])
  order = rng.permutation(len(lengths)) if shuffle else np.arange(len(lengths))
  buckets = bucket_of(lengths[order], boundaries)
  runs = []
  for b, boundary in enumerate(boundaries):
    members = order[buckets == b]
    rows = batch_size_for(boundary, tokens_per_batch, batch_multiple)
    bucket = []
    for start in range(0, len(members), rows):
      chunk = members[start:start + rows]
      padded = np.full(rows, EMPTY_ROW, dtype=np.int64)
      padded[:len(chunk)] = chunk
      bucket.append((boundary, padded))
    runs += [bucket[i:i + group] for i in range(0, len(bucket), group)]
  if shuffle:
    runs = [runs[i] for i in rng.permutation(len(runs))]
  return [batch for run in runs for batch in run]


class TokenBucketedBatches:
  """Endless, resumable stream of {"inputs": [B, L], "targets": [B, L]} int32 batches."""

  def __init__(self, sources: RaggedIds, targets: RaggedIds,
               boundaries: list[int], tokens_per_batch: int, batch_multiple: int = 1,
               seed: int = 0, shuffle: bool = True, group: int = 1):
    if len(sources) != len(targets):
      raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if not len(sources):
      raise ValueError("no training examples")
    self.sources, self.targets = sources, targets
    self.lengths = np.maximum(self.sources.lengths(), self.targets.lengths())
    if self.lengths.max() > boundaries[-1]:
      raise ValueError(f"an example has {self.lengths.max()} tokens, more than the largest "
                       f"bucket ({boundaries[-1]}); filter long examples first")
    self.boundaries = boundaries
    self.tokens_per_batch = tokens_per_batch
    self.batch_multiple = batch_multiple
    self.seed = seed
    self.shuffle = shuffle
    self.group = group

  def epoch(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    return epoch_batches(self.lengths, self.boundaries, self.tokens_per_batch,
                         self.batch_multiple, self.seed, epoch, self.shuffle, self.group)

  def batch(self, boundary: int, indices: np.ndarray) -> dict[str, np.ndarray]:
    return {"inputs": self.sources.padded_rows(indices, boundary, PAD_ID),
            "targets": self.targets.padded_rows(indices, boundary, PAD_ID)}

  def iterate(self, start: BatchPosition = BatchPosition(),
              num_epochs: int | None = None) -> Iterator[tuple[BatchPosition, dict]]:
    """Yields (position after this batch, batch), from `start` on."""
    epoch, index = start.epoch, start.index
    while num_epochs is None or epoch < start.epoch + num_epochs:
      batches = self.epoch(epoch)
      for i in range(index, len(batches)):
        following = BatchPosition(epoch, i + 1) if i + 1 < len(batches) else BatchPosition(
            epoch + 1, 0)
        yield following, self.batch(*batches[i])
      epoch, index = epoch + 1, 0

  def padding_fraction(self) -> float:
    """Share of padded positions (both sides) in one epoch's batches."""
    real = self.sources.lengths().sum() + self.targets.lengths().sum()
    total = sum(2 * boundary * len(indices) for boundary, indices in self.epoch(0))
    return 1.0 - real / total
