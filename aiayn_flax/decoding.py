"""Autoregressive decoding: greedy search, and beam search with the GNMT length penalty.

Both searches know nothing about the model. They drive it through one callback:

  tokens_to_logits(ids: int32[N, 1], cache) -> (logits: float[N, V], new_cache)

`ids` holds, for each of the N rows, the token emitted at the previous step (BOS at the first
step); `cache` is whatever the model needs to go on (self-attention keys/values, encoder output
and padding mask, a position counter...). The cache contract:

  * every array leaf with ndim >= 1 has the rows (N) on its leading axis: beam search repeats
    those rows for the beams (`expand_to_beams`) and reorders them when hypotheses change
    parents (`gather_beams`);
  * scalar leaves (ndim 0, e.g. the current decoding position) are shared by all rows and are
    passed through untouched.

A model may instead keep its per-hypothesis state in place and give beam search its own
`reorder_cache` (see `beam_search`): model.py's decoder does, so that reordering moves a small
table instead of every layer's keys and values.

A model whose step reads its whole cache may also start with a short one and have the search
grow it (`CacheStages`): the search then runs one loop per stage, and between stages calls
`grow(cache, length)`.

The searches run a fixed number of rows every step (static shapes under `jax.jit`), so rows
that have nothing left to say are still fed a token: PAD for finished rows in greedy search, an
arbitrary token for empty beams. Their logits are ignored. With `Compaction`, a search goes on
with the sentences not yet done alone once few are left: rows are decoded independently, so
the results are the same, and the batch's longest sentences no longer carry the rest.

Conventions shared by both searches:

  * outputs hold generated tokens only (no BOS): each hypothesis ends with EOS, then PAD (0);
  * sentence b emits at most `min(max_lengths[b], max_decode_len)` tokens, EOS included: at its
    last allowed step every token but EOS is masked out (EOS keeps the model's log-prob, as in
    fairseq), so every hypothesis returned is complete;
  * EOS is masked out before `min_words` tokens (default 1, fairseq's `--min-len`), unless the
    sentence's max length leaves no room: an output is never empty where it may hold a word.
    Without it, beam search gave an empty translation for some long sentences, whose full
    hypotheses all scored below EOS alone (2 of Multi30k's 1014 validation sentences on the
    quick start's run, with beam 4 and averaging);
  * log-probabilities are computed in float32 whatever the dtype of the logits;
  * a task may rewrite each step's log-probs before the search reads them
    (`constrain_log_probs`, e.g. a parser's trees over the input's words): a token it sets to
    -inf cannot come next. EOS at a sentence's last allowed step keeps the model's log-prob
    whatever it says.
"""
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

PAD_ID = 0
NEG_INF = float("-inf")  # log-prob of an impossible or empty hypothesis

Cache = Any  # a pytree, see the module docstring
TokensToLogits = Callable[[jax.Array, Cache], tuple[jax.Array, Cache]]
# (log_probs float32[B, K, V] of each hypothesis' next token, sequences int32[B, K, L]: its
# tokens so far, PAD from `step` on, step int32[]) -> the log-probs the search uses [B, K, V].
ConstrainLogProbs = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def length_penalty(length, alpha):
  """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016, eq. 14).

  A hypothesis' score is its log-prob divided by this; `length` counts generated tokens, EOS
  included. alpha = 0 gives plain log-probs; alpha > 0 favours longer hypotheses.
  """
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def expand_to_beams(tree: Cache, beam_size: int) -> Cache:
  """Repeats each row beam_size times: leaves [B, ...] -> [B * beam_size, ...].

  Row b * beam_size + k of the result is beam k of sentence b. Scalar leaves are shared and
  returned untouched.
  """
  def expand(leaf):
    if jnp.ndim(leaf) == 0:
      return leaf
    return jnp.repeat(leaf, beam_size, axis=0)  # [B * K, ...]
  return jax.tree.map(expand, tree)


def _select_beams(x: jax.Array, beam_indices: jax.Array) -> jax.Array:
  """Picks beams per sentence: x [B, M, ...], beam_indices int32[B, N] -> [B, N, ...]."""
  batch_index = jnp.arange(x.shape[0])[:, None]  # [B, 1]
  return x[batch_index, beam_indices]  # [B, N, ...]


