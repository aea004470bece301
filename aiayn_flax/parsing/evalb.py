"""Labelled bracket scores as EVALB (Sekine and Collins, 1997) computes them, written anew in
Python for its COLLINS.prm setting: the F1 of the parsing literature and of Table 4.

Per sentence pair (one gold tree and one test tree, each on one line):
- Words: preterminals whose tag is a DELETE_LABEL (punctuation , : `` '' . and -NONE-) are
  removed from the word sequence, each side by its own tags. A test line with no words left is
  *skipped*; unequal word counts, different words (EQ_WORD pairs count as equal) or a line that
  is not a well-formed tree are *errors*. Skipped and error sentences count in neither recall
  nor precision, as in EVALB (which stops after MAX_ERROR errors; we do not).
- Brackets: every non-preterminal constituent is a (label, start, end) over the remaining
  words. Labels are cut at the first '-' or '=' (NP-SBJ -> NP); brackets spanning no word (e.g.
  only punctuation) and those whose label is a DELETE_LABEL (TOP) are not counted.
- Matching: a gold bracket matches a test bracket with the same span and an equal label
  (EQ_LABEL pairs, ADVP = PRT, count as equal), each bracket used once: per (span, label
  class), min(gold count, test count) matches.
- Totals: recall = matched / gold brackets, precision = matched / test brackets, F1 their
  harmonic mean; complete match = sentences with matched == gold == test; and the same for
  sentences of at most CUTOFF_LEN gold words (counting punctuation, not -NONE-).

The QUOTE_LABEL re-insertion of EVALB's 2006 revision is not implemented: COLLINS.prm does
not use it.
"""
import collections
import dataclasses
from collections.abc import Iterable, Sequence

import nltk


@dataclasses.dataclass(frozen=True)
class Parameters:
  """The settings of an EVALB parameter file that the scores depend on."""
  delete_labels: frozenset[str] = frozenset()
  delete_labels_for_length: frozenset[str] = frozenset()
  equal_labels: tuple[tuple[str, str], ...] = ()
  equal_words: tuple[tuple[str, str], ...] = ()
  labelled: bool = True
  cutoff_length: int = 40


COLLINS = Parameters(
    delete_labels=frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."}),
    delete_labels_for_length=frozenset({"-NONE-"}),
    equal_labels=(("ADVP", "PRT"),),
)

_KNOWN_KEYS = {"DEBUG", "MAX_ERROR", "CUTOFF_LEN", "LABELED", "DELETE_LABEL",
               "DELETE_LABEL_FOR_LENGTH", "EQ_LABEL", "EQ_WORD"}


def read_parameters(path: str) -> Parameters:
  """Parameters from an EVALB .prm file (lines `KEY VALUE`, '#' comments)."""
  delete, delete_for_length, equal_labels, equal_words = set(), set(), [], []
  labelled, cutoff = True, 40
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      fields = line.split()
      if not fields or line.startswith("#"):
        continue
      key, values = fields[0], fields[1:]
      if key not in _KNOWN_KEYS or not values:
        raise ValueError(f"{path}:{number}: unsupported EVALB parameter line {line.strip()!r}")
      if key == "DELETE_LABEL":
        delete.add(values[0])
      elif key == "DELETE_LABEL_FOR_LENGTH":
        delete_for_length.add(values[0])
      elif key in ("EQ_LABEL", "EQ_WORD"):
        if len(values) != 2:
          raise ValueError(f"{path}:{number}: {key} needs two values")
        (equal_labels if key == "EQ_LABEL" else equal_words).append(tuple(values))
      elif key == "LABELED":
        labelled = bool(int(values[0]))
      elif key == "CUTOFF_LEN":
        cutoff = int(values[0])
  return Parameters(frozenset(delete), frozenset(delete_for_length), tuple(equal_labels),
                    tuple(equal_words), labelled, cutoff)


@dataclasses.dataclass(frozen=True)
class SentenceScore:
  status: str  # "valid", "error" or "skip"
  length: int  # gold words, punctuation included, -NONE- not (for the cutoff)
  matched: int = 0
  gold: int = 0
  test: int = 0


@dataclasses.dataclass
class Totals:
  """Sums over sentences, and the scores EVALB prints from them."""
  sentences: int = 0
  errors: int = 0
  skipped: int = 0
  matched: int = 0
  gold: int = 0
  test: int = 0
  complete: int = 0

  def add(self, score: SentenceScore) -> None:
    self.sentences += 1
    if score.status == "error":
      self.errors += 1
    elif score.status == "skip":
      self.skipped += 1
    else:
      self.matched += score.matched
      self.gold += score.gold
      self.test += score.test
      self.complete += score.matched == score.gold == score.test

  @property
  def valid(self) -> int:
    return self.sentences - self.errors - self.skipped

  @property
  def recall(self) -> float:
    return 100.0 * self.matched / self.gold if self.gold else 0.0

  @property
  def precision(self) -> float:
    return 100.0 * self.matched / self.test if self.test else 0.0

  @property
  def f1(self) -> float:
    total = self.recall + self.precision
    return 2 * self.recall * self.precision / total if total else 0.0

  @property
  def complete_match(self) -> float:
    return 100.0 * self.complete / self.valid if self.valid else 0.0

  def summary(self) -> str:
    return (f"EVALB F1 = {self.f1:.2f} (recall {self.recall:.2f}, precision "
            f"{self.precision:.2f}, complete match {self.complete_match:.2f}; "
            f"{self.valid} valid sentences, {self.errors} errors, {self.skipped} skipped)")


