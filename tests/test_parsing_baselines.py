"""The parsing baselines and the significance test of bench/parsing_table.py: the PCFG with
parent annotation and horizontal Markovization 2 (the first two steps of Klein & Manning)
against rule probabilities computed by hand, its binarisation undone exactly on every sample
tree, every system's output carrying the gold tags, and the paired bootstrap on cases whose
answer is known."""
import fractions

import ml_collections
import nltk
import numpy as np
import pytest

from aiayn_flax.parsing import baselines, bootstrap, evalb, linearize, treebank

SAMPLE = ml_collections.ConfigDict(dict(treebank_dir=""))

FOUR_TREES = [
    "(S (NP (DT the) (NN cat)) (VP (VBD sat)) (. .))",
    "(S (NP (DT a) (JJ big) (NN dog)) (VP (VBD ran) (PP (IN to) (NP (PRP it)))))",
    "(S (NP (DT the) (NN man)) (VP (VBD left)))",
    "(S (NP (PRP he)) (VP (VBD saw) (NP (DT the) (NN dog))))",
]


def grammar_table(grammar: nltk.PCFG) -> dict[str, fractions.Fraction]:
  return {str(p).split(" [")[0]: fractions.Fraction(p.prob()).limit_denominator(100)
          for p in grammar.productions()}


def test_parent_annotated_markovized_pcfg_has_the_hand_computed_rule_probabilities():
  """Counted by hand from FOUR_TREES: unary chains collapse (VP -> VBD becomes the preterminal
  VP+VBD), each phrasal label below the root carries its parent's (NP^<S> and NP^<VP> are
  different symbols with their own distributions), and a three-child node is binarised with
  the next two siblings in the new node's name."""
  trees = [nltk.Tree.fromstring(t) for t in FOUR_TREES]
  F = fractions.Fraction
  expected = {
      "ROOT -> S": F(1),
      "S -> NP^<S> S|<VP+VBD-.>": F(1, 4), "S -> NP^<S> VP^<S>": F(1, 4),
      "S -> NP^<S> VP+VBD": F(1, 4), "S -> NP+PRP VP^<S>": F(1, 4),
      "S|<VP+VBD-.> -> VP+VBD .": F(1),
      "NP^<S> -> DT NN": F(2, 3), "NP^<S> -> DT NP|<JJ-NN>^<S>": F(1, 3),
      "NP|<JJ-NN>^<S> -> JJ NN": F(1),
      "NP^<VP> -> DT NN": F(1),
      "VP^<S> -> VBD PP^<VP>": F(1, 2), "VP^<S> -> VBD NP^<VP>": F(1, 2),
      "PP^<VP> -> IN NP+PRP": F(1),
      "DT -> 'DT'": F(1), "NN -> 'NN'": F(1), "JJ -> 'JJ'": F(1), ". -> '.'": F(1),
      "VBD -> 'VBD'": F(1), "VP+VBD -> 'VBD'": F(1), "IN -> 'IN'": F(1),
      "NP+PRP -> 'PRP'": F(1),
  }
  assert grammar_table(baselines.induce_grammar(trees, grammar=baselines.PARENT_ANNOTATED_H2)) == expected
  vanilla = grammar_table(baselines.induce_grammar(trees, grammar=baselines.VANILLA))
  assert vanilla["NP -> DT NN"] == F(3, 4) and vanilla["NP -> DT NP|<JJ>"] == F(1, 4)
  assert vanilla["VP -> VBD PP"] == F(1, 2) and not any("^" in rule for rule in vanilla)


def test_markovization_keeps_the_given_number_of_siblings():
  tree = nltk.Tree.fromstring("(NP (DT the) (JJ big) (JJ red) (NN dog))")
  h1 = grammar_table(baselines.induce_grammar([tree], grammar=baselines.Grammar(1, False)))
  h2 = grammar_table(baselines.induce_grammar([tree], grammar=baselines.Grammar(2, False)))
  assert "NP|<JJ> -> JJ NP|<JJ>" in h1 and "NP|<JJ> -> JJ NN" in h1
  assert "NP -> DT NP|<JJ-JJ>" in h2 and "NP|<JJ-JJ> -> JJ NP|<JJ-NN>" in h2


@pytest.mark.parametrize("grammar", [baselines.VANILLA, baselines.PARENT_ANNOTATED_H2],
                         ids=["vanilla", "parent_h2"])
def test_binarisation_is_undone_exactly_on_every_sample_tree(shared_data, grammar):
  trees = [t for split in ("train", "validation", "test")
           for t in treebank.split_trees(SAMPLE, split)]
  assert len(trees) == 3914
  changed = 0
  for tree in trees:
    binary = baselines.binarize(tree, grammar)
    assert all(len(node) <= 2 for node in binary.subtrees())
    changed += binary != tree
    assert baselines.debinarize(binary) == tree
  assert changed > 3000  # the round trip is not trivially of unchanged trees


