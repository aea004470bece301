"""Table 4's significance over seeds and sentences together (aiayn_flax/parsing/bootstrap.py):
the hierarchical bootstrap equals a hand computation on given draws and the exact distribution
of a tiny case; its p is two-sided and the same with the systems swapped; seeds that disagree
widen its interval beyond the sentences-only test's, and seeds that agree leave it exactly
that; the normal approximation from a table's recorded figures is never wider than the test."""
import itertools

import numpy as np
import pytest

from aiayn_flax.parsing import bootstrap


def f1(matched: int, gold: int, test: int) -> float:
  return 200 * matched / (gold + test)  # 2PR / (P + R) = 2 matched / (gold + test)


def test_two_sided_p_is_twice_the_smaller_side_of_zero_and_the_same_for_the_negated():
  assert bootstrap.two_sided_p([-1, 1, 2, 3]) == 0.5  # 1/4 at or below zero, 3/4 at or above
  assert bootstrap.two_sided_p([1, 2, 3, 4]) == 0.0
  assert bootstrap.two_sided_p([0, 0, 0]) == 1.0  # ties count on both sides
  assert bootstrap.two_sided_p([-2, -1, 0, 5, 6, 7]) == 1.0  # 2 x 1/2, at most 1
  differences = np.random.default_rng(0).normal(0.5, 1, 999)
  assert bootstrap.two_sided_p(differences) == bootstrap.two_sided_p(-differences)


def test_resampled_differences_equal_a_hand_computation():
  """Two sentences of 2 brackets; A has two seeds, B one. Resample by resample, the drawn
  seeds' corpus F1 on the drawn sentences, averaged, minus B's."""
  a = np.array([[[2, 2, 2], [0, 2, 2]],  # seed 0: all of sentence 0, none of sentence 1
                [[1, 2, 2], [2, 2, 2]]])  # seed 1: half of sentence 0, all of sentence 1
  b = np.array([[[1, 2, 2], [1, 2, 2]]])  # half of each
  sentences = np.array([[0, 0], [0, 1], [1, 1], [1, 1]])
  a_seeds = np.array([[0, 0], [0, 1], [1, 1], [0, 0]])
  b_seeds = np.zeros((4, 1), np.int64)
  differences = bootstrap.resampled_differences(a, b, sentences, a_seeds, b_seeds)
  expected = [f1(4, 4, 4) - f1(2, 4, 4),  # seed 0 twice on sentence 0 twice: 100 - 50
              (f1(2, 4, 4) + f1(3, 4, 4)) / 2 - f1(2, 4, 4),  # (50 + 75) / 2 - 50
              f1(4, 4, 4) - f1(2, 4, 4),  # seed 1 on sentence 1 twice
              f1(0, 4, 4) - f1(2, 4, 4)]  # seed 0 on sentence 1 twice
  assert differences.tolist() == pytest.approx(expected) == [50, 12.5, 50, -50]
  assert bootstrap.two_sided_p(differences) == 0.5


def test_the_bootstrap_matches_the_exact_distribution_of_a_tiny_case():
  """Three sentences and A's two seeds: all 3^3 x 2^2 = 108 draws are equally likely; the
  exact two-sided p and median, enumerated here by hand, are what 40,000 resamples give."""
  a = [np.array([[3, 3, 3], [1, 2, 2], [0, 4, 3]]), np.array([[1, 3, 3], [2, 2, 2], [2, 4, 4]])]
  b = np.array([[2, 3, 3], [1, 2, 2], [1, 4, 4]])

  def corpus(counts, sentences):
    return f1(*np.sum([counts[i] for i in sentences], axis=0))

  exact = [np.mean([corpus(a[s], sentences) for s in seeds]) - corpus(b, sentences)
           for sentences in itertools.product(range(3), repeat=3)
           for seeds in itertools.product(range(2), repeat=2)]
  result = bootstrap.seeds_and_sentences_bootstrap(a, b, resamples=40_000, seed=3)
  assert result.difference == pytest.approx(
      (corpus(a[0], [0, 1, 2]) + corpus(a[1], [0, 1, 2])) / 2 - corpus(b, [0, 1, 2]))
  assert result.p_value == pytest.approx(bootstrap.two_sided_p(exact), abs=0.015)
  assert 0.1 < bootstrap.two_sided_p(exact) < 0.9  # a case where the sides matter
  assert result.seeds == (2, 1) and result.resamples == 40_000
  assert np.min(exact) <= result.interval[0] <= result.interval[1] <= np.max(exact)


def table_like(seed_f1_shifts, n=245, rng_seed=0):
  """Counts like Table 4's test files: a baseline, and one system per shift of its accuracy
  (its seeds), each sentence's matched brackets drawn around that accuracy."""
  rng = np.random.default_rng(rng_seed)
  gold = rng.integers(3, 25, size=n)

  def system(accuracy):
    test = np.maximum(gold + rng.integers(-2, 3, size=n), 1)
    p = np.clip(accuracy + 0.15 * rng.standard_normal(n), 0, 1)
    return np.stack([rng.binomial(np.minimum(gold, test), p), gold, test], axis=1)

  return [system(0.72 + shift) for shift in seed_f1_shifts], system(0.72)


