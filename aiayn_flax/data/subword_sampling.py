"""Subword regularization (Kudo 2018): each training epoch segments its pairs anew, sampled from
the unigram vocabulary's lattice with probability proportional to P(segmentation)^alpha,
while validation, evaluation and translation keep the plain (most probable) segmentation. Off
(`dataset.subword_sampling_alpha` 0), nothing here runs.

Why not sentencepiece's own sampler (`encode(enable_sampling=True)`): its generator cannot be
made reproducible. Version 0.2.3 (measured): `set_random_generator_seed(s)` makes a thread's
draws repeat within one process, but two processes seeded alike draw differently (its seeds
are salted per process), and batch calls on several threads draw differently again. A resumed
run or a second host would train on other segmentations. So the sampling is ours, exact:

- A vocabulary trained to split by whitespace (ours always is) has no piece that crosses a word
  boundary ("▁" starts a word and appears in no piece but at its start), so a sentence's lattice
  is its words' lattices one after the other, and sampling a sentence is sampling each word
  alone. Each distinct word of the training text (read from the plain token ids: the token
  cache, which every host reads already) gets its lattice once per run: every vocabulary piece
  matching each span of it, weighed alpha x the piece's log probability. The forward pass gives
  each position the probability of each piece ending there, what forward-filtering
  backward-sampling draws from (`WordLattices`).
- An epoch is then drawn for all words at once, backwards from each word's end, one piece per
  step, with numpy's generators seeded by (seed, epoch, side, chunk of words): a function of
  those alone, on any host, after any restart, on any number of threads. It takes a fraction
  of a second for Multi30k.

EOS, byte-fallback pieces and user-defined symbols are units of their own, never split nor
joined to a neighbour; only NORMAL pieces are sampled. A sampled segmentation decodes to the
same text.
"""
import dataclasses
import hashlib
import heapq
import itertools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from absl import logging

from aiayn_flax.data import ragged
from aiayn_flax.data.ragged import RaggedIds

