"""Decoding that can only write trees over the input's words.

At every step the decoder may choose only among the tokens that keep the sequence a prefix of
a well-formed tree over exactly the sentence's words (the log-probs the searches of
`decoding/` read are rewritten; the model itself is untouched). For a sequence so far with
`depth` brackets open, having placed `done` of the sentence's `n` units (a unit is a source
piece when the trees write the words, a word when they write XX):

  * an opening bracket `(X`: while units remain (a constituent over no word is impossible)
    and the length limit leaves room to place them and close every bracket;
  * the closing bracket `)`: when a bracket is open and the last token did not just open it,
    and, until every unit is placed, only an inner one (the root closes last);
  * a unit: inside a bracket, while units remain; with words as leaves only the next source
    piece itself (the output copies the input), and it gets the probability of every word
    piece: the model chooses between a bracket and "a word", the input says which word (a
    mask alone let a model that wanted another word open bracket after bracket,
    docs/PARSING.md); with XX leaves `XX`;
  * EOS: once every unit is placed and every bracket closed.

With words as leaves a bracket never splits a word: brackets may come only before a piece
that starts a word (SentencePiece's U+2581) or after the last piece. The training targets
are such sequences: their word pieces are the sentence's pieces in order (on the sample, all
3,914 trees but one, whose label `(WHADJP` occurs in no training tree). So the repair
(linearize.repair) has nothing left to mend, as long as the length limit leaves room for
the words and two brackets.

The state is recounted from the sequence at every step (a few sums over its length per
hypothesis) rather than carried by the search, so the search needs no parsing state.
"""
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from aiayn_flax.data import vocabulary
from aiayn_flax.decoding import NEG_INF, ConstrainLogProbs
from aiayn_flax.parsing import linearize

WORD_START = "\u2581"  # SentencePiece's mark of a piece that begins a word


class TreeTokens:
  """Each vocabulary id's role in a linearized tree, as bool[V] tables."""

  def __init__(self, pieces: Sequence[str], leaves: str):
    if leaves not in linearize.LEAVES:
      raise ValueError(f"leaves={leaves!r}: expected one of {linearize.LEAVES}")
    self.leaves = leaves
    pieces = list(pieces)
    tokens = [piece[1:] if piece.startswith(WORD_START) else None for piece in pieces]
    placeholders = np.array([t == linearize.PLACEHOLDER for t in tokens])
    special = np.zeros(len(pieces), bool)
    special[[vocabulary.PAD_ID, vocabulary.EOS_ID, vocabulary.BOS_ID]] = True
    self.opens = np.array([t is not None and linearize.open_label(t) is not None
                           for t in tokens]) & ~special
    self.closes = np.array([t == linearize.CLOSE for t in tokens]) & ~special
    self.starts_word = np.array([piece.startswith(WORD_START) for piece in pieces])
    if leaves == "XX":
      self.units = placeholders & ~special
    else:  # every piece that is not a bracket, XX or a special id is part of a word
      self.units = ~(self.opens | self.closes | special | placeholders)
    if not self.opens.any() or not self.closes.any() or not self.units.any():
      raise ValueError("the vocabulary lacks the tree tokens (`(X` labels, `)`, XX) as "
                       "pieces of their own: was it trained for a treebank?")

  def constrain_log_probs(self, sources: jax.Array, max_lengths: jax.Array) -> ConstrainLogProbs:
    """The decoding constraint for a batch of sources (int32[B, S]: piece ids, EOS, PAD after)
    whose outputs may have max_lengths[b] tokens (int32[B], EOS included)."""
    opens, closes, units = (jnp.asarray(t) for t in (self.opens, self.closes, self.units))
    starts_word = jnp.asarray(self.starts_word)
    is_content = (sources != vocabulary.PAD_ID) & (sources != vocabulary.EOS_ID)  # [B, S]
    if self.leaves == "words":
      source_units = jnp.sum(is_content, axis=1)  # [B]: pieces to copy
    else:
      source_units = jnp.sum(is_content & starts_word[sources], axis=1)  # [B]: words
    vocab_ids = jnp.arange(opens.shape[0])  # [V]

    def constrain(log_probs: jax.Array, sequences: jax.Array, step: jax.Array) -> jax.Array:
      # log_probs: [B, K, V]; sequences: [B, K, L], PAD from `step` on.
      done = jnp.sum(units[sequences], axis=-1)  # [B, K]: units placed
      depth = jnp.sum(opens[sequences], axis=-1) - jnp.sum(closes[sequences], axis=-1)  # [B, K]
      just_opened = opens[_last_token(sequences, step)]  # [B, K]
      remaining = done < source_units[:, None]  # [B, K]
      if self.leaves == "words":
        next_piece = jnp.take_along_axis(
            sources, jnp.minimum(done, sources.shape[1] - 1), axis=1)  # [B, K]
        at_word_start = ~remaining | starts_word[next_piece]  # [B, K]
        # Writing any word means writing the next one: it gets all the words' probability.
        word_log_prob = jax.nn.logsumexp(jnp.where(units, log_probs, NEG_INF), axis=-1)  # [B, K]
        is_next = vocab_ids == next_piece[..., None]  # [B, K, V]
        log_probs = jnp.where(units, jnp.where(is_next, word_log_prob[..., None], NEG_INF),
                              log_probs)  # [B, K, V]
      else:
        at_word_start = jnp.ones_like(remaining)
      # An opening bracket needs a token, then room for the units left, one `)` per open
      # bracket and EOS: a tree always ends within the length limit.
      limit = jnp.minimum(max_lengths, sequences.shape[-1])[:, None]  # [B, 1]
      room_to_open = step + 1 + (source_units[:, None] - done) + (depth + 1) + 1 <= limit
      may_open = remaining & at_word_start & room_to_open  # [B, K]
      may_close = ((depth > 0) & ~just_opened & at_word_start
                   & ((depth > 1) | ~remaining))  # [B, K]
      may_place = remaining & (depth > 0)  # [B, K]
      may_end = ~remaining & (depth == 0)  # [B, K]
      allowed = ((opens & may_open[..., None]) | (closes & may_close[..., None])
                 | (units & may_place[..., None])
                 | ((vocab_ids == vocabulary.EOS_ID) & may_end[..., None]))  # [B, K, V]
      return jnp.where(allowed, log_probs, NEG_INF)

    return constrain


class StandInVocabulary:
  """vocab_size pieces with every role (specials, `(S`, `)`, XX, words): the decoding program
  depends on the vocabulary's size, not on which piece plays which role, so a dry run compiles
  with these what evaluate.py runs with a trained vocabulary."""

  ROLES = ["<pad>", "</s>", "<unk>", "<s>", WORD_START + "(S", WORD_START + linearize.CLOSE,
           WORD_START + linearize.PLACEHOLDER]

  def __init__(self, vocab_size: int):
    self.vocab_size = vocab_size

  def piece(self, piece_id: int) -> str:
    return self.ROLES[piece_id] if piece_id < len(self.ROLES) else f"{WORD_START}w{piece_id}"


def _last_token(sequences: jax.Array, step: jax.Array) -> jax.Array:
  """sequences[..., step - 1] (PAD at step 0): the token the next one follows."""
  last = jax.lax.dynamic_index_in_dim(sequences, jnp.maximum(step - 1, 0), axis=-1,
                                      keepdims=False)
  return jnp.where(step > 0, last, vocabulary.PAD_ID)
