"""Greedy and beam search against a toy model whose probabilities are known exactly.

The toy model is a second-order Markov chain over 5 tokens: the next token's logits are
`table[previous, last] + step * step_bias`, one table per sentence. Its state lives in the
cache ("previous" per row, "step" as a shared scalar leaf, and the tables themselves as row
leaves), so beam search must reorder the cache rows correctly to get the scores right. Small
enough to enumerate every hypothesis in Python and compare beam search with exhaustive search.
"""
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aiayn_flax import decoding

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4
VOCAB_SIZE = 5
WORDS = (A, B)  # PAD and BOS get probability 0 as outputs

_calls = [0]  # tokens_to_logits invocations, counted on the host


def _count_call():
  _calls[0] += 1


def markov_tokens_to_logits(ids, cache):
  """The toy model as a decoding callback: ids int32[N, 1] -> logits float32[N, V]."""
  jax.debug.callback(_count_call)
  last = ids[:, 0]  # [N]
  rows = jnp.arange(last.shape[0])  # [N]
  logits = cache["table"][rows, cache["previous"], last]  # [N, V]
  logits = logits + cache["step"] * cache["step_bias"]  # [N, V]
  new_cache = dict(cache, previous=last, step=cache["step"] + 1)
  return logits, new_cache


def initial_cache(tables, step_biases):
  """The toy model's state before decoding, for sentences with tables [B, V, V, V]."""
  tables = jnp.asarray(np.stack(tables), jnp.float32)
  return {
      "table": tables,  # [B, V, V, V]
      "step_bias": jnp.asarray(np.stack(step_biases), jnp.float32),  # [B, V]
      "previous": jnp.full((tables.shape[0],), BOS, jnp.int32),  # [B]
      "step": jnp.array(0, jnp.int32),  # shared scalar leaf
  }


def random_table(seed, eos_shift=0.0):
  """Random logits table [V, V, V] with step bias [V]; PAD and BOS never emitted."""
  rng = np.random.RandomState(seed)
  table = rng.normal(0.0, 1.5, (VOCAB_SIZE,) * 3)
  table[..., EOS] += eos_shift
  table[..., [PAD, BOS]] = -np.inf
  step_bias = rng.normal(0.0, 0.3, VOCAB_SIZE)
  return table, step_bias


def first_order_table(next_token_probs):
  """Logits table [V, V, V] from {last token: {next token: probability}}; no step bias."""
  table = np.full((VOCAB_SIZE,) * 3, -np.inf)
  for last, probs in next_token_probs.items():
    for token, prob in probs.items():
      table[:, last, token] = math.log(prob)
  return table, np.zeros(VOCAB_SIZE)


@functools.partial(jax.jit, static_argnames=("max_decode_len", "beam_size", "num_results",
                                             "min_words"))
def run_beam_search(cache, max_lengths, alpha, max_decode_len, beam_size, num_results=None,
                    min_words=1):
  return decoding.beam_search(markov_tokens_to_logits, cache, max_lengths, max_decode_len,
                              BOS, EOS, beam_size, alpha, num_results=num_results,
                              min_words=min_words)


@functools.partial(jax.jit, static_argnames=("max_decode_len", "min_words"))
def run_greedy(cache, max_lengths, max_decode_len, min_words=1):
  return decoding.greedy_decode(markov_tokens_to_logits, cache, max_lengths, max_decode_len,
                                BOS, EOS, min_words=min_words)


def count_calls(fn, *args, **kwargs):
  """fn's result and how many times it called the model."""
  _calls[0] = 0
  result = jax.block_until_ready(fn(*args, **kwargs))
  jax.effects_barrier()
  return result, _calls[0]


def exhaustive_search(table, step_bias, max_length, alpha, min_words=1):
  """Every complete hypothesis of up to max_length tokens and at least min_words words (fewer
  where max_length leaves no room), as (score, tokens), best first."""
  def log_softmax(x):
    x = x - x[np.isfinite(x)].max()
    return x - np.log(np.exp(x).sum())

  hypotheses = []
  for length in range(min(min_words + 1, max_length), max_length + 1):
    for words in itertools.product(WORDS, repeat=length - 1):
      tokens = list(words) + [EOS]
      previous, last, log_prob = BOS, BOS, 0.0
      for step, token in enumerate(tokens):
        log_prob += log_softmax(table[previous, last] + step * step_bias)[token]
        previous, last = last, token
      score = log_prob / ((5 + length) / 6) ** alpha
      hypotheses.append((score, tokens))
  return sorted(hypotheses, key=lambda h: -h[0])


