"""Our EVALB scorer against the reference EVALB (../shared/tools/evalb compiled here with gcc,
or the one fetched and compiled into the cache: conftest's `evalb_dir`) with COLLINS.prm: real
gold trees of the treebank sample against perturbed copies of them, and EVALB's own sample
files."""
import random
import re
import shutil
import subprocess

import ml_collections
import nltk
import pytest

from aiayn_flax.parsing import evalb, linearize, treebank


@pytest.fixture(scope="module")
def reference_evalb(evalb_dir, tmp_path_factory):
  """The reference EVALB program: the cache's, compiled when it was fetched, or compiled here
  from ../shared/tools/evalb as its PROVENANCE.md says. (binary, COLLINS.prm)"""
  binary = evalb_dir / "evalb"
  if not binary.exists():
    if shutil.which("gcc") is None:
      raise RuntimeError("gcc is needed to build the reference EVALB")
    binary = tmp_path_factory.mktemp("evalb") / "evalb"
    subprocess.run(["gcc", "-O2", "-w", "-o", str(binary), str(evalb_dir / "evalb.c")],
                   check=True)
  return binary, evalb_dir / "COLLINS.prm"


def run_reference(binary, gold_lines, test_lines, tmp_path, prm):
  """{"all"|"cutoff": {"valid", "errors", "skipped", "recall", "precision", "f1",
  "complete"}} from the reference's summary (MAX_ERROR raised: it stops after 10 errors)."""
  gold, test = tmp_path / "gold.txt", tmp_path / "test.txt"
  gold.write_text("".join(line + "\n" for line in gold_lines))
  test.write_text("".join(line + "\n" for line in test_lines))
  output = subprocess.run([str(binary), "-p", str(prm), "-e", "100000", str(gold), str(test)],
                          check=True, capture_output=True, text=True).stdout
  summary = output.split("=== Summary ===")[1]
  everything, up_to_cutoff = summary.split("-- len<=")
  parts = {"all": everything, "cutoff": up_to_cutoff}
  fields = {"Number of Valid sentence": "valid", "Number of Error sentence": "errors",
            "Number of Skip  sentence": "skipped", "Bracketing Recall": "recall",
            "Bracketing Precision": "precision", "Bracketing FMeasure": "f1",
            "Complete match": "complete"}
  result = {}
  for part, text in parts.items():
    result[part] = {key: float(re.search(re.escape(name) + r"\s*=\s*(\S+)", text).group(1))
                    for name, key in fields.items()}
  return result


def ours(totals: evalb.Totals) -> dict:
  return {"valid": totals.valid, "errors": totals.errors, "skipped": totals.skipped,
          "recall": round(totals.recall, 2), "precision": round(totals.precision, 2),
          "f1": round(totals.f1, 2), "complete": round(totals.complete_match, 2)}


def assert_same_as_reference(reference_evalb, gold_lines, test_lines, tmp_path,
                             params=evalb.COLLINS, prm=None):
  binary, collins_prm = reference_evalb
  reference = run_reference(binary, gold_lines, test_lines, tmp_path, prm or collins_prm)
  scores = evalb.score_corpus(gold_lines, test_lines, params)
  assert ours(scores.all) == reference["all"]
  assert ours(scores.up_to_cutoff) == reference["cutoff"]
  return scores


def gold_trees():
  dataset = ml_collections.ConfigDict(dict(treebank_dir=""))
  return (treebank.split_trees(dataset, "validation") + treebank.split_trees(dataset, "test"))


def perturbed(tree: nltk.Tree, rng: random.Random) -> nltk.Tree:
  """A copy of a gold tree with a few parser-like mistakes: constituents relabelled (ADVP <->
  PRT among them), removed (children spliced into the parent) or added over a run of
  siblings."""
  tree = tree.copy(deep=True)
  for _ in range(rng.randint(1, 4)):
    constituents = [p for p in tree.treepositions()
                    if isinstance(tree[p], nltk.Tree) and tree[p].height() > 2]
    position = rng.choice(constituents)
    node = tree[position]
    move = rng.choice(["relabel", "remove", "add", "advp"])
    if move == "relabel":
      node.set_label(rng.choice(["NP", "VP", "PP", "S", "SBAR", "ADJP", "QP"]))
    elif move == "advp":
      node.set_label(rng.choice(["ADVP", "PRT"]))
    elif move == "remove" and position:
      parent, index = tree[position[:-1]], position[-1]
      parent[index:index + 1] = list(node)
    elif move == "add" and len(node) > 1:
      start = rng.randrange(len(node) - 1)
      end = rng.randint(start + 1, len(node))
      node[start:end] = [nltk.Tree(rng.choice(["NP", "VP", "X"]), list(node[start:end]))]
  return tree


def test_scores_match_reference_evalb_on_perturbed_gold_trees(reference_evalb, tmp_path):
  trees = gold_trees()
  rng = random.Random(0)
  gold_lines = [linearize.evalb_line(t) for t in trees]
  test_lines = [linearize.evalb_line(perturbed(t, rng)) for t in trees]
  assert all(len(line) < 4999 for line in gold_lines + test_lines)  # EVALB's line buffer
  scores = assert_same_as_reference(reference_evalb, gold_lines, test_lines, tmp_path)
  assert scores.all.valid == len(trees) and 50 < scores.all.f1 < 95  # really perturbed


def test_scores_match_reference_evalb_with_length_and_word_mismatches(reference_evalb, tmp_path):
  """Test trees whose words differ from the gold's (a word changed, a word dropped, a
  punctuation tag that hides a word, an empty line, a line that is not a tree) are errors or
  skips as in EVALB, and the rest still scores the same."""
  trees = gold_trees()[:60]
  gold_lines = [linearize.evalb_line(t) for t in trees]
  test_lines = list(gold_lines)
  for index in range(0, 60, 6):
    tree = trees[index].copy(deep=True)
    leaf = tree.leaf_treeposition(1)
    tree[leaf] = "CHANGED"
    test_lines[index] = linearize.evalb_line(tree)
  for index in range(1, 60, 6):
    test_lines[index] = test_lines[index].replace(f"({trees[index].pos()[0][1]} ", "(, ", 1)
  for index in range(2, 60, 12):
    test_lines[index] = ""
  test_lines[3] = "(S (NP (DT The)"
  test_lines[9] = re.sub(r"\(\. \.\)", "(NN .)", test_lines[9])
  scores = assert_same_as_reference(reference_evalb, gold_lines, test_lines, tmp_path)
  assert scores.all.errors >= 15 and scores.all.skipped == 5


def test_scores_match_reference_evalb_on_its_sample_files(reference_evalb, evalb_dir, tmp_path):
  sample = evalb_dir / "sample"
  gold = (sample / "sample.gld").read_text().splitlines()
  test = (sample / "sample.tst").read_text().splitlines()
  scores = assert_same_as_reference(reference_evalb, gold, test, tmp_path,
                                    evalb.read_parameters(str(sample / "sample.prm")),
                                    sample / "sample.prm")
  # The figures EVALB's README gives for these files (sample.rsl).
  assert (round(scores.all.recall, 2), round(scores.all.precision, 2)) == (87.76, 90.53)


def test_collins_parameters_are_the_ones_in_collins_prm(evalb_dir):
  assert evalb.read_parameters(str(evalb_dir / "COLLINS.prm")) == evalb.COLLINS
