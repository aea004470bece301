"""Is system A's corpus F1 above system B's by more than chance explains? Two bootstraps
(Efron & Tibshirani 1993; Koehn 2004 for MT, the usual test of the parsing literature's F1
differences), both over EVALB counts (matched, gold and test brackets per sentence, summed
before dividing: F1 is not a mean of sentence F1s; a sentence EVALB skips or cannot align
counts nothing, as in EVALB). A system trained on several seeds scores, on any resample, the
mean of its seeds' F1s.

`seeds_and_sentences_bootstrap`, the test of Table 4 (bench/parsing_table.py): a hierarchical
bootstrap. Each resample draws n of the n test sentences with replacement, the same draw for
both systems (paired), and, independently, k of each system's k seeds with replacement; the
difference is the mean F1 of A's drawn seeds on the drawn sentences minus B's. It covers both
chances a reported difference rests on: which sentences were tested, and which seeds trained
(a baseline without seeds is one "seed" and draws nothing). Two-sided: p is twice the smaller
share of resamples on either side of zero (`two_sided_p`), so p < 0.05 when the 95% interval
excludes zero (up to the percentiles' interpolation), and A against B gives B against A's p.
Drawing k of k seeds reproduces (k - 1) / k of their variance: with 3 seeds the interval is
still a little narrow, and more seeds are the remedy, not a correction.

`paired_bootstrap`: sentences only, the seeds held fixed, one-sided p (the fraction of resamples
in which A's F1 is not above B's): the test of the tables of 2026-11-26 and 27 (docs/PARSING.md).
"""
import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from aiayn_flax.parsing import evalb

RESAMPLES = 1000


def sentence_counts(gold_lines: Sequence[str], test_lines: Sequence[str]) -> np.ndarray:
  """[n, 3] int: (matched, gold, test) brackets per sentence by EVALB (COLLINS.prm); zeros for
  a sentence EVALB skips or reports as an error."""
  if len(gold_lines) != len(test_lines):
    raise ValueError(f"{len(gold_lines)} gold lines but {len(test_lines)} test lines")
  counts = np.zeros((len(gold_lines), 3), np.int64)
  for i, (g, t) in enumerate(zip(gold_lines, test_lines)):
    score = evalb.score_sentence(g, t)
    if score.status == "valid":
      counts[i] = score.matched, score.gold, score.test
  return counts


def corpus_f1(counts: np.ndarray) -> np.ndarray:
  """EVALB's F1 (0-100) of summed counts [..., n, 3] -> [...]."""
  matched, gold, test = np.moveaxis(counts.sum(axis=-2), -1, 0).astype(np.float64)
  recall = np.divide(matched, gold, out=np.zeros_like(matched), where=gold > 0)
  precision = np.divide(matched, test, out=np.zeros_like(matched), where=test > 0)
  total = recall + precision
  return 100 * np.divide(2 * recall * precision, total, out=np.zeros_like(total), where=total > 0)


@dataclasses.dataclass(frozen=True)
class Comparison:
  difference: float  # A's F1 (mean over its seeds) minus B's, on the test sentences as they are
  p_value: float  # fraction of resamples with A's F1 <= B's
  interval: tuple[float, float]  # 2.5 and 97.5 percentiles of the resampled difference
  resamples: int


def paired_bootstrap(a: Sequence[np.ndarray] | np.ndarray, b: np.ndarray,
                     resamples: int = RESAMPLES, seed: int = 0) -> Comparison:
  """A against B. `a`: [n, 3] counts, or a list of them (one per seed: A's F1 is their mean);
  `b`: [n, 3] counts of the same n sentences."""
  a = np.stack([a] if np.ndim(a) == 2 else list(a))  # [seeds, n, 3]
  if a.shape[1:] != b.shape:
    raise ValueError(f"counts of different shapes: {a.shape[1:]} and {b.shape}")
  n = b.shape[0]
  draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))  # [R, n]
  a_f1 = corpus_f1(a[:, draws]).mean(axis=0)  # [seeds, R, n, 3] -> [R]
  b_f1 = corpus_f1(b[draws])  # [R]
  difference = a_f1 - b_f1
  low, high = np.percentile(difference, [2.5, 97.5])
  return Comparison(float(corpus_f1(a).mean() - corpus_f1(b)),
                    float(np.mean(difference <= 0)), (float(low), float(high)), resamples)


def two_sided_p(differences: np.ndarray) -> float:
  """Twice the smaller of the shares of `differences` at or below zero and at or above zero,
  at most 1; the same for `-differences`."""
  differences = np.asarray(differences)
  return float(min(1.0, 2 * min(np.mean(differences <= 0), np.mean(differences >= 0))))


