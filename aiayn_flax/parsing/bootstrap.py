"""The paired bootstrap over test sentences (Efron & Tibshirani 1993; Koehn 2004 for MT, the
usual test of the parsing literature's F1 differences): is system A's corpus F1 above system
B's by more than the choice of test sentences explains?

Each resample draws n of the n test sentences with replacement, the same draw for both
systems (paired), and recomputes each system's corpus-level F1 from the drawn sentences'
EVALB counts (matched, gold and test brackets, summed before dividing: F1 is not a mean of
sentence F1s). Sentences EVALB skips or cannot align count nothing, as in EVALB. A system
trained on several seeds is scored on each resample by the mean of its seeds' F1s.
p-value: the fraction of resamples in which A's F1 is not above B's (one-sided).
"""
import dataclasses
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
