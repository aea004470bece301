"""Two baselines for the parsing task, scored by our EVALB (COLLINS.prm) on a split of the
treebank sample, for comparison with evaluate.py's F1 on the same trees:

- right-branching: every suffix of the sentence is a constituent (labels: the most frequent
  root label of the training trees for the whole sentence, the most frequent label of the
  other training constituents that end at the last word for the rest);
- PCFG: a probabilistic grammar read off the training trees (nltk.induce_pcfg, trees in
  Chomsky normal form with first-order horizontal Markovization, unary chains collapsed),
  parsed by CKY (aiayn_flax/parsing/cky.py: nltk's ViterbiParser runs past its 5-second
  limit on a 5-word sentence with this grammar) over the gold part-of-speech tags: the parser
  sees tags, not words, so unknown words are no problem for it, and it is given what our
  Transformer has to infer. --max_words limits the sentences scored (all parsers alike).

  python bench/parsing_baselines.py --split=test [--transformer_tst=runs/parse/eval/test.tst]
"""
import time

from absl import app, flags
import nltk

from aiayn_flax.parsing import cky, evalb, linearize, sentences
from aiayn_flax.parsing.baselines import right_branching, right_edge_labels

flags.DEFINE_string("split", "test", "Split of the treebank sample to score.")
flags.DEFINE_integer("max_words", 0, "Score only sentences of at most this many words (0: all).")
flags.DEFINE_string("transformer_tst", None, "evaluate.py's WORKDIR/eval/<split>.tst, to score "
                    "on the same subset.")
FLAGS = flags.FLAGS


def tag_tree(tree: nltk.Tree) -> nltk.Tree:
  """The tree with each word replaced by its tag (what the PCFG parses)."""
  tree = tree.copy(deep=True)
  for position in tree.treepositions("leaves"):
    tree[position] = tree[position[:-1]].label()
  return tree


def induce_grammar(trees) -> nltk.PCFG:
  """The PCFG of the training trees over tags, with a ROOT symbol that rewrites to each
  tree's root label."""
  root = nltk.Nonterminal("ROOT")
  productions = []
  for tree in trees:
    tree = tag_tree(tree)
    tree.collapse_unary(collapsePOS=True, collapseRoot=True)
    tree.chomsky_normal_form(horzMarkov=1)
    productions += [nltk.Production(root, [nltk.Nonterminal(tree.label())])] + tree.productions()
  return nltk.induce_pcfg(root, productions)


def pcfg_parse(parser: cky.ViterbiCKY, words_and_tags) -> nltk.Tree | None:
  """The PCFG's most probable tree over the tags, with the words put back; None if the
  grammar has no parse."""
  tree = parser.parse([tag for _, tag in words_and_tags])
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

  start = time.time()
  grammar = induce_grammar(train)
  parser = cky.ViterbiCKY(grammar)
  pcfg, failures = [], 0
  for count, i in enumerate(chosen, 1):
    words_and_tags = gold_trees[i].pos()
    tree = pcfg_parse(parser, words_and_tags)
    if tree is None:  # no parse: the right-branching tree stands in (no sentence dropped)
      failures += 1
      tree = right_branching(words_and_tags, root_label, inner_label)
    pcfg.append(linearize.evalb_line(tree))
    if count % 10 == 0:
      print(f"PCFG: {count}/{len(chosen)} sentences parsed, {time.time() - start:.0f} s")
  report["PCFG (gold tags)"] = evalb.score_corpus(gold_lines, pcfg)
  pcfg_seconds = time.time() - start

  if FLAGS.transformer_tst:
    with open(FLAGS.transformer_tst, encoding="utf-8") as f:
      tst = f.read().splitlines()
    report["Transformer (evaluate.py)"] = evalb.score_corpus(gold_lines, [tst[i] for i in chosen])

  print(f"{FLAGS.split}: {len(chosen)} of {len(gold_trees)} sentences (at most "
        f"{FLAGS.max_words or 'any'} words); grammar of {len(grammar.productions())} rules, "
        f"PCFG parsing {pcfg_seconds:.0f} s, {failures} sentences without a PCFG parse")
  for name, scores in report.items():
    print(f"{name:28s} {scores.all.summary()}")


if __name__ == "__main__":
  app.run(main)