def _as_seeds(counts: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
  """[n, 3] counts, or a list of them, one per seed -> [seeds, n, 3]."""
  return np.stack([counts] if np.ndim(counts) == 2 else list(counts))


def resampled_differences(a: np.ndarray, b: np.ndarray, sentence_draws: np.ndarray,
                          a_seed_draws: np.ndarray, b_seed_draws: np.ndarray) -> np.ndarray:
  """[R] for given draws: a [ka, n, 3] and b [kb, n, 3] counts; sentence_draws [R, n] sentence
  indices, a_seed_draws [R, ka] and b_seed_draws [R, kb] seed indices. Resample r: the mean
  over A's drawn seeds of their corpus F1 on the drawn sentences, minus the same for B."""
  rows = np.arange(sentence_draws.shape[0])[:, None]  # [R, 1]
  a_f1 = corpus_f1(a[:, sentence_draws]).T  # [ka, R, n, 3] -> [R, ka]
  b_f1 = corpus_f1(b[:, sentence_draws]).T  # [R, kb]
  return a_f1[rows, a_seed_draws].mean(axis=1) - b_f1[rows, b_seed_draws].mean(axis=1)


def _seed_draws(rng: np.random.Generator, seeds: int, resamples: int) -> np.ndarray:
  """[R, seeds] indices drawn with replacement; one seed draws nothing from `rng` (so a
  baseline's place, first or second, does not move the other system's draws)."""
  if seeds == 1:
    return np.zeros((resamples, 1), np.int64)
  return rng.integers(0, seeds, size=(resamples, seeds))


@dataclasses.dataclass(frozen=True)
class SeedsAndSentences:
  difference: float  # A's F1 (mean over its seeds) minus B's, on the test sentences as they are
  p_value: float  # two-sided: two_sided_p of the resampled differences
  interval: tuple[float, float]  # 2.5 and 97.5 percentiles of the resampled difference
  resamples: int
  seeds: tuple[int, int]  # A's and B's numbers of seeds


def seeds_and_sentences_bootstrap(a: Sequence[np.ndarray] | np.ndarray,
                                  b: Sequence[np.ndarray] | np.ndarray,
                                  resamples: int = RESAMPLES, seed: int = 0) -> SeedsAndSentences:
  """A against B, resampling the test sentences (paired) and each system's seeds. `a`, `b`:
  [n, 3] counts, or a list of them, one per seed, over the same n sentences. The sentence draws
  are `paired_bootstrap`'s for the same `seed`: with seeds that agree on every sentence, the
  interval is that test's."""
  a, b = _as_seeds(a), _as_seeds(b)
  if a.shape[1:] != b.shape[1:]:
    raise ValueError(f"counts of different shapes: {a.shape[1:]} and {b.shape[1:]}")
  rng = np.random.default_rng(seed)
  sentence_draws = rng.integers(0, a.shape[1], size=(resamples, a.shape[1]))  # [R, n]
  a_seed_draws = _seed_draws(rng, a.shape[0], resamples)
  b_seed_draws = _seed_draws(rng, b.shape[0], resamples)
  difference = resampled_differences(a, b, sentence_draws, a_seed_draws, b_seed_draws)
  low, high = np.percentile(difference, [2.5, 97.5])
  return SeedsAndSentences(float(corpus_f1(a).mean() - corpus_f1(b).mean()),
                           two_sided_p(difference), (float(low), float(high)), resamples,
                           (a.shape[0], b.shape[0]))


Z_975 = 1.959963984540054  # the standard normal's 97.5th percentile


@dataclasses.dataclass(frozen=True)
class Approximation:
  difference: float
  p_value: float  # two-sided, normal
  interval: tuple[float, float]  # difference -+ 1.96 standard errors


def approximate_seeds_and_sentences(difference: float, sentences_interval: tuple[float, float],
                                    seed_f1s: Sequence[float]) -> Approximation:
  """What `seeds_and_sentences_bootstrap` would give, from figures a table recorded when the
  per-sentence counts were not kept: the sentences-only 95% interval (`paired_bootstrap`'s)
  and A's seeds' F1s (B without seeds). Normal approximation: the variance of the difference
  is the sentences' (the interval's width over 2 x 1.96, squared) plus the seeds' (the
  variance of the mean of k of the k seed F1s drawn with replacement: their population
  variance over k); p two-sided. An estimate, not the test: the bootstrap on the counts is."""
  sentences = (sentences_interval[1] - sentences_interval[0]) / (2 * Z_975)
  seeds = float(np.var(seed_f1s)) / len(seed_f1s)
  error = math.sqrt(sentences ** 2 + seeds)
  p_value = math.erfc(abs(difference) / error / math.sqrt(2)) if error else float(difference == 0)
  return Approximation(difference, p_value,
                       (difference - Z_975 * error, difference + Z_975 * error))
