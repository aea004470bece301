"""Silver trees (aiayn_flax/parsing/silver.py): real English lines (newstest2013, Multi30k
captions) parsed by a teacher read off the treebank sample's training trees come back as trees
over the lines' treebank tokens, with their confidences, and a second call reads the cache."""
import json
import math

import nltk
import pytest

from aiayn_flax.parsing import baselines, silver


@pytest.fixture(scope="module")
def teacher(shared_data):
  import ml_collections
  from aiayn_flax.parsing import sentences
  dataset = ml_collections.ConfigDict(dict(treebank_dir="", train_split="train"))
  # The first 800 training trees: the same grammars as the full teacher, built in seconds.
  return silver.Teacher(tuple(sentences.split_trees(dataset, "train")[:800]), max_words=20)


@pytest.fixture(scope="module")
def parsers(teacher):
  return silver.Parsers(teacher)


@pytest.fixture(scope="module")
def lines(shared_data):
  news = silver.read_lines(str(shared_data / "wmt14" / "newstest2013.en"))
  captions = silver.read_lines(str(shared_data / "multi30k" / "val.en.gz"))
  short = [line for line in news if len(line.split()) <= 14][:6]
  return short + captions[:5] + ["", "(Brackets) and \"quotes\" don't stop it."]


def test_silver_trees_are_trees_over_the_input_words(teacher, parsers, lines, tmp_path,
                                                     monkeypatch):
  monkeypatch.setattr(silver, "CHUNK_LINES", 4)  # several chunks: the workers share them
  records, cached = silver.parse_lines(lines, teacher, tmp_path, workers=2,
                                       parsers=lambda: parsers)
  assert cached == 0 and len(records) == len(lines)
  assert [r["line"] for r in records] == list(range(len(lines)))
  assert silver.treebank_words(lines[-1]) == [
      "-LRB-", "Brackets", "-RRB-", "and", "``", "quotes", "''", "do", "n't", "stop", "it", "."]
  assert records[-2]["by"] == "empty" and records[-2]["tree"] is None
  with_trees = [r for r in records if r["tree"] is not None]
  assert len(with_trees) >= len(lines) - 3
  for record, line in zip(records, lines):
    assert record["words"] == silver.treebank_words(line)
    if record["tree"] is None:
      assert record["by"] in ("empty", "no parse", "too long")
      continue
    tree = nltk.Tree.fromstring(record["tree"])
    assert tree.label() == "TOP" and tree.leaves() == record["words"]
    assert all(isinstance(child, nltk.Tree) for child in tree.subtrees())  # tags on the words
    assert record["by"] in ("teacher", "back-off")
    assert math.isfinite(record["log_prob_per_word"]) and record["log_prob_per_word"] < 0
    if record["by"] == "teacher":
      assert 0.0 <= record["agreement"] <= 100.0
    else:
      assert record["agreement"] is None  # the back-off is the second parser itself
  assert any(r["agreement"] == 100.0 for r in with_trees)  # short captions: both agree
  assert len({r["agreement"] for r in with_trees}) > 2  # and it varies


def test_a_second_call_reads_the_cache(teacher, parsers, lines, tmp_path):
  first, cached = silver.parse_lines(lines, teacher, tmp_path, workers=1,
                                     parsers=lambda: parsers)
  assert cached == 0

  def no_parsing():
    raise AssertionError("parsed again instead of reading the cache")

  again, cached = silver.parse_lines(lines, teacher, tmp_path, workers=1, parsers=no_parsing)
  assert again == first and cached == 1
  # Another teacher (a different length limit) or other lines: parsed again.
  other = silver.Teacher(teacher.train, max_words=19)
  with pytest.raises(AssertionError, match="parsed again"):
    silver.parse_lines(lines, other, tmp_path, workers=1, parsers=no_parsing)
  with pytest.raises(AssertionError, match="parsed again"):
    silver.parse_lines(lines[:-1] + ["Another line ."], teacher, tmp_path, workers=1,
                       parsers=no_parsing)


def test_confidence_thresholds_keep_the_confident_trees(teacher, parsers, lines, tmp_path):
  records, _ = silver.parse_lines(lines, teacher, tmp_path, workers=1, parsers=lambda: parsers)
  with_trees = [r for r in records if r["tree"] is not None]
  assert silver.confident(records) == with_trees
  middle = sorted(r["log_prob_per_word"] for r in with_trees)[len(with_trees) // 2]
  kept = silver.confident(records, min_log_prob_per_word=middle)
  assert 0 < len(kept) < len(with_trees)
  assert all(r["log_prob_per_word"] >= middle for r in kept)
  agreeing = silver.confident(records, min_agreement=100.0)
  assert agreeing and all(r["agreement"] == 100.0 and r["by"] == "teacher" for r in agreeing)
  rows = silver.threshold_table([dict(r, gold_f1=50.0) for r in records], "agreement",
                                (1.0, 0.5))
  assert rows[0][1] >= rows[1][1] and rows[0][0] <= rows[1][0]


def test_silver_files_name_the_bad_line(tmp_path):
  good = {"line": 0, "words": ["Hi", "."], "tree": "(TOP (S (UH Hi) (. .)))", "by": "teacher",
          "log_prob_per_word": -3.0, "agreement": 100.0}
  path = tmp_path / "x.silver.jsonl"
  path.write_text(json.dumps(good) + "\n" + "(S (NP ...\n")
  with pytest.raises(ValueError, match=r"x.silver.jsonl:2: not a silver-tree record"):
    silver.read_silver(str(path))
  path.write_text(json.dumps(good) + "\n")
  assert silver.read_silver(str(path)) == [good]
  latin1 = tmp_path / "latin1.en"
  latin1.write_bytes("caf\xe9\n".encode("latin-1"))
  with pytest.raises(ValueError, match="latin1.en: not UTF-8"):
    silver.read_lines(str(latin1))


def test_moses_bpe_text_is_undone_before_tokenizing(shared_data):
  europarl = silver.read_lines(
      str(shared_data / "wmt14" / "train_sample_nematus_europarl" / "corpus.en"), moses_bpe=True)
  assert europarl[0] == "resumption of the session"
  assert not any("@@" in line or "&apos;" in line or "&quot;" in line for line in europarl)