SIDES = ("both", "source", "target")
_SEED_STREAM = 3  # seed words [seed, 3, epoch, side, chunk]: apart from the shuffle's and Mix's
_WORD_BEGIN = "\u2581"  # sentencepiece's "▁": a piece that starts a word starts with it
_NORMAL = 1  # ModelProto.SentencePiece.Type.NORMAL: the pieces a lattice is made of
_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)
_UNITS_PER_DRAW = 1 << 18  # words drawn at a time, each chunk with its own generator
_DIGEST_CHUNK = 1 << 20  # ids cast to int64 at a time by ids_digest (8 MB)
# Threads that draw an epoch's chunks (numpy releases the GIL in its large operations): the
# chunks, not the threads, decide the draws.
DRAWING_THREADS = max(1, min(4, (os.cpu_count() or 1) // 2))


def setting_for(dataset) -> dict | None:
  """The sampling a config's `dataset` block asks for (its subword_sampling_* fields, read here
  alone), or None (alpha 0: off). The short names are those the plan digest has named the
  setting by since sampling existed (bucketing.plan_digest): a saved run's digest stays."""
  if not dataset.subword_sampling_alpha:
    return None
  return {"alpha": float(dataset.subword_sampling_alpha),
          "sides": dataset.subword_sampling_sides,  # "both", "source" or "target"
          "nbest": int(dataset.subword_sampling_nbest)}  # -1: a word's whole lattice


class PieceTable:
  """What the lattices need of a unigram vocabulary: each piece's text, log probability and
  whether it is a NORMAL piece (the others are never sampled)."""

  def __init__(self, model_proto: bytes):
    from sentencepiece import sentencepiece_model_pb2
    proto = sentencepiece_model_pb2.ModelProto.FromString(model_proto)
    trainer = proto.trainer_spec
    if (trainer.model_type != trainer.UNIGRAM or not trainer.split_by_whitespace
        or trainer.treat_whitespace_as_suffix):
      raise ValueError("subword sampling needs a unigram vocabulary split by whitespace "
                       "(dataset.vocab_model_type=unigram, in a fresh workdir)")
    self.texts = [piece.piece for piece in proto.pieces]
    self.log_probs = [piece.score for piece in proto.pieces]
    self.normal = np.array([piece.type == _NORMAL for piece in proto.pieces])
    self.begins_word = np.array([text.startswith(_WORD_BEGIN) for text in self.texts])
    self.ids = {text: i for i, text in enumerate(self.texts) if self.normal[i]}
    self.longest = max(map(len, self.ids))


def _units(flat: np.ndarray, pieces: PieceTable) -> tuple[np.ndarray, np.ndarray]:
  """(start, length) of each unit of a flat id array: a word (NORMAL pieces from one that
  starts with "▁", or from a sentence's start, to the next such), or any other piece alone."""
  normal = pieces.normal[flat]
  begins = np.ones(len(flat), bool)
  begins[1:] = pieces.begins_word[flat[1:]] | ~normal[1:] | ~normal[:-1]
  starts = np.flatnonzero(begins)
  return starts, np.diff(np.append(starts, len(flat)))


def _unit_types(flat, starts, lengths) -> tuple[np.ndarray, np.ndarray]:
  """(index of a representative of each distinct unit, the type of every unit): units hashed
  by their ids, and every unit then checked id by id against its type's representative."""
  position = np.arange(len(flat)) - np.repeat(starts, lengths)
  powers = np.cumprod(np.full(int(lengths.max()), _HASH_BASE, np.uint64)) if len(flat) else []
  terms = (flat.astype(np.uint64) + np.uint64(1)) * np.asarray(powers, np.uint64)[position]
  hashes = np.add.reduceat(terms, starts) ^ (lengths.astype(np.uint64) * np.uint64(0x51ED27))
  _, first, types = np.unique(hashes, return_index=True, return_inverse=True)
  representative = starts[first][types]
  same = (flat == flat[np.repeat(representative, lengths) + position]).all() and (
      lengths == lengths[first][types]).all()
  if not same:  # two different words with one 64-bit hash: never seen, but never trained on
    raise RuntimeError("subword sampling: two words hashed alike; set "
                       "dataset.subword_sampling_alpha=0 and report it")
  return first, types.reshape(-1)


@dataclasses.dataclass
class WordLattices:
  """Forward-filtering tables of the distinct words, flattened: node n of word w is
  node_base[w] + n (n = 0..characters). The pieces that end at a node are consecutive edges
  from node_first[node], each with its piece id, the node it starts at (within its word) and
  the cumulative probability of choosing it or an edge before it (1 for a node's last)."""
  node_base: np.ndarray  # [words]
  ends: np.ndarray  # [words]: node of the word's end, within the word (its characters)
  node_first: np.ndarray  # [nodes]: a node's first edge (any value where none ends there)
  edge_piece: np.ndarray  # [edges]
  edge_from: np.ndarray  # [edges]
  edge_cumulative: np.ndarray  # [edges]

  @classmethod
  def build(cls, unit_ids: list[np.ndarray], pieces: PieceTable, alpha: float,
            nbest: int = -1):
    """The tables of each unit (the ids of its plain segmentation): its whole lattice, or
    with `nbest` > 1 its n most probable segmentations side by side, each a chain of nodes
    from the start to the one end node (`_nbest_chains`). Plain Python: a word has a few dozen
    spans, too few for numpy to pay."""
    node_base, ends, node_first, edge_piece, edge_from, cumulatives = [], [], [], [], [], []
    piece_ids, log_probs, longest = pieces.ids, pieces.log_probs, pieces.longest
    nodes = 0
    for ids in unit_ids:
      node_base.append(nodes)
      if not pieces.normal[ids[0]]:  # kept whole: one edge, the piece itself
        ends.append(1)
        node_first += [len(edge_piece)] * 2
        edge_piece.append(int(ids[0]))
        edge_from.append(0)
        cumulatives.append(1.0)
        nodes += 2
        continue
      text = "".join(pieces.texts[i] for i in ids)
      if nbest > 1:
        chains = _nbest_chains(text, pieces, alpha, nbest)
        ends.append(1)
        for node_edges in chains:
          node_first.append(len(edge_piece))
          for begin, piece, cumulative in node_edges:
            edge_piece.append(piece)
            edge_from.append(begin)
            cumulatives.append(cumulative)
        nodes += len(chains)
        continue
      forward = [0.0] + [-math.inf] * len(text)  # log of the weight of the paths to a node
      node_first.append(len(edge_piece))  # node 0: no piece ends there
      for end in range(1, len(text) + 1):
        node_first.append(len(edge_piece))
        begins, found, weights = [], [], []
        for begin in range(max(0, end - longest), end):
          piece = piece_ids.get(text[begin:end])
          if piece is not None and forward[begin] > -math.inf:
            begins.append(begin)
            found.append(piece)
            weights.append(forward[begin] + alpha * log_probs[piece])
        if weights:  # (else no path reaches this position: it is never drawn from)
          top = max(weights)
          shares = [math.exp(w - top) for w in weights]
          total = sum(shares)
          forward[end] = top + math.log(total)
          cumulative = list(itertools.accumulate(share / total for share in shares))
          cumulative[-1] = 1.0  # exactly: a draw (below 1) never passes a node's last edge
          edge_piece += found
          edge_from += begins
          cumulatives += cumulative
      ends.append(len(text))
      nodes += len(text) + 1
    return cls(np.array(node_base, np.int64), np.array(ends, np.int64),
               np.array(node_first, np.int64), np.array(edge_piece, np.int32),
               np.array(edge_from, np.int64), np.array(cumulatives, np.float64))

  def draw(self, words: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(pieces, count per word): a segmentation of each of `words` (word indices), drawn
    backwards from each word's end, one piece per step for the words not yet at their start;
    the pieces of word i are in order, after word i - 1's."""
    base = self.node_base[words]
    node = base + self.ends[words]
    drawing = np.arange(len(words))
    pieces, owners, steps = [], [], []
    step = 0
    while len(drawing):
      # The first of the node's edges whose cumulative probability exceeds a uniform draw: the
      # first edge is the likeliest to be taken (the longest piece), so few words step on.
      draw = rng.random(len(drawing))
      edge = self.node_first[node]
      stepping = np.flatnonzero(self.edge_cumulative[edge] <= draw)
      while len(stepping):
        edge[stepping] += 1
        stepping = stepping[self.edge_cumulative[edge[stepping]] <= draw[stepping]]
      pieces.append(self.edge_piece[edge])
      owners.append(drawing)
      steps.append(np.full(len(drawing), step, np.int32))
      start = self.edge_from[edge]
      going_on = start != 0
      drawing, base = drawing[going_on], base[going_on]
      node = base + start[going_on]
      step += 1
    if not pieces:
      return np.empty(0, np.int32), np.zeros(len(words), np.int64)
    pieces, owners, steps = (np.concatenate(parts) for parts in (pieces, owners, steps))
    counts = np.bincount(owners, minlength=len(words))
    ends = np.cumsum(counts)  # step s of a word is its piece s from the end
    ordered = np.empty(len(pieces), np.int32)
    ordered[ends[owners] - 1 - steps] = pieces
    return ordered, counts


def _nbest_chains(text: str, pieces: PieceTable, alpha: float,
                  nbest: int) -> list[list[tuple[int, int, float]]]:
  """A word's `nbest` most probable segmentations (Kudo's l-best, per word) as a lattice of
  chains: per local node, its edges (start node, piece, cumulative probability). Node 0 is the
  start, node 1 the end, whose edges are the segmentations' last pieces, weighed by their
  probability^alpha; each segmentation's other nodes have the one edge that leads to them."""
  ending = [[] for _ in range(len(text) + 1)]  # per position: (start, piece) of the pieces
  for end in range(1, len(text) + 1):
    for begin in range(max(0, end - pieces.longest), end):
      piece = pieces.ids.get(text[begin:end])
      if piece is not None:
        ending[end].append((begin, piece))
  best = [[(0.0, -1, -1, -1)]] + [[] for _ in text]  # per position: (log P, start, piece, rank)
  for end in range(1, len(text) + 1):
    best[end] = heapq.nlargest(nbest, [
        (score + pieces.log_probs[piece], begin, piece, rank)
        for begin, piece in ending[end] for rank, (score, *_) in enumerate(best[begin])])
  chains, last_edges = [[], []], []
  for score, begin, piece, rank in best[len(text)]:
    path = []  # the segmentation's pieces, last first
    position, entry = len(text), (score, begin, piece, rank)
    while position:
      path.append(entry[2])
      position, entry = entry[1], best[entry[1]][entry[3]] if entry[1] else None
    before = 0  # the node after the previous piece: 0 at the start
    for piece_id in reversed(path[1:]):
      chains.append([(before, piece_id, 1.0)])
      before = len(chains) - 1
    last_edges.append((before, path[0], alpha * score))
  top = max(weight for _, _, weight in last_edges)
  shares = [math.exp(weight - top) for _, _, weight in last_edges]
  cumulative = list(itertools.accumulate(share / sum(shares) for share in shares))
  cumulative[-1] = 1.0
  chains[1] = [(begin, piece, c) for (begin, piece, _), c in zip(last_edges, cumulative)]
  return chains


class SampledEpochs:
  """The sampled (sources, targets) of each epoch, drawn on a background thread one epoch ahead
  of the one that trains; the current and the next one are kept. `fitted(sources, targets)`,
  the batches' (bucketing.TokenBucketedBatches), runs there too: what `pairs` returns (by
  default the pairs as drawn, and nothing to log)."""

  def __init__(self, vocab, sources: RaggedIds, targets: RaggedIds, dataset, seed: int,
               fitted=None):
    """`dataset`: a config's dataset block, whose subword_sampling_* fields say how to sample
    (`setting_for`; alpha not 0)."""
    self.setting, self.seed = setting_for(dataset), seed
    self.sources, self.targets = sources, targets
    pieces = PieceTable(vocab.model_proto)
    self._sides = []  # per side: (sentence of each unit, type of each unit, lattices) or None
    for side, plain in enumerate((sources, targets)):
      if self.setting["sides"] not in ("both", SIDES[1 + side]):
        self._sides.append(None)
        continue
      flat = np.asarray(plain.flat[plain.offsets[0]:plain.offsets[-1]], np.int64)
      starts, lengths = _units(flat, pieces)
      first, types = _unit_types(flat, starts, lengths)
      lattices = WordLattices.build([flat[starts[i]:starts[i] + lengths[i]] for i in first],
                                    pieces, self.setting["alpha"], self.setting["nbest"])
      sentence = np.searchsorted(plain.offsets, plain.offsets[0] + starts, side="right") - 1
      self._sides.append((sentence.astype(np.int32), types.astype(np.int32), lattices))
      logging.info("subword sampling: %d distinct words in %d on side %d", len(first),
                   len(starts), side)
    self.fitted = fitted or (lambda sources, targets: (sources, targets, ""))
    self._lock = threading.Lock()
    self._epochs: dict[int, tuple[threading.Event, list]] = {}

  def sample(self, epoch: int, side: int) -> RaggedIds:
    """Epoch `epoch`'s segmentations of one side (the plain ones where it is not sampled)."""
    plain = (self.sources, self.targets)[side]
    if self._sides[side] is None:
      return plain
    sentence, types, lattices = self._sides[side]

    def draw(chunk: int):  # each chunk of words its own generator: any thread may draw it
      rng = np.random.default_rng([self.seed, _SEED_STREAM, epoch, side, chunk])
      return lattices.draw(types[chunk * _UNITS_PER_DRAW:(chunk + 1) * _UNITS_PER_DRAW], rng)

    chunks = range(-(-len(types) // _UNITS_PER_DRAW))
    with ThreadPoolExecutor(max(1, min(DRAWING_THREADS, len(chunks)))) as pool:
      drawn = list(pool.map(draw, chunks))
    flats = [flat for flat, _ in drawn]
    counts = np.concatenate([count for _, count in drawn]) if drawn else np.empty(0, np.int64)
    lengths = np.bincount(sentence, weights=counts, minlength=len(plain)).astype(np.int64)
    return ragged.from_parts([np.concatenate(flats).astype(plain.flat.dtype)], [lengths],
                             plain.flat.dtype)

  def pairs(self, epoch: int) -> tuple:
    done, result = self._started(epoch)
    if not done.is_set():
      logging.info("epoch %d: waiting for its sampled segmentations", epoch)
    self._started(epoch + 1)  # drawn while this epoch trains
    done.wait()
    if isinstance(result[0], BaseException):
      raise result[0]
    with self._lock:  # only this epoch and the next one stay
      for old in [e for e in self._epochs if e not in (epoch, epoch + 1)]:
        del self._epochs[old]
    return result[0]

  def _started(self, epoch: int) -> tuple[threading.Event, list]:
    with self._lock:
      if epoch not in self._epochs:
        entry = self._epochs[epoch] = (threading.Event(), [None])
        threading.Thread(target=self._draw, args=(epoch, *entry), daemon=True,
                         name=f"subword-sampling-{epoch}").start()
      return self._epochs[epoch]

  def _draw(self, epoch: int, done: threading.Event, result: list) -> None:
    try:
      result[0] = self.fitted(self.sample(epoch, 0), self.sample(epoch, 1))
    except BaseException as error:  # noqa: BLE001 - raised where the epoch is asked for
      result[0] = error
    done.set()


def ids_digest(*sides: RaggedIds) -> str:
  """sha256 of token-id sequences (ids and where each ends): to compare hosts, runs, epochs.
  The ids are hashed as int64 whatever their dtype, a chunk at a time: no copy of an epoch."""
  digest = hashlib.sha256()
  for ids in sides:
    flat = ids.flat[ids.offsets[0]:ids.offsets[-1]]
    for start in range(0, len(flat), _DIGEST_CHUNK):
      digest.update(np.ascontiguousarray(flat[start:start + _DIGEST_CHUNK], np.int64))
    digest.update(np.ascontiguousarray(ids.lengths(), np.int64))
  return digest.hexdigest()
