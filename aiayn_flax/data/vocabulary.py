"""One SentencePiece vocabulary shared by source and target (the paper's shared BPE, section 5.1).

Ids 0-3 are fixed for every model we train, so that padding, end of sentence and the decoder's
start token mean the same thing everywhere: PAD_ID 0, EOS_ID 1, UNK_ID 2, BOS_ID 3.
"""
from collections.abc import Iterable, Iterator, Sequence
import io
import os

from absl import logging
from etils import epath
import numpy as np
import sentencepiece as spm

from aiayn_flax.runtime import paths

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
BOS_ID = 3

# The trained pieces depend on the trainer's thread count (measured: 2 and 8 threads give
# different models), so it is fixed rather than taken from the machine, for reproducibility.
_TRAINING_THREADS = 8
_LOG_EVERY = 100_000  # sentences


class Vocabulary:
  """A trained SentencePiece model with the fixed special ids above."""

  def __init__(self, model_proto: bytes, model_path: str):
    self._processor = spm.SentencePieceProcessor(model_proto=model_proto)
    self._model_proto = model_proto
    self._model_path = model_path
    _check_special_ids(self._processor, model_path)

  @property
  def vocab_size(self) -> int:
    return self._processor.get_piece_size()

  @property
  def model_path(self) -> str:
    return self._model_path

  @property
  def model_proto(self) -> bytes:
    """The serialized SentencePiece model (its pieces and their log probabilities)."""
    return self._model_proto

  def encode(self, text: str) -> list[int]:
    """Piece ids of text, without EOS (the input pipeline adds it)."""
    return self._processor.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self._processor.encode(list(texts), out_type=int, num_threads=os.cpu_count() or 1)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Text of ids up to the first EOS; PAD and BOS are skipped."""
    return self._processor.decode(_content_ids(ids))

  def decode_batch(self, rows: Iterable[Sequence[int] | np.ndarray]) -> list[str]:
    """decode() of each row (a 2-D array works: one row per sentence)."""
    rows = [_content_ids(row) for row in rows]
    if not rows:
      return []  # sentencepiece would read an empty batch as one empty sentence
    return self._processor.decode(rows, num_threads=os.cpu_count() or 1)

  def piece(self, piece_id: int) -> str:
    return self._processor.id_to_piece(int(piece_id))

  def pieces(self, text: str) -> list[str]:
    """The pieces text is split into, e.g. to label an attention plot."""
    return self._processor.encode(text, out_type=str)


def _content_ids(ids: Sequence[int] | np.ndarray) -> list[int]:
  """Ids before the first EOS, without PAD or BOS, as Python ints."""
  ids = np.asarray(ids, dtype=np.int64)
  if ids.ndim != 1:
    raise ValueError(f"expected one sequence of ids, got shape {ids.shape} (use decode_batch)")
  content = []
  for piece_id in ids.tolist():
    if piece_id == EOS_ID:
      break
    if piece_id not in (PAD_ID, BOS_ID):
      content.append(piece_id)
  return content


def _check_special_ids(processor: spm.SentencePieceProcessor, model_path: str) -> None:
  found = (processor.pad_id(), processor.eos_id(), processor.unk_id(), processor.bos_id())
  if found != (PAD_ID, EOS_ID, UNK_ID, BOS_ID):
    raise ValueError(
        f"{model_path}: special ids (pad, eos, unk, bos) are {found}, "
        f"expected {(PAD_ID, EOS_ID, UNK_ID, BOS_ID)}")


def _counted(sentences: Iterable[str]) -> Iterator[str]:
  """Yields the sentences, logging how many have gone to the trainer."""
  count = 0
  for count, sentence in enumerate(sentences, start=1):
    if count % _LOG_EVERY == 0:
      logging.info("SentencePiece: read %d sentences", count)
    yield sentence
  logging.info("SentencePiece: read %d sentences in all", count)


def train_vocabulary(
    sentences: Iterable[str],
    model_path: str,
    vocab_size: int,
    model_type: str = "unigram",
    byte_fallback: bool = True,
    character_coverage: float = 1.0,
    user_defined_symbols: Sequence[str] = (),
) -> Vocabulary:
  """Trains a vocabulary on sentences (all languages together), writes it to model_path.

  Training is deterministic: the same sentences give a byte-identical model file. With
  byte_fallback, characters unseen in training become UTF-8 byte pieces instead of UNK, so
  every text round-trips (256 of the vocab_size pieces are bytes). A character_coverage below 1
  leaves the rarest characters (that fraction of the character occurrences) out of the pieces:
  they are spelled in bytes, and their slots go to frequent subwords. `user_defined_symbols`
  are pieces kept whole wherever they occur (the parsing task's tree tokens).
  """
  logging.info("SentencePiece: training a %d-piece %s model for %s", vocab_size, model_type,
               model_path)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=_counted(sentences),
      model_writer=model,
      vocab_size=vocab_size,
      model_type=model_type,
      character_coverage=character_coverage,
      pad_id=PAD_ID,
      eos_id=EOS_ID,
      unk_id=UNK_ID,
      bos_id=BOS_ID,
      # Identity, not the default NFKC: NFKC rewrites characters (e.g. U+00B4 in
      # newstest2014), and BLEU is computed on decode() output against untouched references.
      # Keeping repeated and edge spaces likewise makes decode(encode(s)) == s.
      normalization_rule_name="identity",
      remove_extra_whitespaces=False,
      byte_fallback=byte_fallback,
      user_defined_symbols=list(user_defined_symbols),
      num_threads=_TRAINING_THREADS,
      minloglevel=2,  # the trainer's own per-iteration log goes to stderr otherwise
  )
  model_proto = model.getvalue()
  paths.write_atomically(epath.Path(model_path), lambda f: f.write(model_proto))
  vocabulary = Vocabulary(model_proto, model_path)
  logging.info("SentencePiece: wrote %s (%d pieces)", model_path, vocabulary.vocab_size)
  return vocabulary


def load_vocabulary(model_path: str) -> Vocabulary:
  """The vocabulary stored at model_path by train_vocabulary."""
  path = epath.Path(model_path)
  if not path.exists():
    raise FileNotFoundError(
        f"{model_path}: no SentencePiece model there (train_vocabulary writes one)")
  try:
    return Vocabulary(path.read_bytes(), model_path)
  except RuntimeError:  # sentencepiece's "could not parse ModelProto": a cut or damaged file
    raise ValueError(
        f"{model_path}: damaged, not a readable SentencePiece model; restore it from a copy, "
        "or delete it and the tokenized/ folder beside it to train it again (the same data "
        "and seed train the same vocabulary)") from None


def streamed_sample(chunks: Iterable[tuple[list[str], list[str]]], size: int,
                    seed: int) -> list[str]:
  """`size` sentences (0: all) drawn uniformly without replacement from a stream of
  (sources, targets) chunks, in stream order, in one pass: each sentence draws a random key
  and the `size` smallest keys are kept (bottom-k sampling). At most 2 x size sentences, plus
  a chunk, are held at once."""
  rng = np.random.default_rng(seed)
  keys, positions, kept = [], [], []  # arrays of the kept keys and positions, per chunk
  threshold, seen = np.inf, 0
  for sources, targets in chunks:
    sentences = sources + targets
    if not size:
      kept += sentences
      continue
    chunk_keys = rng.random(len(sentences))
    chosen = np.flatnonzero(chunk_keys < threshold)
    keys.append(chunk_keys[chosen])
    positions.append(seen + chosen)
    kept += [sentences[i] for i in chosen]
    seen += len(sentences)
    if len(kept) >= 2 * size:
      keys, positions, kept, threshold = _smallest_keys(keys, positions, kept, size)
  if not size:
    return kept
  if len(kept) > size:
    keys, positions, kept, _ = _smallest_keys(keys, positions, kept, size)
  order = np.argsort(np.concatenate(positions), kind="stable") if positions else []
  return [kept[i] for i in order]


def _smallest_keys(keys, positions, kept, size):
  """The `size` entries with the smallest keys (as one-chunk lists), and the largest of them."""
  keys, positions = np.concatenate(keys), np.concatenate(positions)
  best = np.argpartition(keys, size - 1)[:size]
  return [keys[best]], [positions[best]], [kept[i] for i in best], keys[best].max()
