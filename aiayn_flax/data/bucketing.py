"""Token-bucketed batches (section 5.1: "sentence pairs were batched together by approximate
sequence length; each training batch contained ... approximately 25000 source tokens and 25000
target tokens").

Examples are grouped by length into buckets; a bucket with boundary L gives batches of shape
[rows, L], so XLA sees one shape per bucket and never recompiles. `tokens_per_batch` counts
real tokens, as the paper does: each bucket's rows are chosen from the lengths of the examples
it holds so that its batches carry about `tokens_per_batch` real tokens per side (the mean of
the source and target sides), within a padded budget of PADDING_ALLOWANCE x tokens_per_batch
slots per side that bounds every shape the run can compile (`padded_budget`). The last,
partial batch of a bucket is completed with empty rows (all padding, weight 0) instead of being
dropped: every example is seen exactly once per epoch.

Both sides are padded to the bucket's boundary by default. With `pad_each_side`, each side is
padded to its own length: the longest of that side among the bucket's examples, rounded up to
the bucket quantum (`side_lengths`), still one shape per bucket and side. Parsing needs it: a
linearized tree is about twice its sentence's pieces, so padding sentences to the tree's length
made 57% of the encoder's positions padding on the treebank sample (38% this way). The
batches hold the same examples either way, in the same order.

This is plain numpy rather than tf.data's bucket_by_sequence_length because the order must be a
pure function of (seed, epoch), so that a resumed run sees exactly the batches that an
uninterrupted run would have seen (`BatchPosition`).

With subword sampling (data/subword_sampling.py) each epoch has its own segmentations of the
pairs, and so its own lengths: the epoch's buckets and order come from them, as from the plain
lengths otherwise. The shapes do not change: the rows of each bucket (and, with
`pad_each_side`, each side's length) are the plain segmentation's, and a sampled pair that would
not fit the batch it lands in (longer than max_length, or than its bucket's side length) is
taken plain in that epoch.
"""
import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Iterator

import numpy as np
from absl import logging

from aiayn_flax.data import ragged, subword_sampling
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


def boundaries_for(dataset) -> list[int]:
  """The bucket boundaries of a config's `dataset` block."""
  return bucket_boundaries(dataset.bucket_min_length, dataset.max_length, dataset.bucket_growth,
                           dataset.bucket_quantum)


# Padded slots a batch may use per real token asked for. With buckets growing by 1.25 a bucket's
# examples fill 80-100% of its length, so its rows can reach tokens_per_batch real tokens
# within this budget; the shortest buckets (lengths 1..8) pad more and stop at the budget.
PADDING_ALLOWANCE = 1.25


def padded_budget(tokens_per_batch: int) -> int:
  """The most padded slots per side of a batch asked to hold `tokens_per_batch` real tokens:
  what memory plans and compiled shapes are sized for."""
  return int(tokens_per_batch * PADDING_ALLOWANCE)


def batch_size_for(boundary: int, padded_tokens: int, batch_multiple: int) -> int:
  """The most rows of padded length `boundary` within `padded_tokens` slots per side, as a
  multiple of the data-parallel shards."""
  rows = padded_tokens // boundary // batch_multiple * batch_multiple
  if rows < batch_multiple:
    raise ValueError(f"a batch of {padded_tokens} padded tokens is too small for a bucket of "
                     f"length {boundary} on {batch_multiple} data-parallel shards; raise "
                     "tokens_per_batch")
  return rows


def rows_per_bucket(source_lengths: np.ndarray, target_lengths: np.ndarray,
                    boundaries: list[int], tokens_per_batch: int,
                    batch_multiple: int) -> list[int]:
  """Rows of each bucket's batches: tokens_per_batch over the mean real length (source and
  target averaged) of the bucket's examples, rounded to a multiple of batch_multiple and held
  within padded_budget(tokens_per_batch). A bucket without examples gets the budget's rows."""
  buckets = bucket_of(np.maximum(source_lengths, target_lengths), boundaries)
  counts = np.bincount(buckets, minlength=len(boundaries))
  mean_lengths = (np.bincount(buckets, source_lengths, len(boundaries))
                  + np.bincount(buckets, target_lengths, len(boundaries))) / np.maximum(
                      2 * counts, 1)
  rows = []
  for boundary, count, mean_length in zip(boundaries, counts, mean_lengths):
    most = batch_size_for(boundary, padded_budget(tokens_per_batch), batch_multiple)
    if not count:
      rows.append(most)
      continue
    wanted = round(tokens_per_batch / mean_length / batch_multiple) * batch_multiple
    rows.append(int(min(max(wanted, batch_multiple), most)))
  return rows


