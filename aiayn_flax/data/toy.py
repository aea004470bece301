"""A synthetic task for tests and smoke runs: reverse a sequence of symbols.

Text is symbol ids written as words ("7 12 5" -> "5 12 7"), so the toy runs through the same
vocabulary, batching, decoding and scoring code as real text.
"""
import numpy as np

from aiayn_flax.data import vocabulary


class SymbolVocabulary:
  """Maps "7 12 5" <-> [7, 12, 5]; ids below FIRST_SYMBOL are the reserved specials."""
  FIRST_SYMBOL = 4

  def __init__(self, vocab_size: int):
    self.vocab_size = vocab_size
    self.model_path = None

  def encode(self, text: str) -> list[int]:
    return [int(word) for word in text.split()]

  def encode_batch(self, texts):
    return [self.encode(t) for t in texts]

  def decode(self, ids) -> str:
    words = []
    for i in np.asarray(ids).tolist():
      if i == vocabulary.EOS_ID:
        break
      if i >= self.FIRST_SYMBOL:
        words.append(str(i))
    return " ".join(words)

  def decode_batch(self, rows):
    return [self.decode(r) for r in rows]

  def pieces(self, text: str) -> list[str]:
    return text.split()


def reversal_pairs(num_examples: int, vocab_size: int, min_symbols: int, max_symbols: int,
                   seed: int) -> tuple[list[str], list[str]]:
  """(sources, targets) as text: random symbol sequences and their reversals."""
  rng = np.random.default_rng(seed)
  sources, targets = [], []
  for _ in range(num_examples):
    length = rng.integers(min_symbols, max_symbols + 1)
    symbols = rng.integers(SymbolVocabulary.FIRST_SYMBOL, vocab_size, size=length)
    sources.append(" ".join(map(str, symbols)))
    targets.append(" ".join(map(str, symbols[::-1])))
  return sources, targets
