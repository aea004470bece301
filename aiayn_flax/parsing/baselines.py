"""The parsing baselines, on the same trees, scorer and preprocessing as the Transformer:

- right-branching: every suffix of the sentence is a constituent;
- a PCFG read off the training trees (nltk.induce_pcfg) and parsed by CKY (cky.py), over the
  words, in two flavours: the vanilla treebank grammar (first-order horizontal Markovization,
  no parent annotation) and PARENT_ANNOTATED_H2: every phrasal label annotated with its
  parent's (Johnson 1998) and horizontal Markovization 2 (each binarised node remembers the
  two siblings it still has to build). These are only the first two steps of Klein & Manning
  (2003); their further splits (tag annotations, head and split-point marks), which took their
  unlexicalised grammar to 85.7 F1 on WSJ 23, are not here. Its symbols are split finely for 3,396 trees: a sentence it cannot parse (21 of the
  273 validation sentences) is parsed by the vanilla grammar instead (its back-off), and only
  a sentence neither parses gets the right-branching tree.

Tags are handled alike for every system: every system reads the words only, and every system's
output tree carries the gold part-of-speech tags on its preterminals. The Transformer predicts
no tags; putting the gold ones on every output makes EVALB delete the same punctuation on both
sides, so that no sentence becomes an EVALB error because of a tagging mistake, and all systems
are scored on brackets alone. (A PCFG given the gold tags as its input would know what the
others infer: `bench/parsing_baselines.py --pcfg=tags` keeps it as an upper reference only.)
"""
import collections
from collections.abc import Callable, Iterable, Sequence
import dataclasses

import nltk

from aiayn_flax.parsing import cky, linearize


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


# --- PCFG ---------------------------------------------------------------------------------

SUFFIXES = ("ing", "ed", "ly", "ion", "er", "est", "al", "ive", "ble", "ity", "s")


def by_tag(word: str, tag: str) -> str:
  """The PCFG's terminal when it parses gold tags (the upper reference only)."""
  del word
  return tag


def word_classes(trees) -> Callable[[str, str], str]:
  """The PCFG's terminal when it parses words: a word seen at least twice in `trees` is its
  own terminal; any other word (seen once in training, or never) becomes an UNK class of its
  shape (digits, capital, hyphen, a common suffix), so that the rules learnt from rare
  training words apply to unknown test words."""
  counts = collections.Counter(word for tree in trees for word in tree.leaves())
  known = {word for word, count in counts.items() if count > 1}

  def terminal(word: str, tag: str) -> str:
    del tag
    if word in known:
      return word
    if any(c.isdigit() for c in word):
      return "UNK-NUM"
    shape = "UNK-CAP" if word[0].isupper() else "UNK-DASH" if "-" in word else "UNK"
    return shape + next((f"-{s}" for s in SUFFIXES if word.lower().endswith(s)), "")
  return terminal


@dataclasses.dataclass(frozen=True)
class Grammar:
  """How the training trees become grammar rules: `horizontal` siblings remembered by each
  binarised node (nltk's horzMarkov), and `parent` annotation of phrasal labels; `backoff`:
  the grammar that parses a sentence this one cannot."""
  horizontal: int = 1
  parent: bool = False
  backoff: "Grammar | None" = None

  @property
  def name(self) -> str:
    return (f"PCFG (h={self.horizontal}{', parent-annotated' if self.parent else ''}"
            f"{f', h={self.backoff.horizontal} back-off' if self.backoff else ''})")


VANILLA = Grammar(horizontal=1, parent=False)
PARENT_ANNOTATED_H2 = Grammar(horizontal=2, parent=True, backoff=VANILLA)


def binarize(tree: nltk.Tree, grammar: Grammar) -> nltk.Tree:
  """A copy of the tree as the grammar's rules see it: unary chains collapsed into one label
  (`S+VP`, preterminals included), phrasal labels annotated with their parent's (`NP^<S>`)
  when `grammar.parent`, and nodes of more than two children binarised to the right with
  horizontal Markovization (`NP|<JJ-NN>`)."""
  return _binarize_in_place(tree.copy(deep=True), grammar)


def _binarize_in_place(tree: nltk.Tree, grammar: Grammar) -> nltk.Tree:
  tree.collapse_unary(collapsePOS=True, collapseRoot=True)
  tree.chomsky_normal_form(horzMarkov=grammar.horizontal, vertMarkov=1 if grammar.parent else 0)
  return tree


