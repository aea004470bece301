"""Greedy search and beam search with the GNMT length penalty, against the model's step
callback; their conventions are in the package's docstring (decoding/__init__.py).
"""
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from aiayn_flax.decoding.chunked_top_k import argmax_by_chunks, best_extensions, top_k_by_chunks
from aiayn_flax.decoding.compaction import CacheStages, Compaction, _run_search
from aiayn_flax.decoding.contract import (NEG_INF, PAD_ID, Cache, ConstrainLogProbs,
                                         TokensToLogits, _select_beams, expand_to_beams,
                                         gather_beams)


def length_penalty(length, alpha):
  """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016, eq. 14).

  A hypothesis' score is its log-prob divided by this; `length` counts generated tokens, EOS
  included. alpha = 0 gives plain log-probs; alpha > 0 favours longer hypotheses.
  """
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


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