def gather_beams(tree: Cache, beam_indices: jax.Array) -> Cache:
  """Reorders cache rows by beam: leaves [B * M, ...] -> [B * N, ...].

  Row b * N + n of the result is row b * M + beam_indices[b, n] of the input: beam n of
  sentence b continues from beam beam_indices[b, n]. Scalar leaves are returned untouched.
  """
  batch_size = beam_indices.shape[0]

  def gather(leaf):
    if jnp.ndim(leaf) == 0:
      return leaf
    per_sentence = leaf.reshape(batch_size, -1, *leaf.shape[1:])  # [B, M, ...]
    chosen = _select_beams(per_sentence, beam_indices)  # [B, N, ...]
    return chosen.reshape(-1, *leaf.shape[1:])  # [B * N, ...]
  return jax.tree.map(gather, tree)


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


def top_k_by_chunks(x: jax.Array, k: int, chunk: int = 64) -> tuple[jax.Array, jax.Array]:
  """lax.top_k(x, k) over the last axis, the same values and indices (ties: lower index first),
  computed as the best k chunks of `chunk` elements by their maximum, then the best k elements
  of those chunks. XLA's TopK on CPU reads a row of V elements slowly (5 ms for beam search's
  256 x 8000 log-probs); one max over the row is a fast vectorised pass.

  Why the same: an element of the top k lies in one of the k best chunks. If its chunk c were
  not picked, each of the k picked chunks would have a maximum above it, or equal to it in a
  chunk before c, so k elements would rank before it. The picked chunks are then read in their
  order in x, so ties among their elements are broken as lax.top_k breaks them.
  """
  *batch, size = x.shape
  num_chunks = -(-size // chunk)
  if num_chunks <= k:
    return lax.top_k(x, k)
  padded = jnp.pad(x, [(0, 0)] * len(batch) + [(0, num_chunks * chunk - size)],
                   constant_values=NEG_INF)  # padding comes last, so loses every tie
  chunks = padded.reshape(*batch, num_chunks, chunk)  # [..., C, chunk]
  _, best_chunks = lax.top_k(jnp.max(chunks, axis=-1), k)  # [..., k]
  best_chunks = jnp.sort(best_chunks, axis=-1)  # in x's order
  candidates = jnp.take_along_axis(chunks, best_chunks[..., None], axis=-2)  # [..., k, chunk]
  values, picks = lax.top_k(candidates.reshape(*batch, k * chunk), k)  # [..., k]
  indices = jnp.take_along_axis(best_chunks, picks // chunk, axis=-1) * chunk + picks % chunk
  return values, indices


def best_extensions(logits, alive_log_probs, must_end, cannot_end, eos_id: int, k: int,
                    chunk: int = 64) -> tuple[jax.Array, jax.Array]:
  """The best k one-token extensions of each alive hypothesis, best first: the same values and
  token indices as `top_k_by_chunks(candidates, k, chunk)` of the plain computation

    log_probs = jax.nn.log_softmax(logits)  # [B, K, V]
    log_probs = jnp.where(must_end & (token != eos_id), -inf, log_probs)
    log_probs = jnp.where(cannot_end & (token == eos_id), -inf, log_probs)
    candidates = alive_log_probs[:, :, None] + log_probs,

  without writing the [B, K, V] log-probs or candidates. Why the same: a candidate is
  f(logit) = alive + ((logit - max) - log_sum), each operation monotonic in the logit even as
  rounded in float32, so a chunk's best candidate is f(the chunk's best logit); only the best
  k chunks' candidates are computed, with the same operations as the plain way. A row's max
  is the max of its chunks' maxima (exact), and its log_sum the same expression as
  log_softmax's. On CPU this saves beam search a slow reduction and two passes over the
  [B * K, V] logits per step (docs/PERFORMANCE.md)."""
  # logits: [B, K, V] float32; alive_log_probs: [B, K]; must_end, cannot_end: bool [B, 1, 1]
  *batch, size = logits.shape
  num_chunks = -(-size // chunk)
  padded = jnp.pad(logits, [(0, 0)] * len(batch) + [(0, num_chunks * chunk - size)],
                   constant_values=NEG_INF)
  chunks = padded.reshape(*batch, num_chunks, chunk)  # [B, K, C, chunk]
  chunk_max = jnp.max(chunks, axis=-1)  # [B, K, C]
  row_max = jnp.max(chunk_max, axis=-1, keepdims=True)  # [B, K, 1]: log_softmax's max
  log_sum = jnp.log(jnp.sum(jnp.exp(logits - row_max), axis=-1, keepdims=True))  # [B, K, 1]
  row_max, log_sum = row_max[..., 0], log_sum[..., 0]  # [B, K]

  def candidate(x):  # the candidates of logits x [B, K, ...], as the plain way computes them
    per_row = lambda y: y.reshape(*y.shape, *[1] * (x.ndim - y.ndim))  # noqa: E731
    return per_row(alive_log_probs) + ((x - per_row(row_max)) - per_row(log_sum))

  chunk_best = candidate(chunk_max)  # [B, K, C]
  # At a sentence's last allowed step only EOS may follow: its chunk's best is EOS, the rest
  # are empty.
  eos_best = candidate(logits[..., eos_id])  # [B, K]
  eos_chunk = jnp.arange(num_chunks) == eos_id // chunk  # [C]
  chunk_best = jnp.where(must_end, jnp.where(eos_chunk, eos_best[..., None], NEG_INF),
                         chunk_best)
  # Where EOS may not follow, EOS's chunk ranks by its best other token (its maximum may be
  # EOS, which would take a place among the best k chunks from one that holds a candidate).
  eos_chunk_logits = chunks[..., eos_id // chunk, :]  # [B, K, chunk]
  eos_chunk_best = candidate(jnp.max(jnp.where(jnp.arange(chunk) == eos_id % chunk, NEG_INF,
                                               eos_chunk_logits), axis=-1))  # [B, K]
  chunk_best = jnp.where(cannot_end & eos_chunk, eos_chunk_best[..., None], chunk_best)
  if num_chunks <= k:
    best_chunks = jnp.broadcast_to(jnp.arange(num_chunks), chunk_best.shape)
  else:
    _, best_chunks = lax.top_k(chunk_best, k)  # [B, K, k]
    best_chunks = jnp.sort(best_chunks, axis=-1)  # in the logits' order
  picked = jnp.take_along_axis(chunks, best_chunks[..., None], axis=-2)  # [B, K, k', chunk]
  values = candidate(picked)  # [B, K, k', chunk]
  tokens = best_chunks[..., None] * chunk + jnp.arange(chunk)  # [B, K, k', chunk]
  values = jnp.where((must_end[..., None] & (tokens != eos_id))
                     | (cannot_end[..., None] & (tokens == eos_id)), NEG_INF, values)
  values, picks = lax.top_k(values.reshape(*batch, -1), k)  # [B, K, k]
  return values, jnp.take_along_axis(tokens.reshape(*batch, -1), picks, axis=-1)


def argmax_by_chunks(x: jax.Array, chunk: int = 64) -> jax.Array:
  """jnp.argmax(x, axis=-1) (the first index of the maximum), computed as the first chunk of
  `chunk` elements that holds the maximum, then the first maximum in it. XLA:CPU's argmax (a
  reduction over (value, index) pairs) took 3.5 ms for greedy search's 64 x 8000 logits, a
  quarter of a decoding step; a max per chunk is a fast vectorised pass."""
  *batch, size = x.shape
  num_chunks = -(-size // chunk)
  padded = jnp.pad(x, [(0, 0)] * len(batch) + [(0, num_chunks * chunk - size)],
                   constant_values=NEG_INF)  # padding comes last, so loses every tie
  chunks = padded.reshape(*batch, num_chunks, chunk)  # [..., C, chunk]
  best_chunk = jnp.argmax(jnp.max(chunks, axis=-1), axis=-1)  # [...]
  picked = jnp.take_along_axis(chunks, best_chunk[..., None, None], axis=-2)[..., 0, :]
  return best_chunk * chunk + jnp.argmax(picked, axis=-1)


def _constrained(log_probs, constrain_log_probs, sequences, step, must_end, eos_id):
  """constrain_log_probs(log_probs [B, K, V], sequences, step), but EOS keeps the model's
  log-prob where must_end [B, 1, 1]; without constrain_log_probs, log_probs unchanged."""
  if constrain_log_probs is None:
    return log_probs
  constrained = constrain_log_probs(log_probs, sequences, step)  # [B, K, V]
  keep_eos = must_end & (jnp.arange(log_probs.shape[-1]) == eos_id)  # [B, 1, V]
  return jnp.where(keep_eos, log_probs, constrained)


def _cannot_end(step, last_steps, min_words) -> jax.Array:
  """bool[B]: EOS may not come at this step: one of the first min_words, unless it is the
  sentence's last allowed step."""
  return (step < min_words) & (step < last_steps)


def _last_allowed_steps(max_lengths, max_decode_len: int) -> jax.Array:
  """int32[B]: the step at which each sentence must emit EOS (at the latest)."""
  max_lengths = jnp.asarray(max_lengths, jnp.int32)
  return jnp.clip(max_lengths, 1, max_decode_len) - 1  # [B]


# --------------------------------------------------------------------------------------------
# Greedy search


class _GreedyState(NamedTuple):
  step: jax.Array  # int32[]: tokens generated so far; the next one goes to sequences[:, step]
  last_ids: jax.Array  # int32[B]: the token fed to the model at the next step
  sequences: jax.Array  # int32[B, L]: generated tokens, PAD after EOS and beyond `step`
  finished: jax.Array  # bool[B]: whether the row has emitted EOS
  cache: Cache  # leaves [B, ...]


def greedy_decode(tokens_to_logits: TokensToLogits, cache: Cache, max_lengths: jax.Array,
                  max_decode_len: int, bos_id: int, eos_id: int,
                  cache_stages: CacheStages | None = None,
                  constrain_log_probs: ConstrainLogProbs | None = None,
                  compaction: Compaction | None = None, min_words: int = 1) -> jax.Array:
  """Picks the most likely token at every step (by `constrain_log_probs`, if given).

  Args:
    tokens_to_logits: the model, see the module docstring.
    cache: the model's state before the first step, leaves [B, ...] (scalars shared).
    max_lengths: int32[B], the most tokens (EOS included) row b may generate.
    max_decode_len: static length of the output buffer.
    bos_id, eos_id: token ids fed first / ending a sentence.
    cache_stages: grow the cache as decoding goes on (see CacheStages); None: it is full size.
    constrain_log_probs: see ConstrainLogProbs (called with K = 1); None: the model's.
    compaction: go on with the unfinished rows alone once few are left (see Compaction;
      not with constrain_log_probs, which reads the whole batch's inputs).
    min_words: EOS may not come before this many tokens (see the module docstring).

  Returns:
    int32[B, max_decode_len]: the generated tokens, EOS included, PAD after it. The loop stops
    as soon as every row has emitted EOS.
  """
  batch_size = jnp.shape(max_lengths)[0]
  if compaction is not None and constrain_log_probs is not None:
    raise ValueError("greedy_decode: compaction cannot gather a constraint's inputs")

  def make_loop(tokens_to_logits, last_steps):
    def not_done(state: _GreedyState):
      return (state.step < max_decode_len) & ~jnp.all(state.finished)

    def decode_one_token(state: _GreedyState) -> _GreedyState:
      logits, cache = tokens_to_logits(state.last_ids[:, None], state.cache)  # [B, V]
      if constrain_log_probs is not None:
        must_end = (state.step >= last_steps)[:, None, None]  # [B, 1, 1]
        logits = _constrained(jax.nn.log_softmax(logits.astype(jnp.float32))[:, None],
                              constrain_log_probs, state.sequences[:, None], state.step,
                              must_end, eos_id)[:, 0]  # [B, V]
      cannot_end = _cannot_end(state.step, last_steps, min_words)  # [B]
      logits = logits.at[:, eos_id].set(jnp.where(cannot_end, NEG_INF, logits[:, eos_id]))
      next_ids = argmax_by_chunks(logits).astype(jnp.int32)  # [B]
      next_ids = jnp.where(state.step >= last_steps, eos_id, next_ids)  # [B]: forced EOS
      next_ids = jnp.where(state.finished, PAD_ID, next_ids)  # [B]: nothing after EOS
      sequences = lax.dynamic_update_index_in_dim(
          state.sequences, next_ids, state.step, axis=1)  # [B, L]
      return _GreedyState(
          step=state.step + 1,
          last_ids=next_ids,
          sequences=sequences,
          finished=state.finished | (next_ids == eos_id),
          cache=cache)
    return not_done, decode_one_token, lambda state: state.finished

  initial = _GreedyState(
      step=jnp.array(0, jnp.int32),
      last_ids=jnp.full((batch_size,), bos_id, jnp.int32),
      sequences=jnp.full((batch_size, max_decode_len), PAD_ID, jnp.int32),
      finished=jnp.zeros((batch_size,), bool),
      cache=cache)
  return _run_search(make_loop, initial, _last_allowed_steps(max_lengths, max_decode_len),
                     tokens_to_logits, cache_stages, max_decode_len, "cache",
                     compaction).sequences


# --------------------------------------------------------------------------------------------
# Beam search


class _BeamState(NamedTuple):
  """The loop state: K alive and K finished hypotheses per sentence, each set sorted best first.

  Empty slots (fewer hypotheses than K so far) hold log-prob / score -inf.
  """
  step: jax.Array  # int32[]: tokens generated so far by every alive hypothesis
  alive_seqs: jax.Array  # int32[B, K, L]: generated tokens (no EOS yet), PAD beyond `step`
  alive_log_probs: jax.Array  # float32[B, K]: sum of the tokens' log-probs
  alive_cache: Cache  # the model's state of the alive hypotheses (leaves [B * K, ...])
  finished_seqs: jax.Array  # int32[B, K, L]: ending with EOS, PAD after it
  finished_scores: jax.Array  # float32[B, K]: log-prob / length_penalty(length)


def beam_search(tokens_to_logits: TokensToLogits, cache: Cache, max_lengths: jax.Array,
                max_decode_len: int, bos_id: int, eos_id: int, beam_size: int,
                alpha: float = 0.6,
                reorder_cache: Callable[[Cache, jax.Array], Cache] | None = None,
                num_results: int | None = None,
                cache_stages: CacheStages | None = None,
                constrain_log_probs: ConstrainLogProbs | None = None,
                compaction: Compaction | None = None, min_words: int = 1
                ) -> tuple[jax.Array, jax.Array]:
  """Beam search with the GNMT length penalty, as in tensor2tensor, with fairseq's EOS rule.

  Each sentence keeps K = beam_size alive hypotheses (no EOS yet) and the K best finished ones
  (ending with EOS). One step, per sentence:

    1. score the V one-token extensions of each alive hypothesis: K * V candidates;
    2. keep the best 2K: each parent has only one EOS extension, so at least K of them go on;
    3. the best K that do not end with EOS become the new alive hypotheses, and the cache
       follows them to their parents (`reorder_cache`);
    4. the candidates ending with EOS that rank in the step's best K (those a beam of K would
       hold, as in fairseq) are finished: scored log-prob / length_penalty(length) and merged
       into the K best finished ones. Without the rank condition, beam_size=1 would not be
       greedy search: it would keep an early EOS that greedy search passed over.

  Only the best n = num_results finished hypotheses are returned, and a sentence is done when
  no alive hypothesis can still beat the n-th best finished one, or when it has no alive
  hypothesis left (all have reached the sentence's max length). Log-probs only fall as a
  hypothesis grows, so an alive hypothesis' best possible final score is its log-prob today
  divided by the largest length penalty it may still get (at the sentence's max length when
  alpha >= 0). The loop stops when every sentence is done, or after max_decode_len steps.
  Stopping early never changes the n hypotheses returned; asking for fewer lets it stop sooner
  (a translator that keeps only the best runs fewer steps than one that lists the K best).

  Args:
    tokens_to_logits: the model, see the module docstring.
    cache: the model's state before the first step, leaves [B, ...] (scalars shared); it is
      expanded to [B * beam_size, ...] here. With `reorder_cache`, it is taken as it is.
    max_lengths: int32[B], the most tokens (EOS included) sentence b may generate.
    max_decode_len: static length of the output buffer.
    bos_id, eos_id: token ids fed first / ending a sentence.
    beam_size: static K.
    alpha: length-penalty exponent (0.6 in the paper's setup); may be traced.
    reorder_cache: (cache, parents int32[B, K]) -> the cache of hypotheses that continue
      hypothesis parents[b, k] of sentence b. None: `gather_beams` of every row. A model that
      gives its own also lays its cache out for B * K hypotheses before the first step.
    num_results: static n <= beam_size, how many hypotheses to return per sentence (default:
      beam_size).
    cache_stages: grow the cache as decoding goes on (see CacheStages); None: it is full size.
    constrain_log_probs: see ConstrainLogProbs; None: the model's log-probs.
    compaction: go on with the sentences not done alone once few are left (see Compaction;
      not with constrain_log_probs, which reads the whole batch's inputs).
    min_words: EOS may not come before this many tokens (see the module docstring).

  Returns:
    sequences int32[B, n, max_decode_len] (tokens, EOS included, PAD after it) and scores
    float32[B, n], best first. A sentence with fewer than n possible hypotheses (a tiny max
    length) has empty slots: score -inf, sequence all PAD.
  """
  batch_size = jnp.shape(max_lengths)[0]
  k = beam_size
  n = k if num_results is None else num_results
  if not 1 <= n <= k:
    raise ValueError(f"beam_search: num_results={num_results} must lie in [1, beam_size={k}]")
  if reorder_cache is None:
    cache, reorder_cache = expand_to_beams(cache, k), gather_beams
  if compaction is not None and constrain_log_probs is not None:
    raise ValueError("beam_search: compaction cannot gather a constraint's inputs")

  def make_loop(tokens_to_logits, last_steps):
    batch_size = last_steps.shape[0]

    def sentence_done(state: _BeamState):
      best_alive = state.alive_log_probs[:, 0]  # [B]
      # The largest penalty an alive hypothesis may still get: its length will lie in
      # [step + 1, last_step + 1], and the penalty is monotonic in length.
      largest_penalty = jnp.maximum(length_penalty(state.step + 1, alpha),
                                    length_penalty(last_steps + 1, alpha))  # [B]
      best_possible_score = best_alive / largest_penalty  # [B]
      nth_finished = state.finished_scores[:, n - 1]  # [B]: -inf until n have finished
      return (best_possible_score < nth_finished) | (best_alive == NEG_INF)  # [B]

    def not_done(state: _BeamState):
      return (state.step < max_decode_len) & ~jnp.all(sentence_done(state))

    def decode_one_token(state: _BeamState) -> _BeamState:
      step = state.step
      # 1. Log-probs of all one-token extensions of the alive hypotheses.
      previous_ids = lax.dynamic_index_in_dim(
          state.alive_seqs, jnp.maximum(step - 1, 0), axis=2, keepdims=False)  # [B, K]
      ids = jnp.where(step == 0, bos_id, previous_ids).reshape(batch_size * k, 1)  # [B*K, 1]
      logits, new_cache = tokens_to_logits(ids, state.alive_cache)  # [B*K, V]
      vocab_size = logits.shape[-1]
      if vocab_size < 2:
        raise ValueError("beam search needs a vocabulary of at least 2 tokens")
      logits = logits.astype(jnp.float32).reshape(batch_size, k, vocab_size)  # [B, K, V]
      must_end = (step >= last_steps)[:, None, None]  # [B, 1, 1]
      cannot_end = _cannot_end(step, last_steps, min_words)[:, None, None]  # [B, 1, 1]

      # 2. The best 2K candidates, best first: the best 2K of each hypothesis' extensions, then
      # the best 2K of those (the same set as a top 2K over all K * V; XLA on CPU lowered that
      # one to a full sort of the K * V candidates, 40x slower than the rest of the step).
      per_parent = min(2 * k, vocab_size)  # P
      if constrain_log_probs is None:
        per_parent_log_probs, per_parent_tokens = best_extensions(
            logits, state.alive_log_probs, must_end, cannot_end, eos_id,
            per_parent)  # [B, K, P]
      else:  # the task rewrites the log-probs: computed whole
        log_probs = _constrained(jax.nn.log_softmax(logits), constrain_log_probs,
                                 state.alive_seqs, step, must_end, eos_id)  # [B, K, V]
        # At a sentence's last allowed step, only EOS may follow.
        is_eos_token = jnp.arange(vocab_size) == eos_id  # [V]
        log_probs = jnp.where(must_end & ~is_eos_token, NEG_INF, log_probs)  # [B, K, V]
        log_probs = jnp.where(cannot_end & is_eos_token, NEG_INF, log_probs)  # [B, K, V]
        per_parent_log_probs, per_parent_tokens = top_k_by_chunks(
            state.alive_log_probs[:, :, None] + log_probs, per_parent)  # [B, K, P]
      top_log_probs, top_index = lax.top_k(
          per_parent_log_probs.reshape(batch_size, k * per_parent), 2 * k)  # [B, 2K]
      top_parents = top_index // per_parent  # [B, 2K]: which alive hypothesis
      top_tokens = jnp.take_along_axis(
          per_parent_tokens.reshape(batch_size, k * per_parent), top_index, axis=1
      ).astype(jnp.int32)  # [B, 2K]: which token
      top_seqs = _select_beams(state.alive_seqs, top_parents)  # [B, 2K, L]
      top_seqs = lax.dynamic_update_index_in_dim(top_seqs, top_tokens, step, axis=2)  # [B, 2K, L]
      top_is_eos = top_tokens == eos_id  # [B, 2K]

      # 3. Alive: the best K candidates that go on.
      alive_log_probs, alive_picks = lax.top_k(
          jnp.where(top_is_eos, NEG_INF, top_log_probs), k)  # [B, K], indices into the 2K
      alive_seqs = _select_beams(top_seqs, alive_picks)  # [B, K, L]
      alive_parents = _select_beams(top_parents, alive_picks)  # [B, K]
      alive_cache = reorder_cache(new_cache, alive_parents)

      # 4. Finished: EOS candidates among the step's best K, merged with the finished set.
      new_scores = jnp.where(top_is_eos[:, :k],
                             top_log_probs[:, :k] / length_penalty(step + 1, alpha),
                             NEG_INF)  # [B, K]
      merged_scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)  # [B, 2K]
      merged_seqs = jnp.concatenate([state.finished_seqs, top_seqs[:, :k]], axis=1)  # [B, 2K, L]
      finished_scores, finished_picks = lax.top_k(merged_scores, k)  # [B, K]
      finished_seqs = _select_beams(merged_seqs, finished_picks)  # [B, K, L]

      return _BeamState(
          step=step + 1,
          alive_seqs=alive_seqs,
          alive_log_probs=alive_log_probs,
          alive_cache=alive_cache,
          finished_seqs=finished_seqs,
          finished_scores=finished_scores)
    return not_done, decode_one_token, sentence_done

  # All K beams start from BOS; only the first is live, so that the first step does not
  # propose the same extension K times.
  first_beam_only = jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF)  # [K]
  initial = _BeamState(
      step=jnp.array(0, jnp.int32),
      alive_seqs=jnp.full((batch_size, k, max_decode_len), PAD_ID, jnp.int32),
      alive_log_probs=jnp.tile(first_beam_only, (batch_size, 1)),  # [B, K]
      alive_cache=cache,
      finished_seqs=jnp.full((batch_size, k, max_decode_len), PAD_ID, jnp.int32),
      finished_scores=jnp.full((batch_size, k), NEG_INF, jnp.float32))
  final = _run_search(make_loop, initial, _last_allowed_steps(max_lengths, max_decode_len),
                      tokens_to_logits, cache_stages, max_decode_len, "alive_cache", compaction)

  # Every hypothesis that can end has ended: EOS is forced at each sentence's last allowed
  # step (which is within max_decode_len), and the early stop only fires once nothing alive
  # can enter the finished set's best n. So those are the answer; slots left empty (fewer
  # than n possible hypotheses) are made all PAD.
  scores = final.finished_scores[:, :n]  # [B, n]
  is_filled = (scores > NEG_INF)[:, :, None]  # [B, n, 1]
  sequences = jnp.where(is_filled, final.finished_seqs[:, :n], PAD_ID)  # [B, n, L]
  return sequences, scores