@dataclasses.dataclass
class Scores:
  all: Totals
  up_to_cutoff: Totals  # sentences of at most `cutoff_length` words


def score_sentence(gold_line: str, test_line: str, params: Parameters = COLLINS) -> SentenceScore:
  """EVALB's comparison of one gold line with one test line."""
  gold, test = _read(gold_line, params), _read(test_line, params)
  length = gold.length if gold else 0
  if test is not None and not test.words:
    return SentenceScore("skip", length)
  if gold is None or test is None or len(gold.words) != len(test.words):
    return SentenceScore("error", length)
  equal_words = _equivalence(params.equal_words)
  if any(equal_words(g) != equal_words(t) for g, t in zip(gold.words, test.words)):
    return SentenceScore("error", length)
  label_class = _equivalence(params.equal_labels)
  gold_brackets = _scored_brackets(gold.brackets, params, label_class)
  test_brackets = _scored_brackets(test.brackets, params, label_class)
  matched = sum((collections.Counter(gold_brackets) & collections.Counter(test_brackets)).values())
  return SentenceScore("valid", length, matched, len(gold_brackets), len(test_brackets))


def score_corpus(gold_lines: Sequence[str], test_lines: Sequence[str],
                 params: Parameters = COLLINS) -> Scores:
  """Totals over aligned gold and test lines (one tree per line each)."""
  if len(gold_lines) != len(test_lines):
    raise ValueError(f"{len(gold_lines)} gold trees but {len(test_lines)} test trees")
  scores = Scores(Totals(), Totals())
  for gold_line, test_line in zip(gold_lines, test_lines):
    score = score_sentence(gold_line, test_line, params)
    scores.all.add(score)
    if score.length <= params.cutoff_length:
      scores.up_to_cutoff.add(score)
  return scores


def score_files(gold_path: str, test_path: str, params: Parameters = COLLINS) -> Scores:
  return score_corpus(_lines(gold_path), _lines(test_path), params)


def score_trees(gold: Iterable[nltk.Tree], test: Iterable[nltk.Tree],
                params: Parameters = COLLINS) -> Scores:
  """score_corpus of trees, each written on one line."""
  one_line = lambda tree: tree.pformat(margin=1_000_000_000)
  return score_corpus([one_line(t) for t in gold], [one_line(t) for t in test], params)


def _lines(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    return f.read().splitlines()


@dataclasses.dataclass(frozen=True)
class _ReadTree:
  words: list[str]  # words that are not deleted
  brackets: list[tuple[str, int, int]]  # (label, start, end) over `words`
  length: int


def _read(line: str, params: Parameters) -> _ReadTree | None:
  """Words and brackets of a one-line tree; None if EVALB would report a reading error (an
  unbalanced line, a preterminal with several words, words beside constituents). A blank
  line has no words (EVALB skips such a test line)."""
  if not line.strip():
    return _ReadTree([], [], 0)
  try:  # read as the children of one synthetic root: a line may hold several trees
    line_root = nltk.Tree.fromstring(f"( {line} )")
  except ValueError:
    return None
  words, brackets, length = [], [], 0

  def visit(node) -> bool:
    nonlocal length
    if all(isinstance(child, str) for child in node) and node:
      if len(node) > 1:
        return False
      length += node.label() not in params.delete_labels_for_length
      if node.label() not in params.delete_labels:
        words.append(node[0])
      return True
    if any(isinstance(child, str) for child in node):
      return False
    start = len(words)
    if not all(visit(child) for child in node):
      return False
    brackets.append((node.label(), start, len(words)))
    return True

  if any(isinstance(child, str) or not visit(child) for child in line_root):
    return None
  return _ReadTree(words, brackets, length)


def _scored_brackets(brackets, params: Parameters, label_class):
  """(label class, start, end) of the brackets EVALB counts."""
  scored = []
  for label, start, end in brackets:
    if start == end:
      continue
    label = _trimmed(label)
    if any(label_class(label) == label_class(deleted) for deleted in params.delete_labels):
      continue
    scored.append((label_class(label) if params.labelled else "", start, end))
  return scored


def _trimmed(label: str) -> str:
  """EVALB's label trimming: everything from the first '-' or '=' is cut (so -NONE- -> '')."""
  for index, char in enumerate(label):
    if char in "-=":
      return label[:index]
  return label


def _equivalence(pairs):
  """A function mapping each string to a representative of its EQ class (pairs are joined
  transitively, a superset of EVALB's pairwise test that agrees on COLLINS.prm's one pair)."""
  parent: dict[str, str] = {}

  def find(x):
    while parent.get(x, x) != x:
      x = parent[x]
    return x

  for a, b in pairs:
    parent[find(a)] = find(b)
  return find
