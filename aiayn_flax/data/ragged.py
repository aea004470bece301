"""Token-id sequences of different lengths in one flat array: the tokenized cache's form, and
what batches are gathered from, whole rows at once."""
import collections.abc
import operator
from collections.abc import Iterator

import numpy as np

EMPTY_ROW = -1  # index of a padding row in a batch's index array


class RaggedIds(collections.abc.Sequence):
  """Token-id sequences in one flat array: sequence i is flat[offsets[i]:offsets[i + 1]].

  A sequence of numpy arrays (views) to its readers, at a fraction of the memory of a list of
  arrays for millions of sentences; also the form the tokenized cache is stored in.
  """

  def __init__(self, flat: np.ndarray, offsets: np.ndarray):
    self.flat, self.offsets = flat, offsets

  def __len__(self) -> int:
    return len(self.offsets) - 1

  def __getitem__(self, index):
    if isinstance(index, slice):
      start, stop, step = index.indices(len(self))
      if step != 1:
        raise ValueError("RaggedIds slices must have step 1")
      return RaggedIds(self.flat, self.offsets[start:max(start, stop) + 1])
    i = operator.index(index)
    if i < 0:
      i += len(self)
    if not 0 <= i < len(self):
      raise IndexError(f"index {index} out of range for {len(self)} sequences")
    return self.flat[self.offsets[i]:self.offsets[i + 1]]

  def __iter__(self) -> Iterator[np.ndarray]:
    bounds = self.offsets.tolist()
    for start, stop in zip(bounds[:-1], bounds[1:]):
      yield self.flat[start:stop]

  def lengths(self) -> np.ndarray:
    return np.diff(self.offsets)

  def padded_rows(self, indices: np.ndarray, length: int, pad_id: int) -> np.ndarray:
    """[len(indices), length] int32: row r holds sequence indices[r] then pad_id, or only
    pad_id where indices[r] is EMPTY_ROW. One gather for the whole batch, no loop per row."""
    real = indices != EMPTY_ROW
    safe = np.where(real, indices, 0)
    starts = self.offsets[safe]
    lengths = np.where(real, self.offsets[safe + 1] - starts, 0)
    if lengths.max(initial=0) > length:
      raise ValueError(f"a sequence of {lengths.max()} tokens does not fit rows of {length}")
    positions = np.arange(length)
    inside = positions < lengths[:, None]
    rows = np.full((len(indices), length), pad_id, dtype=np.int32)
    rows[inside] = self.flat[(starts[:, None] + positions)[inside]]
    return rows


def from_parts(flat_parts: list[np.ndarray], length_parts: list[np.ndarray],
               dtype) -> RaggedIds:
  """Concatenates chunks of flat ids, given with each chunk's sequence lengths."""
  flat = np.concatenate(flat_parts) if flat_parts else np.empty(0, dtype)
  lengths = np.concatenate(length_parts) if length_parts else np.empty(0, np.int64)
  offsets = np.zeros(len(lengths) + 1, np.int64)
  np.cumsum(lengths, out=offsets[1:])
  return RaggedIds(flat, offsets)


def concatenate(parts: list[RaggedIds]) -> RaggedIds:
  """The sequences of `parts`, one after the other, in one RaggedIds."""
  return from_parts([part.flat[part.offsets[0]:part.offsets[-1]] for part in parts],
                    [part.lengths() for part in parts], parts[0].flat.dtype)


def choose(take_first: np.ndarray, first: RaggedIds, second: RaggedIds) -> RaggedIds:
  """Sequence i of `first` where take_first[i], else sequence i of `second` (as many of each)."""
  flat = np.concatenate([first.flat, second.flat])
  starts = np.where(take_first, first.offsets[:-1], second.offsets[:-1] + len(first.flat))
  lengths = np.where(take_first, first.lengths(), second.lengths())
  offsets = np.zeros(len(lengths) + 1, np.int64)
  np.cumsum(lengths, out=offsets[1:])
  gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
  return RaggedIds(flat[gather], offsets)
