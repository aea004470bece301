"""Subword regularization: each training epoch segments its pairs anew, sampled from the
vocabulary's lattice (Kudo 2018, a unigram vocabulary; with a BPE one, sentencepiece's
BPE-dropout, Provilkov et al. 2020), while validation, evaluation and translation keep the
plain segmentation. Off (`dataset.subword_sampling_alpha` 0) nothing here runs.

Exact as the rest of the batches: sentence i of epoch e is sampled with a seed of its own,
drawn from (seed, epoch, side). sentencepiece's generator is per thread, and
`set_random_generator_seed` reseeds the calling thread's (checked at start:
`check_reseeding`), so a sentence's segmentation depends on neither the thread, nor the order,
nor the process that samples it: a resumed run, or another host, samples the same epoch.

The text sampled is the plain token ids decoded (the vocabulary's identity normalization and
byte fallback make decode(encode(s)) == s), so every host samples from the token cache it reads
already (tokenized.py): no host needs the corpus' files, nor waits for another's. Sampling a
whole epoch (its lengths decide its buckets) takes a few seconds for Multi30k; an epoch is
sampled on background threads while the one before trains (`SampledEpochs`).
"""
import dataclasses
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from absl import logging

from aiayn_flax.data import ragged, vocabulary
from aiayn_flax.data.ragged import RaggedIds

SIDES = ("both", "source", "target")
_SEED_STREAM = 3  # numpy's seed words [seed, 3, epoch, side]: apart from the shuffle's and Mix's
_CHUNK = 4096  # sentences a sampling thread takes at a time
# Threads that sample an epoch: sentencepiece releases the GIL while it samples. The samples do
# not depend on the count (each sentence has its own seed).
SAMPLING_THREADS = max(1, min(8, (os.cpu_count() or 1) - 1))


@dataclasses.dataclass(frozen=True)
class Setting:
  """config.dataset's subword_sampling_* fields."""
  alpha: float  # unigram: the smoothing exponent of the lattice's probabilities; BPE: dropout
  nbest: int  # unigram: sample among the n best segmentations; -1: the whole lattice
  sides: str  # "both", "source" or "target"

  def samples(self, side: int) -> bool:
    return self.sides == "both" or self.sides == SIDES[1 + side]


def setting_for(dataset) -> Setting | None:
  """The sampling a config's `dataset` block asks for, or None (alpha 0: off)."""
  alpha = dataset.get("subword_sampling_alpha", 0.0)
  if not alpha:
    return None
  return Setting(float(alpha), int(dataset.get("subword_sampling_nbest", -1)),
                 dataset.get("subword_sampling_sides", "both"))


def sentence_seeds(seed: int, epoch: int, side: int, count: int) -> np.ndarray:
  """A sampling seed per sentence (uint32 below 2**32 - 1, which sentencepiece reserves)."""
  rng = np.random.default_rng([seed, _SEED_STREAM, epoch, side])
  return rng.integers(0, 2**32 - 1, count, dtype=np.uint32)


def check_reseeding(vocab, setting: Setting) -> None:
  """Stops unless this sentencepiece reseeds the calling thread's generator, while another
  thread samples with another seed in between: what makes each sentence's sample a function of
  its seed alone."""
  text = "A reproducible sample of subword segmentations, checked once at start."
  first = vocab.sampled_encode([text] * 4, [7, 8, 9, 10], setting.alpha, setting.nbest)
  other = threading.Thread(target=vocab.sampled_encode,
                           args=([text] * 4, [11, 12, 13, 14], setting.alpha, setting.nbest))
  other.start()
  other.join()
  if vocab.sampled_encode([text] * 4, [7, 8, 9, 10], setting.alpha, setting.nbest) != first:
    import sentencepiece
    raise RuntimeError(
        f"sentencepiece {sentencepiece.__version__} does not reseed its generator per thread, "
        "so sampled segmentations would not be reproducible; install the version of "
        "requirements.lock, or set dataset.subword_sampling_alpha=0")


