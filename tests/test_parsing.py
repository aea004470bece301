"""Trees for the parsing task: the treebank sample's split and preprocessing, the
linearization's round trip, and repair() on sequences a decoder might produce."""
import random

import ml_collections
import nltk
import pytest

from aiayn_flax.parsing import evalb, linearize, treebank

SAMPLE = ml_collections.ConfigDict(dict(treebank_dir=""))


@pytest.fixture(scope="module")
def sample_splits(shared_data):
  return {split: (treebank.raw_split_trees(SAMPLE, split), treebank.split_trees(SAMPLE, split))
          for split in ("train", "validation", "test")}


def test_sample_split_by_file_has_the_stated_sizes(sample_splits):
  sizes = {split: len(trees) for split, (_, trees) in sample_splits.items()}
  assert sizes == {"train": 3396, "validation": 273, "test": 245}


def test_preprocessing_strips_function_tags_and_empty_elements(sample_splits):
  raw, trees = sample_splits["train"]
  assert str(raw[0]).count("NP-SBJ") == 1
  assert trees[0] == nltk.Tree.fromstring(
      "(S (NP (NP (NNP Pierre) (NNP Vinken)) (, ,) (ADJP (NP (CD 61) (NNS years)) (JJ old)) (, ,))"
      " (VP (MD will) (VP (VB join) (NP (DT the) (NN board)) (PP (IN as) (NP (DT a) (JJ"
      " nonexecutive) (NN director))) (NP (NNP Nov.) (CD 29)))) (. .))")
  for raw_tree, tree in zip(raw, trees):
    labels = {t.label() for t in tree.subtrees() if t.height() > 2}
    assert not any("-" in label or "=" in label or "|" in label for label in labels), labels
    assert "-NONE-" not in {tag for _, tag in tree.pos()}
    assert all(len(t) for t in tree.subtrees())  # no constituent left empty
    assert tree.leaves() == [w for w, tag in raw_tree.pos() if tag != "-NONE-"]


def test_a_constituent_holding_only_an_empty_element_is_removed():
  tree = nltk.Tree.fromstring(
      "(S (NP-SBJ-1 (-NONE- *T*-1)) (VP (VBD said) (SBAR (-NONE- 0) (S (NP-SBJ (-NONE- *))"
      " (VP (VBD won))))) (. .))")
  assert treebank.preprocess(tree) == nltk.Tree.fromstring(
      "(S (VP (VBD said) (SBAR (S (VP (VBD won))))) (. .))")


@pytest.mark.parametrize("leaves", linearize.LEAVES)
def test_linearize_then_repair_gives_back_every_sample_tree(sample_splits, leaves):
  count = 0
  for _, trees in sample_splits.values():
    for tree in trees:
      words, tags = linearize.words_and_tags(tree)
      sequence = linearize.linearize(tree, leaves)
      assert linearize.repair(sequence, words, tags, leaves) == tree
      brackets = [t for t in sequence if t == linearize.CLOSE or linearize.open_label(t)]
      assert [t for t in sequence if t not in brackets] == (
          [linearize.PLACEHOLDER] * len(words) if leaves == "XX" else words)
      count += 1
  assert count == 3914


def test_linearization_is_depth_first_with_placeholder_tags_or_words():
  tree = nltk.Tree.fromstring("(S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .))")
  assert " ".join(linearize.linearize(tree)) == "(S (NP XX XX ) (VP XX (NP XX ) ) XX )"
  assert " ".join(linearize.linearize(tree, "words")) == (
      "(S (NP Ms. Haag ) (VP plays (NP Elianti ) ) . )")
  # Read back, a written word only places the next input word, whatever it says.
  assert linearize.repair("(S (NP Ms. Hag ) (VP plays (NP Elianti".split(), tree.leaves(),
                          leaves="words") == nltk.Tree.fromstring(
      "(S (NP (XX Ms.) (XX Haag)) (VP (XX plays) (NP (XX Elianti) (XX .))))")
  # Written words are aligned to the input's: a word left out or written twice does not move
  # the later brackets (by count alone, `plays` would open the NP below).
  # A skipped word is placed just before the next word written.
  skipped = "(S (NP Ms. ) (VP plays (NP Elianti ) ) . )".split()
  assert linearize.repair(skipped, tree.leaves(), leaves="words") == nltk.Tree.fromstring(
      "(S (NP (XX Ms.)) (VP (XX Haag) (XX plays) (NP (XX Elianti))) (XX .))")
  repeated = "(S (NP Ms. Haag Haag ) (VP plays (NP Elianti ) ) . )".split()
  assert linearize.repair(repeated, tree.leaves(), leaves="words") == nltk.Tree.fromstring(
      "(S (NP (XX Ms.) (XX Haag)) (VP (XX plays) (NP (XX Elianti))) (XX .))")
  assert linearize.align_written_words(["a", "x", "c", "c"], ["a", "b", "c"]) == [0, 1, 2, None]


def assert_well_formed_over(tree: nltk.Tree, words, tags):
  """A tree whose leaves are exactly `words`, each under its own preterminal (tag `tags[i]`),
  with no empty constituent and no constituent mixing words and constituents."""
  assert tree.leaves() == list(words)
  assert tree.pos() == list(zip(words, tags))
  for subtree in tree.subtrees():
    kinds = {isinstance(child, str) for child in subtree}
    if True in kinds:
      assert len(subtree) == 1  # a preterminal: one word
    else:
      assert len(subtree) > 0 or (subtree is tree and not words)
  # ... and it reads back as EVALB reads it: the same words, all brackets balanced.
  line = linearize.evalb_line(tree)
  assert line.count("(") == line.count(")")
  assert nltk.Tree.fromstring(line).leaves() == list(words)


