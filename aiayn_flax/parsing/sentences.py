"""The parsing task's text, as the data pipeline and the scorers take it: a split's sentences
(words joined by spaces, the model's input), their linearized trees (the target) and their
gold trees on one line each (what EVALB scores against)."""
import functools

from aiayn_flax.parsing import linearize, treebank

# PTB tokens for brackets: a word "(" would break the bracketed line of its tree.
BRACKET_WORDS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-",
                 "}": "-RCB-"}


@functools.lru_cache(maxsize=8)
def _trees(treebank_dir: str, split: str):
  """A split's preprocessed trees, read once per process (the pipeline asks several times)."""
  import ml_collections
  return tuple(treebank.split_trees(ml_collections.ConfigDict(dict(treebank_dir=treebank_dir)),
                                    split))


def split_trees(dataset, split: str):
  return _trees(dataset.get("treebank_dir", ""), split)


def tree_leaves(dataset) -> str:
  """config.dataset.tree_leaves: what the linearized trees write for a word, XX or the word."""
  leaves = dataset.get("tree_leaves", "XX")
  if leaves not in linearize.LEAVES:
    raise ValueError(f"config.dataset.tree_leaves={leaves!r}: expected one of {linearize.LEAVES}")
  return leaves


def text_pairs(dataset, split: str) -> tuple[list[str], list[str]]:
  """(sentences, linearized trees) of a split, in file order, one pair per tree."""
  trees, leaves = split_trees(dataset, split), tree_leaves(dataset)
  return ([" ".join(tree.leaves()) for tree in trees],
          [" ".join(linearize.linearize(tree, leaves)) for tree in trees])


def gold_lines(dataset, split: str) -> list[str]:
  """The split's gold trees, one EVALB line each, in file order."""
  return [linearize.evalb_line(tree) for tree in split_trees(dataset, split)]


def tree_tokens(dataset) -> list[str]:
  """Every token of the training split's linearized trees (labels, `)`, `XX`), sorted."""
  return sorted({token for tree in split_trees(dataset, dataset.train_split)
                 for token in linearize.linearize(tree)})


def sentence_words(sentence: str) -> list[str]:
  """A sentence's words as the tree holds them: split at white space, every bracket written as
  the treebank writes it (-LRB- ...), alone or inside a word (`f(x)` -> `f-LRB-x-RRB-`), so
  that the tree's line reads back as one tree over these words."""
  return ["".join(BRACKET_WORDS.get(c, c) for c in word) for word in sentence.split()]


def tree_line(sentence: str, decoded: str, gold_line: str | None = None,
              leaves: str = "XX") -> str:
  """The decoded sequence repaired into a tree over the sentence's words, on one line; with
  the gold tree's line, its part-of-speech tags go on the words (see evaluation.py), else XX.
  An empty sentence gives an empty line."""
  words = sentence_words(sentence)
  if not words:
    return ""
  tags = None
  if gold_line is not None:
    import nltk
    gold_words, tags = linearize.words_and_tags(nltk.Tree.fromstring(gold_line))
    if gold_words != words:
      raise ValueError(f"the sentence {sentence!r} is not the gold tree's {' '.join(gold_words)!r}")
  return linearize.evalb_line(linearize.repair(decoded.split(), words, tags, leaves))
