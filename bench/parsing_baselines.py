"""Two baselines for the parsing task, scored by our EVALB (COLLINS.prm) on a split of the
treebank sample, for comparison with evaluate.py's F1 on the same trees:

- right-branching: every suffix of the sentence is a constituent (labels: the most frequent
  root label of the training trees for the whole sentence, the most frequent label of the
  other training constituents that end at the last word for the rest);
- PCFG: a probabilistic grammar read off the training trees (nltk.induce_pcfg, trees in
  Chomsky normal form with first-order horizontal Markovization, unary chains collapsed),
  parsed by CKY (aiayn_flax/parsing/cky.py: nltk's ViterbiParser runs past its 5-second
  limit on a 5-word sentence with this grammar), twice:
  - over the words, as the Transformer sees a sentence: its lexical rules are read off the
    training words, those seen once standing for unknown words by their shape (`word_classes`);
  - over the gold part-of-speech tags: unknown words are then no problem, and the parser is
    given what the Transformer has to infer (an upper reference, not a like-for-like peer).
--max_words limits the sentences scored (all parsers alike).

  python bench/parsing_baselines.py --split=test [--transformer_tst=runs/parse/eval/test.tst]
"""
import collections
from collections.abc import Callable
import time

from absl import app, flags
import nltk

from aiayn_flax.parsing import cky, evalb, linearize, sentences
from aiayn_flax.parsing.baselines import right_branching, right_edge_labels

flags.DEFINE_string("split", "test", "Split of the treebank sample to score.")
flags.DEFINE_integer("max_words", 0, "Score only sentences of at most this many words (0: all).")
flags.DEFINE_list("pcfg", ["words", "tags"], "What the PCFG parses: words, gold tags, or both.")
flags.DEFINE_string("transformer_tst", None, "evaluate.py's WORKDIR/eval/<split>.tst, to score "
                    "on the same subset.")
FLAGS = flags.FLAGS


SUFFIXES = ("ing", "ed", "ly", "ion", "er", "est", "al", "ive", "ble", "ity", "s")


def by_tag(word: str, tag: str) -> str:
  """The PCFG's terminal when it parses gold tags."""
  return tag


def word_classes(trees) -> Callable[[str, str], str]:
  """The PCFG's terminal when it parses words: a word seen at least twice in `trees` is its
  own terminal; any other word (seen once in training, or never) becomes an UNK class of its
  shape (digits, capital, hyphen, a common suffix), so that the rules learnt from rare
  training words apply to unknown test words."""
  counts = collections.Counter(word for tree in trees for word in tree.leaves())
  known = {word for word, count in counts.items() if count > 1}

  def terminal(word: str, tag: str) -> str:
    if word in known:
      return word
    if any(c.isdigit() for c in word):
      return "UNK-NUM"
    shape = "UNK-CAP" if word[0].isupper() else "UNK-DASH" if "-" in word else "UNK"
    return shape + next((f"-{s}" for s in SUFFIXES if word.lower().endswith(s)), "")
  return terminal


def terminal_tree(tree: nltk.Tree, terminal=by_tag) -> nltk.Tree:
  """The tree with each word replaced by its terminal (what the PCFG parses)."""
  tree = tree.copy(deep=True)
  for position in tree.treepositions("leaves"):
    tree[position] = terminal(tree[position], tree[position[:-1]].label())
  return tree


def induce_grammar(trees, terminal=by_tag) -> nltk.PCFG:
  """The PCFG of the training trees over `terminal`s, with a ROOT symbol that rewrites to
  each tree's root label."""
  root = nltk.Nonterminal("ROOT")
  productions = []
  for tree in trees:
    tree = terminal_tree(tree, terminal)
    tree.collapse_unary(collapsePOS=True, collapseRoot=True)
    tree.chomsky_normal_form(horzMarkov=1)
    productions += [nltk.Production(root, [nltk.Nonterminal(tree.label())])] + tree.productions()
  return nltk.induce_pcfg(root, productions)


def pcfg_parse(parser: cky.ViterbiCKY, words_and_tags, terminal=by_tag) -> nltk.Tree | None:
  """The PCFG's most probable tree over the terminals, with the words put back; None if the
  grammar has no parse."""
  tree = parser.parse([terminal(word, tag) for word, tag in words_and_tags])
  if tree is None:
    return None
  tree.un_chomsky_normal_form()
  for position, (word, _) in zip(tree.treepositions("leaves"), words_and_tags):
    tree[position] = word
  return tree


def main(argv):
  del argv
  import ml_collections
  dataset = ml_collections.ConfigDict(dict(treebank_dir="", train_split="train"))
  train = sentences.split_trees(dataset, "train")
  gold_trees = sentences.split_trees(dataset, FLAGS.split)
  chosen = [i for i, t in enumerate(gold_trees)
            if not FLAGS.max_words or len(t.leaves()) <= FLAGS.max_words]
  gold_lines = [linearize.evalb_line(gold_trees[i]) for i in chosen]

  root_label, inner_label = right_edge_labels(train)
  right = [linearize.evalb_line(right_branching(gold_trees[i].pos(), root_label, inner_label))
           for i in chosen]
  report = {"right-branching": evalb.score_corpus(gold_lines, right)}

  seconds, failures, rules = {}, {}, {}
  for source in FLAGS.pcfg:
    terminal = word_classes(train) if source == "words" else by_tag
    start = time.time()
    grammar = induce_grammar(train, terminal)
    rules[source] = len(grammar.productions())
    parser = cky.ViterbiCKY(grammar)
    pcfg, failures[source] = [], 0
    for count, i in enumerate(chosen, 1):
      words_and_tags = gold_trees[i].pos()
      tree = pcfg_parse(parser, words_and_tags, terminal)
      if tree is None:  # no parse: the right-branching tree stands in (no sentence dropped)
        failures[source] += 1
        tree = right_branching(words_and_tags, root_label, inner_label)
      pcfg.append(linearize.evalb_line(tree))
      if count % 25 == 0:
        print(f"PCFG over {source}: {count}/{len(chosen)} sentences, {time.time() - start:.0f} s")
    report[f"PCFG ({'gold tags' if source == 'tags' else 'words'})"] = evalb.score_corpus(
        gold_lines, pcfg)
    seconds[source] = time.time() - start

  if FLAGS.transformer_tst:
    with open(FLAGS.transformer_tst, encoding="utf-8") as f:
      tst = f.read().splitlines()
    report["Transformer (evaluate.py)"] = evalb.score_corpus(gold_lines, [tst[i] for i in chosen])

  print(f"{FLAGS.split}: {len(chosen)} of {len(gold_trees)} sentences (at most "
        f"{FLAGS.max_words or 'any'} words)")
  for source in FLAGS.pcfg:
    print(f"PCFG over {source}: {rules[source]} rules, {seconds[source]:.0f} s, "
          f"{failures[source]} sentences without a parse (right-branching tree instead)")
  for name, scores in report.items():
    print(f"{name:28s} {scores.all.summary()}")


if __name__ == "__main__":
  app.run(main)
