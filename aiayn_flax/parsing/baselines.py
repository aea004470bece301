"""The right-branching baseline: every suffix of the sentence is a constituent. A parser that
learned anything beats it (bench/parsing_baselines.py scores it beside a PCFG)."""
import collections
from collections.abc import Iterable, Sequence

import nltk


def right_branching(words_and_tags: Sequence[tuple[str, str]], root_label: str = "S",
                    inner_label: str = "VP") -> nltk.Tree:
  """(root (t1 w1) (inner (t2 w2) (inner ... (tn wn)))): the whole sentence labelled
  `root_label`, every shorter suffix of two or more words `inner_label`."""
  preterminals = [nltk.Tree(tag, [word]) for word, tag in words_and_tags]
  if len(preterminals) < 2:
    return nltk.Tree(root_label, preterminals)
  tree = preterminals[-1]
  for index in range(len(preterminals) - 2, -1, -1):
    tree = nltk.Tree(root_label if index == 0 else inner_label, [preterminals[index], tree])
  return tree


def right_edge_labels(trees: Iterable[nltk.Tree]) -> tuple[str, str]:
  """(the most frequent root label, the most frequent label of the other constituents that
  end at the last word) of training trees: the labels right_branching is given."""
  roots, inner = collections.Counter(), collections.Counter()
  for tree in trees:
    roots[tree.label()] += 1
    node = tree
    while isinstance(node[-1], nltk.Tree) and node[-1].height() > 2:
      node = node[-1]
      inner[node.label()] += 1
  return roots.most_common(1)[0][0], inner.most_common(1)[0][0]