def sample_side(vocab, plain: RaggedIds, setting: Setting, seed: int, epoch: int, side: int,
                threads: int = SAMPLING_THREADS) -> RaggedIds:
  """The sequences of `plain` (ids ending in EOS) segmented again by sampling, each with its
  own seed; a RaggedIds of the same dtype, in the same order, ending in EOS."""
  seeds = sentence_seeds(seed, epoch, side, len(plain))
  bounds = plain.offsets.tolist()

  def chunk(start: int) -> tuple[np.ndarray, np.ndarray]:
    stop = min(start + _CHUNK, len(plain))
    texts = vocab.decode_ids([plain.flat[bounds[i]:bounds[i + 1] - 1].tolist()
                              for i in range(start, stop)])
    pieces = vocab.sampled_encode(texts, seeds[start:stop].tolist(), setting.alpha,
                                  setting.nbest)
    lengths = np.fromiter(map(len, pieces), np.int64, len(pieces)) + 1
    flat = np.empty(int(lengths.sum()), plain.flat.dtype)
    ends = np.cumsum(lengths)
    flat[ends - 1] = vocabulary.EOS_ID
    inside = np.ones(len(flat), bool)
    inside[ends - 1] = False
    flat[inside] = np.fromiter((i for p in pieces for i in p), plain.flat.dtype,
                               int(inside.sum()))
    return flat, lengths

  starts = range(0, len(plain), _CHUNK)
  with ThreadPoolExecutor(max(1, min(threads, len(starts)))) as pool:
    parts = list(pool.map(chunk, starts))
  return ragged.from_parts([flat for flat, _ in parts], [lengths for _, lengths in parts],
                           plain.flat.dtype)


def ids_digest(*sides: RaggedIds) -> str:
  """sha256 of token-id sequences (ids and where each ends): to compare hosts, runs, epochs."""
  digest = hashlib.sha256()
  for ids in sides:
    digest.update(np.ascontiguousarray(ids.flat[ids.offsets[0]:ids.offsets[-1]], np.int64))
    digest.update(np.ascontiguousarray(ids.lengths(), np.int64))
  return digest.hexdigest()


class SampledEpochs:
  """The sampled (sources, targets) of each epoch, the next epoch sampled on a background
  thread while this one trains; one epoch ahead is kept, and the current one."""

  def __init__(self, vocab, sources: RaggedIds, targets: RaggedIds, setting: Setting,
               seed: int):
    check_reseeding(vocab, setting)
    self.vocab, self.sources, self.targets = vocab, sources, targets
    self.setting, self.seed = setting, seed
    self._lock = threading.Lock()
    self._epochs: dict[int, tuple[threading.Event, list]] = {}

  def pairs(self, epoch: int) -> tuple[RaggedIds, RaggedIds]:
    done, result = self._started(epoch)
    if not done.is_set():
      logging.info("epoch %d: waiting for its sampled segmentations", epoch)
    self._started(epoch + 1)  # sampled while this epoch trains
    done.wait()
    if isinstance(result[0], BaseException):
      raise result[0]
    with self._lock:  # only this epoch and the next one stay
      for old in [e for e in self._epochs if e not in (epoch, epoch + 1)]:
        del self._epochs[old]
    return result[0]

  def probe_digest(self, pairs: int = 16) -> str:
    """ids_digest of epoch 0's samples of the first pairs, sampled apart from the epochs: in
    the plan digest, so that hosts whose sentencepiece samples otherwise disagree at start."""
    return ids_digest(*(
        sample_side(self.vocab, plain[:pairs], self.setting, self.seed, 0, side, threads=1)
        if self.setting.samples(side) else plain[:pairs]
        for side, plain in enumerate((self.sources, self.targets))))

  def _started(self, epoch: int) -> tuple[threading.Event, list]:
    with self._lock:
      if epoch not in self._epochs:
        entry = self._epochs[epoch] = (threading.Event(), [None])
        threading.Thread(target=self._sample, args=(epoch, *entry), daemon=True,
                         name=f"subword-sampling-{epoch}").start()
      return self._epochs[epoch]

  def _sample(self, epoch: int, done: threading.Event, result: list) -> None:
    try:
      result[0] = tuple(
          sample_side(self.vocab, plain, self.setting, self.seed, epoch, side)
          if self.setting.samples(side) else plain
          for side, plain in enumerate((self.sources, self.targets)))
    except BaseException as error:  # noqa: BLE001 - raised where the epoch is asked for
      result[0] = error
    done.set()