def side_lengths(source_lengths: np.ndarray, target_lengths: np.ndarray,
                 boundaries: list[int], rows: list[int], quantum: int) -> list[tuple[int, int]]:
  """(source length, target length) of each bucket's batches when each side is padded to its
  own length: the longest of that side among the bucket's examples, rounded up to a multiple of
  `quantum` (at most the bucket's boundary: a bucket is chosen by the longer side).

  The trainer stacks consecutive batches whose source shapes agree (trainer.RunsOfOneShape), so
  two buckets never share a source shape [rows, length] with different target shapes: the later
  bucket's source length grows by `quantum` until its shape is its own."""
  buckets = bucket_of(np.maximum(source_lengths, target_lengths), boundaries)
  round_up = lambda n: -(-int(n) // quantum) * quantum  # noqa: E731
  target_of_source_shape = {}
  sides = []
  for b, boundary in enumerate(boundaries):
    members = buckets == b
    if not members.any():
      sides.append((boundary, boundary))
      continue
    source = min(round_up(source_lengths[members].max()), boundary)
    target = min(round_up(target_lengths[members].max()), boundary)
    while target_of_source_shape.get((rows[b], source), target) != target:
      source += quantum
    target_of_source_shape[(rows[b], source)] = target
    sides.append((source, target))
  return sides


@dataclasses.dataclass(frozen=True)
class Mix:
  """A second set of examples mixed into training (parsing: silver trees beside the gold ones):
  the stream's examples are the `primary` first ones, then the mixed ones. Each epoch holds
  every primary example and round(ratio x primary) mixed ones (all of them at most), taken in
  turn from a reshuffled order of the mixed examples (each seen once before any is seen
  again); from epoch `epochs` on (0: never) an epoch holds the primary examples alone.
  A pure function of (seed, epoch), as the batches are: a resumed run sees the same mix."""
  primary: int
  ratio: float
  epochs: int = 0

  def members(self, total: int, seed: int, epoch: int) -> np.ndarray:
    """The example indices of `epoch` (primary ones first), of `total` examples in all."""
    mixed = total - self.primary
    if mixed <= 0 or self.ratio <= 0 or (self.epochs and epoch >= self.epochs):
      return np.arange(self.primary)
    per_epoch = min(round(self.ratio * self.primary), mixed)
    start = epoch * per_epoch  # in the endless sequence of reshuffled orders
    chosen = []
    while len(chosen) < per_epoch:
      cycle, offset = divmod(start + len(chosen), mixed)
      order = np.random.default_rng([seed, 1, cycle]).permutation(mixed)
      chosen.extend(order[offset:offset + per_epoch - len(chosen)].tolist())
    return np.concatenate([np.arange(self.primary), self.primary + np.asarray(chosen, np.int64)])


@dataclasses.dataclass(frozen=True)
class BatchPosition:
  """Where the batch stream stands: the next batch is number `index` of epoch `epoch`."""
  epoch: int = 0
  index: int = 0


def bucket_of(lengths: np.ndarray, boundaries: list[int]) -> np.ndarray:
  """Index of the smallest boundary >= each length."""
  return np.searchsorted(np.asarray(boundaries), lengths, side="left")


def epoch_batches(lengths: np.ndarray, boundaries: list[int], rows: list[int], seed: int,
                  epoch: int, shuffle: bool = True,
                  group: int = 1) -> list[tuple[int, np.ndarray]]:
  """One epoch as a list of (boundary, example indices with EMPTY_ROW padding).

  `lengths` is max(source length, target length) per example, all <= boundaries[-1]; bucket b's
  batches have rows[b] rows (`rows_per_bucket`). With
  `group` > 1, each bucket's batches come in runs of `group` consecutive batches (the last run
  of a bucket may be shorter), and the runs are shuffled rather than the batches, so that the
  trainer can take `group` steps of one shape in a single call (`steps_per_call`). group=1 is
  the plain shuffle of batches.
  """
  rng = np.random.default_rng([seed, epoch])
  order = rng.permutation(len(lengths)) if shuffle else np.arange(len(lengths))
  buckets = bucket_of(lengths[order], boundaries)
  runs = []
  for b, (boundary, bucket_rows) in enumerate(zip(boundaries, rows)):
    members = order[buckets == b]
    bucket = []
    for start in range(0, len(members), bucket_rows):
      chunk = members[start:start + bucket_rows]
      padded = np.full(bucket_rows, EMPTY_ROW, dtype=np.int64)
      padded[:len(chunk)] = chunk
      bucket.append((boundary, padded))
    runs += [bucket[i:i + group] for i in range(0, len(bucket), group)]
  if shuffle:
    runs = [runs[i] for i in rng.permutation(len(runs))]
  return [batch for run in runs for batch in run]


class TokenBucketedBatches:
  """Endless, resumable stream of {"inputs": [B, L], "targets": [B, L]} int32 batches
  ({"inputs": [B, Ls], "targets": [B, Lt]} with `pad_each_side`: see the module's docstring).
  `sampling`: None (the plain segmentation every epoch), or what makes the
  subword_sampling.SampledEpochs over the same pairs, given the function that fits each sampled
  epoch to these batches (`sampling(fitted)`: functools.partial(SampledEpochs, vocab, sources,
  targets, dataset, seed), say)."""

  def __init__(self, sources: RaggedIds, targets: RaggedIds,
               boundaries: list[int], tokens_per_batch: int, batch_multiple: int = 1,
               seed: int = 0, shuffle: bool = True, group: int = 1,
               pad_each_side: bool = False, quantum: int = 8, mix: Mix | None = None,
               sampling=None):
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
    self.rows = rows_per_bucket(self.sources.lengths(), self.targets.lengths(), boundaries,
                                tokens_per_batch, batch_multiple)
    self.seed = seed
    self.shuffle = shuffle
    self.group = group
    self.pad_each_side = pad_each_side
    self.mix = mix
    # bucket boundary -> (source length, target length) of its batches
    self.side_lengths = dict(zip(boundaries, side_lengths(
        self.sources.lengths(), self.targets.lengths(), boundaries, self.rows, quantum)
        if pad_each_side else zip(boundaries, boundaries)))
    # (the sampling thread hands over the pairs that fit, drawn)
    self.sampling = None if sampling is None else sampling(self._fitted)
    self._sampled = None  # (epoch, sources, targets, lengths) of the last epoch asked for

  def _fitted(self, sources: RaggedIds, targets: RaggedIds):
    """(sources, targets, what to log) of a sampled epoch: each pair sampled where it fits the
    batch it lands in, else plain."""
    source_lengths, target_lengths = sources.lengths(), targets.lengths()
    longest = np.maximum(source_lengths, target_lengths)
    fits = longest <= self.boundaries[-1]
    if self.pad_each_side:  # within the side lengths of the bucket it lands in
      limits = np.array([self.side_lengths[b] for b in self.boundaries])
      bucket = bucket_of(np.minimum(longest, self.boundaries[-1]), self.boundaries)
      fits &= (source_lengths <= limits[bucket, 0]) & (target_lengths <= limits[bucket, 1])
    sources = ragged.choose(fits, sources, self.sources)
    targets = ragged.choose(fits, targets, self.targets)
    tokens = (sources.lengths().sum() + targets.lengths().sum()) / (
        self.sources.lengths().sum() + self.targets.lengths().sum())
    return sources, targets, (f"{fits.sum()} of {len(fits)} pairs (the others too long: "
                              f"plain), {tokens:.3f}x the plain tokens; digest "
                              f"{subword_sampling.ids_digest(sources, targets)}")

  def pairs(self, epoch: int) -> tuple[RaggedIds, RaggedIds, np.ndarray]:
    """(sources, targets, max of their lengths) of an epoch: its sampled segmentations, or
    the plain ones."""
    if self.sampling is None:
      return self.sources, self.targets, self.lengths
    if self._sampled is None or self._sampled[0] != epoch:
      sources, targets, summary = self.sampling.pairs(epoch)
      logging.info("epoch %d: subword segmentations sampled (%s), %s", epoch,
                   self.sampling.setting, summary)
      self._sampled = (epoch, sources, targets, np.maximum(sources.lengths(),
                                                           targets.lengths()))
    return self._sampled[1:]

  def epoch(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    return self._batch_list(self.pairs(epoch)[2], epoch)

  def _batch_list(self, lengths: np.ndarray, epoch: int) -> list[tuple[int, np.ndarray]]:
    if self.mix is None:
      return epoch_batches(lengths, self.boundaries, self.rows, self.seed, epoch,
                           self.shuffle, self.group)
    members = self.mix.members(len(lengths), self.seed, epoch)
    return [(boundary, np.where(indices == EMPTY_ROW, EMPTY_ROW, members[indices]))
            for boundary, indices in epoch_batches(
                lengths[members], self.boundaries, self.rows, self.seed, epoch,
                self.shuffle, self.group)]

  def batch(self, boundary: int, indices: np.ndarray, epoch: int = 0) -> dict[str, np.ndarray]:
    """The batch of `indices` (of `epoch`'s segmentations, where they are sampled)."""
    sources, targets, _ = self.pairs(epoch)
    source_length, target_length = self.side_lengths[boundary]
    return {"inputs": sources.padded_rows(indices, source_length, PAD_ID),
            "targets": targets.padded_rows(indices, target_length, PAD_ID)}

  def iterate(self, start: BatchPosition = BatchPosition(), num_epochs: int | None = None,
              rows_of=None) -> Iterator[tuple[BatchPosition, dict]]:
    """Yields (position after this batch, batch), from `start` on. `rows_of(n)`, when given,
    names the rows of an n-row batch to build (a host's own: sharding.process_row_indices);
    the batch order, and so every row's content, is the same either way."""
    rows_of = functools.cache(rows_of) if rows_of else None  # a few row counts: one per bucket
    epoch, index = start.epoch, start.index
    while num_epochs is None or epoch < start.epoch + num_epochs:
      batches = self.epoch(epoch)
      for i in range(index, len(batches)):
        following = BatchPosition(epoch, i + 1) if i + 1 < len(batches) else BatchPosition(
            epoch + 1, 0)
        boundary, indices = batches[i]
        yield following, self.batch(boundary, indices[rows_of(len(indices))] if rows_of
                                    else indices, epoch)
      epoch, index = epoch + 1, 0

  def plan_digest(self) -> str:
    """sha256 of what decides the batches (example lengths, buckets, rows, seed, grouping):
    hosts of one run must agree on it (host_agreement)."""
    digest = hashlib.sha256(json.dumps(
        [self.boundaries, self.rows, self.tokens_per_batch, self.batch_multiple, self.seed,
         self.shuffle, self.group, len(self.lengths)]).encode())
    digest.update(np.ascontiguousarray(self.lengths, np.int64).tobytes())
    if self.pad_each_side:  # (a run saved before the option has the digest without it)
      digest.update(json.dumps(sorted(self.side_lengths.items())).encode())
    if self.mix is not None:
      digest.update(json.dumps(dataclasses.asdict(self.mix)).encode())
    if self.sampling is not None:  # (a run without sampling keeps the digest it had)
      digest.update(json.dumps(self.sampling.setting).encode())
    return digest.hexdigest()

  def padding_fraction(self) -> float:
    """Share of padded positions (both sides) in one epoch's batches."""
    return self.epoch_summary()[2]

  def epoch_summary(self) -> tuple[float, float, float]:
    """(mean real source tokens, mean real target tokens, padding fraction) of one epoch's
    batches, from one pass over its batch list; the means leave out each bucket's last,
    partial batch (it is completed with empty rows). Of the plain segmentation."""
    source_lengths, target_lengths = self.sources.lengths(), self.targets.lengths()
    sums, slots = [], 0
    for boundary, indices in self._batch_list(self.lengths, 0):
      slots += sum(self.side_lengths[boundary]) * len(indices)
      if not (indices == EMPTY_ROW).any():
        sums.append((source_lengths[indices].sum(), target_lengths[indices].sum()))
    source, target = np.mean(sums, axis=0) if sums else (0.0, 0.0)
    padding = 1.0 - (source_lengths.sum() + target_lengths.sum()) / slots
    return float(source), float(target), float(padding)
