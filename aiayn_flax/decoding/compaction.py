"""How a search's loop runs: in stages of a growing cache (CacheStages), and, once few
sentences are left, on those alone (Compaction), part by part of a batch split over
devices. `_run_search` runs a search's loop to its end either way.
"""
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from aiayn_flax.decoding.contract import Cache, TokensToLogits


class CacheStages(NamedTuple):
  """A cache grown as decoding goes on: the initial cache holds lengths[0] steps; once that
  many tokens are generated the search calls grow(cache, lengths[1]), and so on. The last
  length is max_decode_len. Each stage is its own loop, so the model's step is compiled once
  per stage; the result does not depend on the stages."""
  lengths: tuple[int, ...]  # increasing
  grow: Callable[[Cache, int], Cache]


def _while_loop_in_stages(not_done, body, state, stages: CacheStages | None,
                          max_decode_len: int, cache_field: str):
  """lax.while_loop(not_done, body, state), run stage by stage (see CacheStages); the cache
  is the state's `cache_field`."""
  if stages is None:
    return lax.while_loop(not_done, body, state)
  lengths = tuple(stages.lengths)
  if list(lengths) != sorted(set(lengths)) or lengths[-1] != max_decode_len:
    raise ValueError(f"CacheStages.lengths {lengths} must increase and end at "
                     f"max_decode_len={max_decode_len}")
  for stage, length in enumerate(lengths):
    if stage:
      state = state._replace(**{cache_field: stages.grow(getattr(state, cache_field), length)})
    state = lax.while_loop(lambda s, length=length: not_done(s) & (s.step < length), body,
                           state)
  return state


class Compaction(NamedTuple):
  """Once at most `rows` sentences of a batch of B are not done, the search gathers those into
  a batch of `rows` sentences and runs the remaining steps on it alone (with the cache at its
  full length). In a batch sorted by source length the outputs still differ in length: on
  Multi30k's test2016 at B = 64, a third of the row-steps decode sentences that have ended.
  Each cache leaf holds the B sentences on its leading axis (B rows, or B * K: K per
  sentence); scalar leaves are shared.

  `groups`: the batch is that many equal parts, one per device that decodes its rows, and
  each part keeps rows // groups of its own sentences. No sentence moves to another device:
  a gather across the parts would copy the whole cache onto every device (big's beam search
  on 8 V100s needed 14.0 GB a device so, 6.7 GB part by part: docs/SCALE.md)."""
  rows: int  # static, a multiple of groups
  # sentence indices int32[groups, rows // groups], each within its part (see
  # take_sentences) -> the model's step for those sentences alone (what it reads besides the
  # cache, e.g. the encoder's output, taken with take_sentences).
  tokens_to_logits_for: Callable[[jax.Array], TokensToLogits]
  groups: int = 1  # static


def _parts(leaf, batch_size: int, groups: int):
  """leaf [B * K, ...] -> [groups, B // groups, K, ...]: each part's sentences."""
  per_sentence = _per_sentence(leaf, batch_size)
  return per_sentence.reshape(groups, batch_size // groups, *per_sentence.shape[1:])


def take_sentences(leaf, sentences: jax.Array, batch_size: int):
  """The rows of `sentences` (int32[groups, n]: indices within each of the batch's `groups`
  parts) of a leaf whose leading axis holds batch_size sentences (one row or several per
  sentence), part by part: [groups * n * K, ...]. A gather batched over the parts, so that
  each device reads its own rows only."""
  parts = _parts(leaf, batch_size, sentences.shape[0])
  taken = jax.vmap(lambda part, indices: part[indices])(parts, sentences)  # [G, n, K, ...]
  return taken.reshape(-1, *leaf.shape[1:])


def _put_sentences(leaf, new, sentences: jax.Array, batch_size: int):
  """`leaf` with the rows of `sentences` replaced by `new` (as take_sentences gave them)."""
  parts = _parts(leaf, batch_size, sentences.shape[0])
  new = new.reshape(*sentences.shape, *parts.shape[2:])
  put = jax.vmap(lambda part, indices, rows: part.at[indices].set(rows))(parts, sentences, new)
  return put.reshape(leaf.shape)


def _rows_of_sentences(tree, sentences: jax.Array, batch_size: int):
  """take_sentences on every leaf; scalar leaves untouched."""
  return jax.tree.map(lambda leaf: leaf if jnp.ndim(leaf) == 0 else take_sentences(
      leaf, sentences, batch_size), tree)


def _with_rows_of_sentences(tree, part, sentences: jax.Array, batch_size: int):
  """`tree` with the rows of `sentences` replaced by `part`'s (as _rows_of_sentences gave
  them); scalar leaves are part's."""
  return jax.tree.map(lambda leaf, new: new if jnp.ndim(leaf) == 0 else _put_sentences(
      leaf, new, sentences, batch_size), tree, part)


def _per_sentence(leaf, batch_size: int):
  rows, remainder = divmod(leaf.shape[0], batch_size)
  if remainder or not rows:
    raise ValueError(f"a decoding state leaf of shape {leaf.shape} does not hold "
                     f"{batch_size} sentences on its leading axis")
  return leaf.reshape(batch_size, rows, *leaf.shape[1:])


def _run_search(make_loop, state, last_steps, tokens_to_logits, stages: CacheStages | None,
                max_decode_len: int, cache_field: str, compaction: Compaction | None):
  """Runs a search's loop to its end. make_loop(tokens_to_logits, last_steps) -> (not_done,
  body, sentence_done) for a batch of those sentences; the result is the final state (its
  cache left out when compacted)."""
  batch_size = last_steps.shape[0]
  not_done, body, sentence_done = make_loop(tokens_to_logits, last_steps)
  if compaction is None or not 0 < compaction.rows < batch_size:
    return _while_loop_in_stages(not_done, body, state, stages, max_decode_len, cache_field)
  groups = compaction.groups
  if compaction.rows % groups or batch_size % groups:
    raise ValueError(f"Compaction: {compaction.rows} rows and a batch of {batch_size} must "
                     f"split into its {groups} groups")
  per_group = compaction.rows // groups
  done_by_group = lambda s: sentence_done(s).reshape(groups, -1)  # noqa: E731
  # Go on whole while any part has more sentences left than it keeps.
  many_left = lambda s: not_done(s) & jnp.any(  # noqa: E731
      jnp.sum(~done_by_group(s), axis=1) > per_group)
  state = _while_loop_in_stages(many_left, body, state, stages, max_decode_len, cache_field)
  # Every stage's grow has run: the cache is full length. Each part's sentences not done come
  # first.
  left = jnp.argsort(done_by_group(state), axis=1, stable=True)[:, :per_group].astype(
      jnp.int32)  # [groups, per_group]
  not_done, body, _ = make_loop(compaction.tokens_to_logits_for(left),
                                take_sentences(last_steps, left, batch_size))
  part = lax.while_loop(not_done, body, _rows_of_sentences(state, left, batch_size))
  no_cache = {cache_field: None}
  return _with_rows_of_sentences(state._replace(**no_cache), part._replace(**no_cache), left,
                                 batch_size)