GARBAGE_TOKENS = ["(S", "(NP", "(VP", "(PP", "(SBAR", ")", ")", ")", "XX", "XX", "XX", "XX",
                  "(", "((NP", "NP)", "▁", "dog", "(X)", ""]


@pytest.mark.parametrize("leaves", linearize.LEAVES)
def test_repair_makes_a_tree_over_the_words_from_any_sequence(leaves):
  rng = random.Random(0)
  for trial in range(3000):
    words = [f"w{i}" for i in range(rng.randint(0, 12))]
    tags = [rng.choice(["NN", "DT", ","]) for _ in words] if trial % 2 else None
    tokens = GARBAGE_TOKENS + (words[:3] if leaves == "words" else [])
    sequence = [rng.choice(tokens) for _ in range(rng.randint(0, 40))]
    tree = linearize.repair(sequence, words, tags, leaves)
    assert_well_formed_over(tree, words, tags or [linearize.PLACEHOLDER] * len(words))


def test_repair_rules_on_typical_decoding_errors():
  words = ["a", "b", "c"]
  repair = lambda text: str(linearize.repair(text.split(), words)).replace("\n", "")
  # Too few XX: the missing words join the innermost open constituent.
  assert repair("(S (NP XX ) (VP XX") == "(S (NP (XX a)) (VP (XX b) (XX c)))"
  # Too many XX and closes: the extra ones are dropped.
  assert repair("(S XX XX XX XX ) ) )") == "(S (XX a) (XX b) (XX c))"
  # Several pieces at the top go under TOP (which EVALB does not count).
  assert repair("(NP XX ) (VP XX XX )") == "(TOP (NP (XX a)) (VP (XX b) (XX c)))"
  # Empty constituents and stray tokens vanish.
  assert repair("(S (PP ) dog XX (NP XX XX ) )") == "(S (XX a) (NP (XX b) (XX c)))"
  assert repair("") == "(TOP (XX a) (XX b) (XX c))"


def test_repaired_trees_score_as_evalb_expects_against_gold(sample_splits):
  """Gold against the gold linearization repaired with the gold tags: 100 F1; against the
  same sequence with its last third cut off: every sentence still scored, below 100."""
  _, trees = sample_splits["test"]
  gold, whole, truncated = [], [], []
  for tree in trees:
    words, tags = linearize.words_and_tags(tree)
    sequence = linearize.linearize(tree)
    gold.append(linearize.evalb_line(tree))
    whole.append(linearize.evalb_line(linearize.repair(sequence, words, tags)))
    truncated.append(linearize.evalb_line(
        linearize.repair(sequence[:2 * len(sequence) // 3], words, tags)))
  assert evalb.score_corpus(gold, whole).all.f1 == 100.0
  cut = evalb.score_corpus(gold, truncated).all
  assert cut.valid == len(trees) and cut.f1 < 90


def test_cky_finds_the_parse_nltk_viterbi_parser_finds(sample_splits):
  """The baseline's CKY and nltk's ViterbiParser agree on the most probable parse, with a
  grammar read off 200 sample trees as the baseline reads it, on the tag sequences of short
  test sentences."""
  from aiayn_flax.parsing import cky
  from aiayn_flax.parsing import baselines
  grammar = baselines.induce_grammar(sample_splits["train"][1][:200])
  ours, nltks = cky.ViterbiCKY(grammar), nltk.ViterbiParser(grammar)
  nltks.max_time = None
  known = {p.rhs()[0] for p in grammar.productions() if isinstance(p.rhs()[0], str)}
  short = [t for t in sample_splits["test"][1]
           if 4 <= len(t.leaves()) <= 9 and {tag for _, tag in t.pos()} <= known][:8]
  parsed = 0
  for tree in short:
    tags = [tag for _, tag in tree.pos()]
    expected = next(iter(nltks.parse(tags)), None)
    found = ours.parse(tags)
    if expected is None:
      assert found is None
    else:
      assert found == nltk.Tree.convert(expected[0])
      parsed += 1
  assert parsed >= 4


def test_parsing_task_scores_gold_sequences_at_100_and_outputs_a_tree_per_line(sample_splits):
  from aiayn_flax import tasks
  from configs import parsing_sample
  config = parsing_sample.get_config()
  task = tasks.for_config(config)
  sources, references = task.sources_and_references(config, "validation")
  assert len(sources) == len(references) == 273
  gold_sequences = [" ".join(linearize.linearize(t)) for t in sample_splits["validation"][1]]
  assert task.validation_metrics(sources, gold_sequences, references) == {
      "f1": 100.0, "exact_match": 1.0}
  outputs = task.outputs(["a ( b ) .", "", "c"], ["(S XX XX XX XX XX )", "(S XX )", ""])
  assert outputs == ["(TOP (S (XX a) (XX -LRB-) (XX b) (XX -RRB-) (XX .)))", "",
                     "(TOP (XX c))"]


def test_tree_tokens_are_single_vocabulary_pieces(sample_splits, tmp_path):
  """The vocabulary keeps every tree token whole, so a tree is as many pieces as tokens."""
  from aiayn_flax import tasks
  from aiayn_flax.data import pipeline
  from configs import parsing_sample
  config = parsing_sample.get_config()
  vocab = pipeline.vocabulary_for(config, str(tmp_path), tasks.for_config(config))
  for tree in sample_splits["test"][1][:50]:
    sequence = " ".join(linearize.linearize(tree))
    assert len(vocab.encode(sequence)) == len(sequence.split())
    assert vocab.decode(vocab.encode(sequence)) == sequence
  assert len(tasks.for_config(config).reserved_pieces(config)) == 27  # 25 labels, ")" and XX
