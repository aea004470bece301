"""Trees as target sequences (Vinyals et al., 2015, "Grammar as a Foreign Language") and any
decoded sequence back into a tree over the sentence's words.

A tree is written depth first: `(LABEL` opens a constituent, `)` closes it, and each word is
the placeholder `XX` (its part-of-speech tag normalized away; the words themselves are the
model's input, not its output):

  (S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .))
  ->  (S (NP XX XX ) (VP XX (NP XX ) ) XX )

Closing brackets carry no label (Vinyals et al. wrote `)NP`): the label is implied by the
bracket being closed, so a labelled close adds only a way to be inconsistent, and one closing
token keeps the output vocabulary to the labels plus two tokens.

With `leaves="words"` each preterminal is written as its word instead of XX
(`(S (NP Ms. Haag ) (VP plays (NP Elianti ) ) . )`): the decoder then copies the input in
order between the brackets, which tells it directly which input word it has reached (see
docs/PARSING.md for when that matters).
"""
from collections.abc import Sequence

import nltk

PLACEHOLDER = "XX"  # a word's preterminal in the sequence
CLOSE = ")"
LEAVES = ("XX", "words")  # what a preterminal is written as
REPAIR_ROOT = "TOP"  # the root repair() adds over several top-level pieces (EVALB deletes TOP)


def linearize(tree: nltk.Tree, leaves: str = "XX") -> list[str]:
  """The tree's tokens, depth first; preterminals become XX, or their words."""
  if _is_preterminal(tree):
    return [PLACEHOLDER if leaves == "XX" else tree[0]]
  tokens = ["(" + tree.label()]
  for child in tree:
    tokens += linearize(child, leaves)
  tokens.append(CLOSE)
  return tokens


def words_and_tags(tree: nltk.Tree) -> tuple[list[str], list[str]]:
  """The tree's words and their part-of-speech tags, in order."""
  pairs = tree.pos()
  return [word for word, _ in pairs], [tag for _, tag in pairs]


def open_label(token: str) -> str | None:
  """The label a token opens, or None when the token opens nothing."""
  if len(token) > 1 and token[0] == "(" and "(" not in token[1:] and ")" not in token:
    return token[1:]
  return None


def repair(sequence: Sequence[str], words: Sequence[str],
           tags: Sequence[str] | None = None, leaves: str = "XX") -> nltk.Tree:
  """A well-formed tree over exactly `words`, in order, read off any token sequence.

  Every word gets exactly one preterminal (tag `tags[i]`, XX without tags), brackets are
  balanced, and a well-formed sequence over the right number of words comes back unchanged
  (`repair(linearize(t, leaves), words, tags, leaves) == t`). Tokens are read left to right
  with a stack of open constituents:
    1. `(LABEL` opens a constituent under the innermost open one.
    2. A leaf token (`XX`; with leaves="words", any token that neither opens nor closes)
       takes the next word as a preterminal of the innermost open constituent; once every
       word is placed, further ones are dropped. With words, the written words are first
       aligned to the input's (`align_written_words`): a written word takes the input word it
       is aligned to, after any input words the writing skipped (so one skipped or repeated
       word does not shift every later bracket), and one aligned to nothing is dropped.
    3. `)` closes the innermost open constituent; one with nothing in it is dropped, and a `)`
       with nothing open is dropped.
    4. Any other token (with XX leaves: a stray subword, an empty `(`) is dropped.
    5. At the end, words not yet placed join the innermost open constituent, as preterminals,
       and every open constituent is closed (empty ones dropped).
    6. If that leaves exactly one constituent at the top (not a bare preterminal) it is the
       tree; otherwise what is at the top goes under one TOP root, a label EVALB deletes, so
       the repair adds no bracket to be scored. No words: an empty TOP.
  """
  if leaves not in LEAVES:
    raise ValueError(f"leaves={leaves!r}: expected one of {LEAVES}")
  if tags is not None and len(tags) != len(words):
    raise ValueError(f"{len(words)} words but {len(tags)} tags")
  tags = tags if tags is not None else [PLACEHOLDER] * len(words)
  top: list = []  # finished pieces at the top level
  stack: list[nltk.Tree] = []  # open constituents, innermost last
  placed = 0
  leaf_targets = None  # with words: the input index each written word stands for, or None
  if leaves == "words":
    written = [t for t in sequence if _is_leaf(t, leaves)]
    leaf_targets = iter(align_written_words(written, words))

  def children_of_innermost() -> list:
    return stack[-1] if stack else top

  def close_innermost() -> None:
    closed = stack.pop()
    if len(closed):
      children_of_innermost().append(closed)

  for token in sequence:
    label = open_label(token)
    if label is not None:
      stack.append(nltk.Tree(label, []))
    elif _is_leaf(token, leaves):
      target = placed if leaf_targets is None else next(leaf_targets)
      if target is not None and placed <= target < len(words):
        for index in range(placed, target + 1):  # any skipped words, then this one
          children_of_innermost().append(nltk.Tree(tags[index], [words[index]]))
        placed = target + 1
    elif token == CLOSE:
      if stack:
        close_innermost()
  for index in range(placed, len(words)):
    children_of_innermost().append(nltk.Tree(tags[index], [words[index]]))
  while stack:
    close_innermost()
  if len(top) == 1 and not _is_preterminal(top[0]):
    return top[0]
  return nltk.Tree(REPAIR_ROOT, top)


def align_written_words(written: Sequence[str], words: Sequence[str]) -> list[int | None]:
  """For each written word, the index of the input word it stands for (None: it stands for
  none), by the alignment of least edit distance (a word copied exactly costs 0, one written
  differently 1, one left out or added 1; ties keep the earlier input word). Indices rise
  strictly, so placing the words in this order keeps the sentence's order."""
  n, m = len(written), len(words)
  # cost[i][j]: aligning written[i:] with words[j:].
  cost = [[0] * (m + 1) for _ in range(n + 1)]
  for i in range(n, -1, -1):
    for j in range(m, -1, -1):
      if i == n or j == m:
        cost[i][j] = (n - i) + (m - j)
      else:
        cost[i][j] = min(cost[i + 1][j + 1] + (written[i] != words[j]),
                         cost[i + 1][j] + 1, cost[i][j + 1] + 1)
  targets, i, j = [], 0, 0
  while i < n:
    if j < m and cost[i][j] == cost[i + 1][j + 1] + (written[i] != words[j]):
      targets.append(j)
      i, j = i + 1, j + 1
    elif cost[i][j] == cost[i + 1][j] + 1:
      targets.append(None)
      i += 1
    else:
      j += 1
  return targets


def evalb_line(tree: nltk.Tree) -> str:
  """The tree on one line as EVALB reads it, under a TOP root (which COLLINS.prm deletes)."""
  if tree.label() != REPAIR_ROOT:
    tree = nltk.Tree(REPAIR_ROOT, [tree])
  return tree.pformat(margin=1_000_000_000)


def _is_leaf(token: str, leaves: str) -> bool:
  """Whether a token places a word: XX, or with words as leaves any token but a bracket."""
  if leaves == "XX":
    return token == PLACEHOLDER
  return open_label(token) is None and token not in (CLOSE, "(")


def _is_preterminal(tree) -> bool:
  return len(tree) == 1 and isinstance(tree[0], str)