def padded(tokens, max_decode_len):
  return tokens + [PAD] * (max_decode_len - len(tokens))


# --------------------------------------------------------------------------------------------
# Known answers


def test_length_penalty_is_gnmt():
  assert float(decoding.length_penalty(1, 0.6)) == pytest.approx(1.0)
  assert float(decoding.length_penalty(7, 0.6)) == pytest.approx(2.0 ** 0.6)
  assert float(decoding.length_penalty(20, 0.0)) == 1.0


# "EOS" at once is likelier than "A EOS", but only a little: the length penalty flips them.
SHORT_OR_LONG = first_order_table({
    BOS: {EOS: 0.46, A: 0.44, B: 0.10},
    A: {EOS: 0.99, A: 0.005, B: 0.005},
    B: {EOS: 0.5, A: 0.25, B: 0.25},
})


@pytest.mark.parametrize("alpha, best, second", [
    (0.0, ([EOS], math.log(0.46)), ([A, EOS], math.log(0.44 * 0.99))),
    (0.6, ([A, EOS], math.log(0.44 * 0.99) / (7 / 6) ** 0.6), ([EOS], math.log(0.46))),
    (1.0, ([A, EOS], math.log(0.44 * 0.99) / (7 / 6)), ([EOS], math.log(0.46))),
])
def test_length_penalty_changes_the_winner(alpha, best, second):
  cache = initial_cache(*zip(SHORT_OR_LONG))
  # min_words=0: the empty output is the rival here.
  sequences, scores = run_beam_search(cache, jnp.array([4]), alpha, max_decode_len=5,
                                      beam_size=2, min_words=0)
  assert sequences.shape == (1, 2, 5) and scores.shape == (1, 2)
  assert sequences[0].tolist() == [padded(best[0], 5), padded(second[0], 5)]
  np.testing.assert_allclose(scores[0], [best[1], second[1]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize("min_words", [0, 1, 2])
def test_wide_beam_equals_exhaustive_search(alpha, min_words):
  # Three sentences with their own tables and max lengths. A beam of 32 holds every candidate
  # (at most 8 prefixes x 3 tokens per step), so it must find all hypotheses: with min_words=0,
  # 31 for max length 5 (one slot left empty), 7 for max length 3 and 1 (EOS) for max length
  # 1; with min_words=1, 30, 6 and 1 (EOS: no room for a word).
  seeds, max_lengths, max_decode_len, beam_size = (1, 2, 3), (5, 3, 1), 7, 32
  tables = [random_table(seed) for seed in seeds]
  cache = initial_cache(*zip(*tables))
  sequences, scores = run_beam_search(cache, jnp.array(max_lengths), alpha,
                                      max_decode_len=max_decode_len, beam_size=beam_size,
                                      min_words=min_words)
  for b, ((table, step_bias), max_length) in enumerate(zip(tables, max_lengths)):
    expected = exhaustive_search(table, step_bias, max_length, alpha, min_words)
    n = len(expected)
    assert sequences[b, :n].tolist() == [padded(tokens, max_decode_len)
                                         for _, tokens in expected]
    np.testing.assert_allclose(scores[b, :n], [h[0] for h in expected], rtol=1e-5, atol=1e-5)
    # Empty slots: score -inf and no tokens.
    assert np.all(np.asarray(scores[b, n:]) == -np.inf)
    assert np.all(np.asarray(sequences[b, n:]) == PAD)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_narrow_beam_finds_the_best_hypothesis_on_easy_tables(alpha):
  # With a peaked table, a beam of 3 keeps the exhaustive top hypothesis.
  table, step_bias = random_table(7)
  table *= 2.0
  cache = initial_cache([table], [step_bias])
  sequences, scores = run_beam_search(cache, jnp.array([5]), alpha, max_decode_len=5,
                                      beam_size=3)
  best_score, best_tokens = exhaustive_search(table, step_bias, 5, alpha)[0]
  assert sequences[0, 0].tolist() == padded(best_tokens, 5)
  np.testing.assert_allclose(scores[0, 0], best_score, rtol=1e-5, atol=1e-5)
  assert np.all(np.diff(np.asarray(scores[0])) <= 0)  # best first


# --------------------------------------------------------------------------------------------
# EOS, max lengths and early stop


def complete_outputs(max_length):
  """How many outputs of at most max_length tokens (EOS included) the searches may give with
  min_words=1: EOS alone where no word fits, else 1 to max_length - 1 words, then EOS."""
  if max_length == 1:
    return 1
  return sum(len(WORDS) ** words for words in range(1, max_length))


def assert_well_formed(rows, max_lengths):
  """Each row: words, then one EOS within its max length, then only PAD."""
  for row, max_length in zip(rows, max_lengths):
    row = list(row)
    assert EOS in row, row
    length = row.index(EOS) + 1
    assert length <= max_length, row
    assert all(t in WORDS for t in row[:length - 1]), row
    assert all(t == PAD for t in row[length:]), row


def test_max_length_forces_eos_and_pad_follows():
  # EOS is nearly impossible, so greedy search and the best beam run to the max length.
  tables = [random_table(seed, eos_shift=-30.0) for seed in (3, 4, 5)]
  cache = initial_cache(*zip(*tables))
  max_lengths, max_decode_len = [2, 4, 9], 6  # 9 is clipped to the buffer's 6
  greedy = run_greedy(cache, jnp.array(max_lengths), max_decode_len=max_decode_len)
  sequences, scores = run_beam_search(cache, jnp.array(max_lengths), 0.6,
                                      max_decode_len=max_decode_len, beam_size=3)
  assert_well_formed(np.asarray(greedy), max_lengths)
  for row_beams, row_scores, max_length in zip(np.asarray(sequences), np.asarray(scores),
                                               max_lengths):
    possible = min(3, complete_outputs(min(max_length, max_decode_len)))
    assert_well_formed(row_beams[:possible], [max_length] * possible)
    assert np.all(np.isfinite(row_scores[:possible]))
    assert np.all(row_beams[possible:] == PAD) and np.all(row_scores[possible:] == -np.inf)
  expected_lengths = [min(m, max_decode_len) for m in max_lengths]
  assert [list(row).index(EOS) + 1 for row in np.asarray(greedy)] == expected_lengths
  assert [list(row).index(EOS) + 1 for row in np.asarray(sequences[:, 0])] == expected_lengths


def test_random_outputs_are_well_formed():
  tables = [random_table(seed, eos_shift=1.0) for seed in range(10, 14)]
  cache = initial_cache(*zip(*tables))
  max_lengths = [1, 3, 5, 8]
  greedy = run_greedy(cache, jnp.array(max_lengths), max_decode_len=8)
  assert_well_formed(np.asarray(greedy), max_lengths)
  sequences, _ = run_beam_search(cache, jnp.array(max_lengths), 0.6, max_decode_len=8,
                                 beam_size=4)
  for row_beams, max_length in zip(np.asarray(sequences), max_lengths):
    filled = [row for row in row_beams if EOS in row]
    assert len(filled) == min(4, complete_outputs(max_length))  # all, up to the beam size
    assert_well_formed(filled, [max_length] * len(filled))


# EOS is very likely at once: both searches can stop long before the buffer is full.
EARLY_EOS = first_order_table({
    BOS: {EOS: 0.98, A: 0.012, B: 0.008},
    A: {EOS: 0.9, A: 0.05, B: 0.05},
    B: {EOS: 0.9, A: 0.05, B: 0.05},
})


def test_searches_stop_when_every_hypothesis_is_finished():
  # min_words=0 lets EOS come first, so the stop can come at the first steps.
  cache = initial_cache(*zip(EARLY_EOS, EARLY_EOS))
  max_lengths, max_decode_len = jnp.array([20, 12]), 20

  greedy, greedy_calls = count_calls(run_greedy, cache, max_lengths,
                                     max_decode_len=max_decode_len, min_words=0)
  assert greedy_calls == 1  # both rows emit EOS at the first step
  assert greedy[:, :2].tolist() == [[EOS, PAD], [EOS, PAD]]

  (sequences, scores), beam_calls = count_calls(
      run_beam_search, cache, max_lengths, 0.6, max_decode_len=max_decode_len, beam_size=2,
      min_words=0)
  # Step 1 finishes "EOS"; step 2 finishes "A EOS" (score log(0.012 * 0.9) / 1.097 = -4.13),
  # filling the set, but "A A" (log(0.012 * 0.05) = -7.42) might still reach -7.42 / 2.35 =
  # -3.15 at 20 tokens; after step 3 the best alive can at most reach -10.4 / 2.35 = -4.42.
  assert beam_calls == 3
  assert sequences[0, :, :3].tolist() == [[EOS, PAD, PAD], [A, EOS, PAD]]
  np.testing.assert_allclose(
      scores[0], [math.log(0.98), math.log(0.012 * 0.9) / (7 / 6) ** 0.6], rtol=1e-5)


def test_asking_for_the_best_hypothesis_only_stops_as_soon_as_it_is_known():
  cache = initial_cache(*zip(EARLY_EOS, EARLY_EOS))
  max_lengths, max_decode_len = jnp.array([20, 12]), 20
  (sequences, scores), calls = count_calls(
      run_beam_search, cache, max_lengths, 0.6, max_decode_len=max_decode_len, beam_size=2,
      num_results=1, min_words=0)
  # Step 1 finishes "EOS" (score log(0.98) = -0.02); the best alive, "A", can at most reach
  # log(0.012) / 2.35 = -1.88 at 20 tokens (-2.36 at 12): nothing can beat "EOS" any more.
  assert calls == 1
  assert sequences.shape == (2, 1, max_decode_len) and scores.shape == (2, 1)
  assert sequences[:, 0, :2].tolist() == [[EOS, PAD], [EOS, PAD]]
  np.testing.assert_allclose(scores[:, 0], [math.log(0.98)] * 2, rtol=1e-5)


def test_no_output_is_empty_where_a_word_fits():
  # EOS at once is by far the likeliest output; by default both searches still give a word
  # first, except to the sentence whose max length (1) leaves room for EOS only.
  cache = initial_cache(*zip(EARLY_EOS, EARLY_EOS))
  max_lengths, max_decode_len = jnp.array([20, 1]), 20
  greedy = run_greedy(cache, max_lengths, max_decode_len=max_decode_len)
  assert greedy[:, :3].tolist() == [[A, EOS, PAD], [EOS, PAD, PAD]]
  sequences, scores = run_beam_search(cache, max_lengths, 0.6, max_decode_len=max_decode_len,
                                      beam_size=2)
  assert sequences[0, :, :3].tolist() == [[A, EOS, PAD], [B, EOS, PAD]]
  # EOS is masked, not the rest renormalised (as in fairseq): the words keep their log-probs.
  np.testing.assert_allclose(scores[0], [math.log(0.012 * 0.9) / (7 / 6) ** 0.6,
                                         math.log(0.008 * 0.9) / (7 / 6) ** 0.6], rtol=1e-5)
  assert sequences[1, 0, :2].tolist() == [EOS, PAD]
  np.testing.assert_allclose(scores[1, 0], math.log(0.98), rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_the_best_n_hypotheses_do_not_depend_on_how_many_are_asked_for(alpha):
  # Stopping as soon as the best n are known must give the first n of the full K-best list.
  tables = [random_table(seed, eos_shift=1.5) for seed in range(50, 58)]
  cache = initial_cache(*zip(*tables))
  max_lengths = jnp.array([3, 10, 5, 10, 6, 2, 9, 7])
  (full, full_scores), full_calls = count_calls(run_beam_search, cache, max_lengths, alpha,
                                                max_decode_len=10, beam_size=4)
  calls_for = {}
  for n in (1, 2, 3):
    (best, best_scores), calls_for[n] = count_calls(
        run_beam_search, cache, max_lengths, alpha, max_decode_len=10, beam_size=4,
        num_results=n)
    assert best.tolist() == full[:, :n].tolist()
    np.testing.assert_array_equal(best_scores, full_scores[:, :n])
    assert calls_for[n] <= full_calls
  assert calls_for[1] < full_calls  # these tables finish early: the best is known sooner


@pytest.mark.parametrize("num_results", [0, 3])
def test_num_results_outside_the_beam_is_refused(num_results):
  cache = initial_cache(*zip(EARLY_EOS))
  with pytest.raises(ValueError, match=r"num_results=%d must lie in \[1, beam_size=2\]"
                     % num_results):
    run_beam_search(cache, jnp.array([5]), 0.6, max_decode_len=5, beam_size=2,
                    num_results=num_results)


def test_a_cache_grown_in_stages_gives_the_same_result():
  # The toy model's cache gets a "room" leaf [N, length]; a step with no room left poisons its
  # logits with NaN, so any step taken before the cache was grown would change the outputs.
  def roomy_tokens_to_logits(ids, cache):
    logits, new_cache = markov_tokens_to_logits(ids, cache)
    has_room = cache["step"] < cache["room"].shape[1]
    return jnp.where(has_room, logits, jnp.nan), new_cache

  grown = []

  def grow(cache, length):
    grown.append(length)
    room = cache["room"]
    return dict(cache, room=jnp.pad(room, ((0, 0), (0, length - room.shape[1]))))

  tables = [random_table(seed, eos_shift=-1.0) for seed in (61, 62, 63)]
  cache = initial_cache(*zip(*tables))
  max_lengths, max_decode_len = jnp.array([9, 4, 7]), 9
  stages = decoding.CacheStages((2, 3, 6, 9), grow)
  staged_cache = dict(cache, room=jnp.zeros((3, 2)))
  greedy = decoding.greedy_decode(markov_tokens_to_logits, cache, max_lengths, max_decode_len,
                                  BOS, EOS)
  staged = decoding.greedy_decode(roomy_tokens_to_logits, staged_cache, max_lengths,
                                  max_decode_len, BOS, EOS, cache_stages=stages)
  assert staged.tolist() == greedy.tolist()
  assert grown == [3, 6, 9]
  beams, scores = decoding.beam_search(markov_tokens_to_logits, cache, max_lengths,
                                       max_decode_len, BOS, EOS, 3, 0.6)
  (staged, staged_scores), calls = count_calls(
      decoding.beam_search, roomy_tokens_to_logits, staged_cache, max_lengths, max_decode_len,
      BOS, EOS, 3, 0.6, cache_stages=stages)
  assert staged.tolist() == beams.tolist()
  np.testing.assert_array_equal(staged_scores, scores)
  assert calls > 6  # the search went on into the last stage


@pytest.mark.parametrize("lengths", [(4, 2, 9), (2, 4), (2, 4, 10)])
def test_cache_stages_must_increase_up_to_the_buffer_length(lengths):
  cache = initial_cache(*zip(EARLY_EOS))
  with pytest.raises(ValueError, match="must increase and end at max_decode_len=9"):
    decoding.greedy_decode(markov_tokens_to_logits, cache, jnp.array([9]), 9, BOS, EOS,
                           cache_stages=decoding.CacheStages(lengths, lambda c, n: c))


def test_early_stop_does_not_change_the_result():
  # Same sentence, once with the buffer it needs and once with a much longer one whose
  # max length never binds: the hypotheses and scores must not change.
  table, step_bias = random_table(21, eos_shift=1.5)
  cache = initial_cache([table], [step_bias])
  short, short_scores = run_beam_search(cache, jnp.array([6]), 0.0, max_decode_len=6,
                                        beam_size=3)
  (long, long_scores), calls = count_calls(run_beam_search, cache, jnp.array([6]), 0.0,
                                           max_decode_len=40, beam_size=3)
  assert calls <= 6
  assert long[:, :, :6].tolist() == short.tolist()
  assert np.all(np.asarray(long[:, :, 6:]) == PAD)
  np.testing.assert_allclose(long_scores, short_scores, rtol=1e-6)


# --------------------------------------------------------------------------------------------
# Consistency


def test_beam_size_one_is_greedy_search():
  # alpha 0: the length penalty has no say, as in greedy search.
  for seed in range(5):
    tables = [random_table(100 * seed + i, eos_shift=0.5) for i in range(4)]
    cache = initial_cache(*zip(*tables))
    max_lengths = jnp.array([2, 5, 7, 8])
    greedy = run_greedy(cache, max_lengths, max_decode_len=8)
    sequences, scores = run_beam_search(cache, max_lengths, 0.0, max_decode_len=8,
                                         beam_size=1)
    assert sequences[:, 0].tolist() == greedy.tolist()
    assert np.all(np.isfinite(np.asarray(scores)))


def test_decoding_a_sentence_alone_or_in_a_batch_gives_the_same_result():
  tables = [random_table(seed, eos_shift=0.5) for seed in (31, 32, 33)]
  max_lengths = [3, 8, 5]
  cache = initial_cache(*zip(*tables))
  batch_greedy = run_greedy(cache, jnp.array(max_lengths), max_decode_len=8)
  batch_seqs, batch_scores = run_beam_search(cache, jnp.array(max_lengths), 0.6,
                                             max_decode_len=8, beam_size=3)
  for b, (table, max_length) in enumerate(zip(tables, max_lengths)):
    alone = initial_cache(*zip(table))
    greedy = run_greedy(alone, jnp.array([max_length]), max_decode_len=8)
    seqs, scores = run_beam_search(alone, jnp.array([max_length]), 0.6, max_decode_len=8,
                                   beam_size=3)
    assert greedy[0].tolist() == batch_greedy[b].tolist()
    assert seqs[0].tolist() == batch_seqs[b].tolist()
    np.testing.assert_allclose(scores[0], batch_scores[b], rtol=1e-6)


def test_jit_compiles_once_and_matches_eager_decoding():
  tables = [random_table(seed) for seed in (41, 42)]
  cache = initial_cache(*zip(*tables))
  traces = [0]

  @functools.partial(jax.jit, static_argnames=("beam_size",))
  def decode(cache, max_lengths, alpha, beam_size):
    traces[0] += 1
    return decoding.beam_search(markov_tokens_to_logits, cache, max_lengths, 6, BOS, EOS,
                                beam_size, alpha)

  jitted = decode(cache, jnp.array([6, 4]), 0.6, beam_size=2)
  eager = decoding.beam_search(markov_tokens_to_logits, cache, jnp.array([6, 4]), 6, BOS, EOS,
                               2, 0.6)
  assert jitted[0].tolist() == eager[0].tolist()
  np.testing.assert_allclose(jitted[1], eager[1], rtol=1e-6)
  decode(cache, jnp.array([3, 5]), 1.0, beam_size=2)  # new max lengths and alpha: no retrace
  assert traces[0] == 1

  greedy_jitted = jax.jit(decoding.greedy_decode, static_argnums=(0, 3, 4, 5))
  assert (greedy_jitted(markov_tokens_to_logits, cache, jnp.array([6, 4]), 6, BOS, EOS).tolist()
          == decoding.greedy_decode(markov_tokens_to_logits, cache, jnp.array([6, 4]), 6, BOS,
                                    EOS).tolist())


@pytest.mark.parametrize("size, k, chunk", [(8000, 8, 64), (1000, 8, 64), (300, 5, 7),
                                            (40, 3, 16), (9, 2, 4)])
def test_top_k_by_chunks_equals_top_k_with_its_tie_breaking(size, k, chunk):
  rng = np.random.default_rng(size)
  rows = [
      rng.normal(size=size),
      rng.integers(0, 4, size),  # many ties
      np.where(rng.random(size) < 0.9, -np.inf, rng.normal(size=size)),  # few finite
      np.full(size, -np.inf),  # all ties at -inf: lowest indices
      np.where(np.arange(size) == size - 1, 0.0, -np.inf),  # the best is last
  ]
  x = jnp.asarray(np.stack(rows).reshape(1, len(rows), size), jnp.float32)
  values, indices = decoding.top_k_by_chunks(x, k, chunk)
  expected_values, expected_indices = jax.lax.top_k(x, k)
  np.testing.assert_array_equal(values, expected_values)
  np.testing.assert_array_equal(indices, expected_indices)


@pytest.mark.parametrize("size, chunk", [(8000, 64), (1000, 64), (300, 7), (9, 4), (3, 4)])
def test_argmax_by_chunks_equals_argmax(size, chunk):
  """The first index of the maximum, ties and -inf included."""
  rng = np.random.default_rng(size)
  rows = [
      rng.normal(size=size),
      rng.integers(0, 3, size).astype(float),  # ties: the first maximum
      np.full(size, -np.inf),
      np.where(np.arange(size) == size - 1, 1.0, 0.0),  # the best is last
  ]
  x = jnp.asarray(np.stack(rows), jnp.float32)
  np.testing.assert_array_equal(jax.jit(decoding.argmax_by_chunks, static_argnums=1)(x, chunk),
                                jnp.argmax(x, axis=-1))


def plain_best_extensions(logits, alive_log_probs, must_end, cannot_end, eos_id, k, chunk):
  """Beam search's step 2 as written before best_extensions: log-probs and candidates whole."""
  log_probs = jax.nn.log_softmax(logits)
  is_eos = jnp.arange(logits.shape[-1]) == eos_id
  log_probs = jnp.where(must_end & ~is_eos, -jnp.inf, log_probs)
  log_probs = jnp.where(cannot_end & is_eos, -jnp.inf, log_probs)
  return decoding.top_k_by_chunks(alive_log_probs[:, :, None] + log_probs, k, chunk)


@pytest.mark.parametrize("size, k, chunk, eos_id", [(8000, 8, 64, 1), (1000, 8, 64, 999),
                                                    (300, 5, 7, 150), (9, 2, 4, 1),
                                                    (20, 6, 4, 7)])
def test_best_extensions_equal_the_plain_computation(size, k, chunk, eos_id):
  """The same values (to the bit) and tokens, ties included, with empty and ending beams, and
  beams that may not end where EOS is the best token."""
  rng = np.random.default_rng(size)
  rows = [
      rng.normal(size=size) * 8,
      rng.integers(0, 4, size).astype(float),  # many ties
      np.where(np.arange(size) == size - 1, 5.0, rng.normal(size=size)),  # the best is last
      rng.normal(size=size),
  ]
  logits = jnp.asarray(np.stack(rows * 3).reshape(3, 4, size), jnp.float32)  # [B=3, K=4, V]
  alive = jnp.asarray([[0.0, -1.5, -1.5, -np.inf], [-3.25, -np.inf, -np.inf, -np.inf],
                       [-0.5, -0.75, -2.0, -7.0]], jnp.float32)
  logits = logits.at[:2, 0, eos_id].set(50.0)  # EOS the best token of two live beams
  must_end = jnp.asarray([False, False, True])[:, None, None]  # sentence 2: only EOS may follow
  cannot_end = jnp.asarray([True, False, False])[:, None, None]  # sentence 0: EOS may not
  values, tokens = jax.jit(decoding.best_extensions, static_argnums=(4, 5, 6))(
      logits, alive, must_end, cannot_end, eos_id, k, chunk)
  expected_values, expected_tokens = plain_best_extensions(logits, alive, must_end, cannot_end,
                                                           eos_id, k, chunk)
  is_candidate = np.asarray(values) > -np.inf  # empty beams' slots hold any token
  assert np.all(np.asarray(tokens[0])[is_candidate[0]] != eos_id)
  assert np.any(np.asarray(tokens[1])[is_candidate[1]] == eos_id)
  np.testing.assert_array_equal(values, expected_values)
  np.testing.assert_array_equal(tokens, expected_tokens)


# --------------------------------------------------------------------------------------------
# Cache helpers


def test_expand_to_beams_repeats_rows_and_keeps_scalars():
  cache = {"keys": jnp.arange(6).reshape(2, 3), "position": jnp.array(4)}
  expanded = decoding.expand_to_beams(cache, 3)
  assert expanded["keys"].tolist() == [[0, 1, 2]] * 3 + [[3, 4, 5]] * 3
  assert expanded["position"].shape == () and int(expanded["position"]) == 4


def test_gather_beams_reorders_rows_per_sentence():
  # 2 sentences x 3 beams; row b * 3 + k holds 10 * b + k.
  cache = {"keys": jnp.array([0, 1, 2, 10, 11, 12])[:, None], "position": jnp.array(7)}
  gathered = decoding.gather_beams(cache, jnp.array([[2, 2, 0], [1, 0, 1]]))
  assert gathered["keys"][:, 0].tolist() == [2, 2, 0, 11, 10, 11]
  assert int(gathered["position"]) == 7