def debinarize(tree: nltk.Tree) -> nltk.Tree:
  """binarize's inverse: a copy with the binarised nodes spliced out, the parent annotations
  removed and the unary chains expanded."""
  tree = tree.copy(deep=True)
  tree.un_chomsky_normal_form()
  return tree


def terminal_tree(tree: nltk.Tree, terminal=by_tag) -> nltk.Tree:
  """A copy of the tree with each word replaced by its terminal (what the PCFG parses), built in
  one pass (a deep copy, then each leaf reached by its position: the vanilla grammar's induction
  on the sample took 3.3-3.9 s that way, 2.4-2.6 s this way, alone, alternating)."""
  return nltk.Tree(tree.label(), [terminal_tree(child, terminal) if isinstance(child, nltk.Tree)
                                  else terminal(child, tree.label()) for child in tree])


def induce_grammar(trees, terminal=by_tag, grammar: Grammar = VANILLA) -> nltk.PCFG:
  """The PCFG of the training trees over `terminal`s (relative frequencies of the binarised
  trees' rules), with a ROOT symbol that rewrites to each tree's root label."""
  root = nltk.Nonterminal("ROOT")
  productions = []
  for tree in trees:
    tree = _binarize_in_place(terminal_tree(tree, terminal), grammar)  # a copy already
    productions += [nltk.Production(root, [nltk.Nonterminal(tree.label())])] + tree.productions()
  return nltk.induce_pcfg(root, productions)


def pcfg_parse(parser: cky.ViterbiCKY, words_and_tags, terminal=by_tag) -> nltk.Tree | None:
  """The PCFG's most probable tree over the terminals, debinarised, with the words and their
  gold tags put back on the preterminals; None if the grammar has no parse."""
  tree = parser.parse([terminal(word, tag) for word, tag in words_and_tags])
  if tree is None:
    return None
  tree = debinarize(tree)
  return with_tags(tree, words_and_tags)


def with_tags(tree: nltk.Tree, words_and_tags) -> nltk.Tree:
  """The tree with the i-th preterminal holding the i-th (word, tag)."""
  tree = tree.copy(deep=True)
  positions = tree.treepositions("leaves")
  if len(positions) != len(words_and_tags):
    raise ValueError(f"{len(positions)} leaves for {len(words_and_tags)} words")
  for position, (word, tag) in zip(positions, words_and_tags):
    tree[position[:-1]].set_label(tag)
    tree[position] = word
  return tree


@dataclasses.dataclass
class Parses:
  lines: list[str]  # one EVALB line per sentence, in order
  without_parse: int  # sentences no grammar could parse (right-branching stands in)
  backed_off: int = 0  # sentences parsed by the back-off grammar


def pcfg_lines(train: Sequence[nltk.Tree], gold: Sequence[nltk.Tree], grammar: Grammar,
               over: str = "words", progress: Callable[[int], None] | None = None) -> Parses:
  """The PCFG read off `train` (over the words, or the gold tags), parsing every tree of `gold`
  from its words (tags), with the gold tags on the output's preterminals. A sentence the
  grammar cannot parse goes to its back-off grammar, if any; one that no grammar parses gets
  the right-branching tree (no sentence is dropped)."""
  terminal = word_classes(train) if over == "words" else by_tag
  parsers = []
  while grammar is not None:
    parsers.append(cky.ViterbiCKY(induce_grammar(train, terminal, grammar)))
    grammar = grammar.backoff
  root_label, inner_label = right_edge_labels(train)
  lines, failures, backed_off = [], 0, 0
  for count, tree in enumerate(gold, 1):
    words_and_tags = tree.pos()
    for rank, parser in enumerate(parsers):
      parsed = pcfg_parse(parser, words_and_tags, terminal)
      if parsed is not None:
        backed_off += rank > 0
        break
    else:
      failures += 1
      parsed = right_branching(words_and_tags, root_label, inner_label)
    lines.append(linearize.evalb_line(parsed))
    if progress:
      progress(count)
  return Parses(lines, failures, backed_off)


def right_branching_lines(train: Sequence[nltk.Tree], gold: Sequence[nltk.Tree]) -> list[str]:
  root_label, inner_label = right_edge_labels(train)
  return [linearize.evalb_line(right_branching(tree.pos(), root_label, inner_label))
          for tree in gold]