def test_every_system_output_carries_the_gold_tags_and_no_sentence_is_an_evalb_error(
    shared_data):
  """The PCFGs parse words, and may tag `.` or `,` otherwise than the gold tree: their output
  gets the gold tags, as the Transformer's does, so EVALB aligns every sentence."""
  train = treebank.split_trees(SAMPLE, "train")
  gold = treebank.split_trees(SAMPLE, "validation")[:6]
  gold_lines = [linearize.evalb_line(t) for t in gold]
  parses = baselines.pcfg_lines(train, gold, baselines.PARENT_ANNOTATED_H2)
  for line, tree in zip(parses.lines, gold):
    assert nltk.Tree.fromstring(line).pos() == tree.pos()
  scores = evalb.score_corpus(gold_lines, parses.lines).all
  assert scores.valid == len(gold) and 50 < scores.f1 < 100
  right = evalb.score_corpus(gold_lines, baselines.right_branching_lines(train, gold)).all
  assert right.valid == len(gold) and right.f1 < scores.f1


def test_a_sentence_the_annotated_grammar_cannot_parse_goes_to_its_back_off_grammar():
  """Parent annotation splits NP into NP^<S> (here only DT NN) and NP^<VP> (only JJ NNS): "he
  saw the cat" needs a DT NN object, which the annotated grammar cannot build and the vanilla
  grammar can."""
  train = [nltk.Tree.fromstring("(S (NP (DT the) (NN cat)) (VP (VBD slept)))"),
           nltk.Tree.fromstring("(S (NP (PRP he)) (VP (VBD saw) (NP (JJ big) (NNS cats))))")]
  gold = [nltk.Tree.fromstring("(S (NP (PRP he)) (VP (VBD saw) (NP (DT the) (NN cat))))")]
  alone = baselines.pcfg_lines(train, gold, baselines.Grammar(2, True), over="tags")
  assert (alone.without_parse, alone.backed_off) == (1, 0)  # right-branching stood in
  backed = baselines.pcfg_lines(train, gold, baselines.PARENT_ANNOTATED_H2, over="tags")
  vanilla = baselines.pcfg_lines(train, gold, baselines.VANILLA, over="tags")
  assert (backed.without_parse, backed.backed_off) == (0, 1)
  assert backed.lines == vanilla.lines == [linearize.evalb_line(gold[0])]


# --- the paired bootstrap -------------------------------------------------------------------

def counts_with_one_difference(n: int) -> tuple[np.ndarray, np.ndarray]:
  """A matches all of every sentence's 2 brackets; B the same except none in sentence 0."""
  a = np.tile([2, 2, 2], (n, 1))
  b = a.copy()
  b[0] = [0, 2, 2]
  return a, b


def test_bootstrap_p_value_is_the_chance_that_a_resample_misses_the_one_sentence_that_differs():
  """A is better than B on one sentence of n and equal on the others: a resample shows A not
  better exactly when it does not draw that sentence, probability (1 - 1/n)^n (0.349 for 10)."""
  n = 10
  a, b = counts_with_one_difference(n)
  result = bootstrap.paired_bootstrap(a, b, resamples=20_000, seed=1)
  assert result.p_value == pytest.approx((1 - 1 / n) ** n, abs=0.01)
  assert result.difference == pytest.approx(100 - 90)  # corpus F1 100 against 18/20 = 90
  assert result.interval[0] == 0 and result.interval[1] > 0


def test_bootstrap_of_equal_systems_gives_p_one_and_of_a_better_system_everywhere_gives_p_zero():
  a, b = counts_with_one_difference(50)
  assert bootstrap.paired_bootstrap(b, b).p_value == 1.0
  everywhere = a.copy()
  b_everywhere = np.tile([1, 2, 2], (50, 1))
  result = bootstrap.paired_bootstrap(everywhere, b_everywhere)
  assert result.p_value == 0.0 and result.difference == pytest.approx(50)
  assert result.resamples == bootstrap.RESAMPLES == 1000


def test_bootstrap_scores_corpus_f1_not_the_mean_of_sentence_f1s_and_averages_seeds():
  """Corpus F1 sums the brackets first: a long sentence weighs more than a short one. Two
  seeds count by the mean of their F1s on every resample."""
  counts = np.array([[10, 10, 10], [0, 1, 1]])  # sentence F1s 100 and 0; corpus 10/11
  assert bootstrap.corpus_f1(counts) == pytest.approx(100 * 10 / 11)
  seed_a, seed_b = np.tile([2, 2, 2], (5, 1)), np.tile([0, 2, 2], (5, 1))  # F1 100 and 0
  half = np.tile([1, 2, 2], (5, 1))  # F1 50
  result = bootstrap.paired_bootstrap([seed_a, seed_b], half)
  assert result.difference == 0 and result.p_value == 1.0


def test_sentence_counts_are_evalb_counts_and_zero_for_a_sentence_evalb_leaves_out():
  gold = "(TOP (S (NP (DT the) (NN cat)) (VP (VBD sat))))"
  good = "(TOP (S (DT the) (VP (NN cat) (VBD sat))))"
  other_words = "(TOP (S (NP (DT a) (NN dog)) (VP (VBD sat))))"
  counts = bootstrap.sentence_counts([gold, gold, gold], [gold, good, other_words])
  assert counts.tolist() == [[3, 3, 3], [1, 3, 2], [0, 0, 0]]  # S matches; VP(1,3) does not