def test_seeds_that_agree_give_the_sentences_only_interval_and_seeds_that_differ_widen_it():
  seeds, baseline = table_like([0.03, 0.03, 0.03])
  copies = [seeds[0]] * 3  # three seeds with the same output: nothing for seeds to add
  same = bootstrap.seeds_and_sentences_bootstrap(copies, baseline)
  sentences_only = bootstrap.paired_bootstrap(copies, baseline)
  assert same.interval == sentences_only.interval
  assert same.difference == sentences_only.difference

  spread = [seeds[0], *table_like([0.06, 0.0], rng_seed=1)[0]]  # one better, one worse
  wider = bootstrap.seeds_and_sentences_bootstrap(spread, baseline)
  held = bootstrap.paired_bootstrap(spread, baseline)
  assert wider.interval[0] < held.interval[0] - 0.3 and wider.interval[1] > held.interval[1] + 0.3
  assert wider.p_value > 2 * held.p_value  # two-sided over both, against one-sided over one


def test_a_p_value_is_the_same_and_the_interval_negated_with_the_systems_swapped():
  seeds, baseline = table_like([0.05, 0.03, 0.025])
  forward = bootstrap.seeds_and_sentences_bootstrap(seeds, baseline)
  backward = bootstrap.seeds_and_sentences_bootstrap(baseline, seeds)
  assert 0 < forward.p_value < 1
  assert backward.p_value == forward.p_value
  assert backward.difference == -forward.difference
  assert backward.interval == pytest.approx((-forward.interval[1], -forward.interval[0]))
  assert backward.seeds == (1, 3)
  equal = bootstrap.seeds_and_sentences_bootstrap(seeds, seeds)
  assert equal.p_value == 1.0 and equal.difference == 0


def test_the_approximation_from_recorded_figures_is_never_wider_than_the_test():
  """Normal approximation from the sentences-only interval and the seeds' F1s: with seeds
  that agree, that interval itself; with seeds that differ, inside the bootstrap's interval
  and with a smaller p, since it leaves out how differently the seeds fare sentence by
  sentence (a part of the variance that only adds)."""
  none = bootstrap.approximate_seeds_and_sentences(3.0, (1.0, 5.0), [75.0, 75.0, 75.0])
  assert none.interval == pytest.approx((1.0, 5.0))
  assert none.p_value == pytest.approx(0.003, abs=0.0005)  # 3 / (4 / 3.92): z = 2.94
  for rng_seed in range(4):
    seeds, baseline = table_like([0.045, 0.03, 0.025], rng_seed=rng_seed)
    test = bootstrap.seeds_and_sentences_bootstrap(seeds, baseline, resamples=4000)
    held = bootstrap.paired_bootstrap(seeds, baseline, resamples=4000)
    approximation = bootstrap.approximate_seeds_and_sentences(
        held.difference, held.interval, [float(bootstrap.corpus_f1(s)) for s in seeds])
    assert test.interval[0] < approximation.interval[0] < held.interval[0]
    assert held.interval[1] < approximation.interval[1] < test.interval[1]
    assert 2 * held.p_value < approximation.p_value < test.p_value


def test_table_4_prints_the_test_over_seeds_and_sentences_and_keeps_the_sentences_only_one():
  """bench/parsing_table.py's row against a baseline: the difference, the 95% interval and the
  two-sided p of `seeds_and_sentences_bootstrap`; below the table, the sentences-only test."""
  from bench import parsing_table
  seeds, baseline = table_like([0.05, 0.03, 0.025])
  scores = {"f1": 0.0, "recall": 0.0, "precision": 0.0, "complete_match": 0.0, "valid": 245,
            "skipped": 0, "errors": 0}
  baselines_ = {"teacher": {"counts": baseline.tolist(), "scores": scores, "without_parse": 0}}
  per_seed = [{"counts": s.tolist(), "scores": scores, "decode_seconds": 1.0} for s in seeds]
  row = parsing_table.transformer_row("silver", "constrained", per_seed, [0, 1, 2], {},
                                      baselines_, resamples=500)
  both = bootstrap.seeds_and_sentences_bootstrap(seeds, baseline, 500)
  held = bootstrap.paired_bootstrap(seeds, baseline, 500)
  against = row["against"]["teacher"]
  assert (against["difference"], against["p_value"], tuple(against["interval"])) == (
      both.difference, both.p_value, both.interval)
  assert against["sentences_only"]["p_value_one_sided"] == held.p_value
  table = parsing_table.markdown([row], baselines_, 245)
  assert "two-sided p, by a bootstrap over the seeds and the test sentences together" in table
  assert (f"| {both.difference:+.2f} [{both.interval[0]:+.2f}, {both.interval[1]:+.2f}], "
          f"p={both.p_value:.3f} |") in table
  assert (f"- silver: constrained: vs teacher [{held.interval[0]:+.2f}, "
          f"{held.interval[1]:+.2f}], p={held.p_value:.3f}") in table
