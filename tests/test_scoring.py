"""Scoring against real system outputs whose BLEU is published (see shared/data/README.md)."""
import collections
import json
import math
import pathlib
import re
import subprocess
import sys

import pytest
import sacrebleu
from sacremoses import MosesTokenizer

from aiayn_flax import scoring
from aiayn_flax.data.text_files import read_lines


@pytest.fixture(scope="module")
def tfnmt(shared_data) -> pathlib.Path:
  return shared_data / "wmt14" / "systems" / "tfnmt_newstest2013_deen"


@pytest.fixture(scope="module")
def opusmt_output(shared_data) -> pathlib.Path:
  return (shared_data / "wmt14" / "systems" / "opusmt_newstest2014_ende" /
          "newstest2014.eng-deu.output")


@pytest.fixture(scope="module")
def newstest2014_de(shared_data) -> pathlib.Path:
  return shared_data / "wmt14" / "newstest2014.de"


# tensorflow/nmt's evaluation_utils_test.py asserts this for deen_output against the reference.
TFNMT_BLEU = 22.5855084573


def tfnmt_hypothesis_tokens(tfnmt):
  # tensorflow/nmt: line.strip().split(" "), so each of the 3 empty lines is one "" token.
  return [line.strip().split(" ") for line in read_lines(str(tfnmt / "deen_output"))]


def test_tokenized_bleu_matches_tensorflow_nmt_on_bpe_reference(tfnmt):
  references = [re.sub("@@ ", "", line.strip()).split(" ")
                for line in read_lines(str(tfnmt / "deen_ref_bpe"))]
  result = scoring.tokenized_bleu(tfnmt_hypothesis_tokens(tfnmt), references)
  assert result["score"] == pytest.approx(TFNMT_BLEU, abs=1e-6)
  assert (result["hyp_len"], result["ref_len"]) == (63214, 64807)


def test_tokenized_bleu_matches_tensorflow_nmt_on_sentencepiece_reference(tfnmt):
  # tensorflow/nmt's spm cleaning: join the pieces, then "▁" marks the spaces.
  references = ["".join(line.split()).replace("\u2581", " ").lstrip().split(" ")
                for line in read_lines(str(tfnmt / "deen_ref_spm"))]
  result = scoring.tokenized_bleu(tfnmt_hypothesis_tokens(tfnmt), references)
  assert result["score"] == pytest.approx(TFNMT_BLEU, abs=1e-6)
  assert result["hyp_len"] == 63214


def test_whitespace_split_drops_empty_tokens_like_sacrebleu_tokenize_none(tfnmt):
  hypotheses = read_lines(str(tfnmt / "deen_output"))
  references = [re.sub("@@ ", "", line) for line in read_lines(str(tfnmt / "deen_ref_bpe"))]
  result = scoring.tokenized_bleu([h.split() for h in hypotheses],
                                  [r.split() for r in references])
  assert result["score"] == pytest.approx(22.584677521, abs=1e-6)
  assert result["hyp_len"] == 63211
  # The README's sacreBLEU line (default exp smoothing: no count is zero, so no effect).
  expected = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none", force=True)
  assert result["score"] == pytest.approx(expected.score, abs=1e-9)
  assert (expected.sys_len, expected.ref_len) == (63211, 64807)


def test_tokenized_bleu_counts_empty_tokens_and_tokens_with_spaces_as_given():
  hypothesis = [["", "a b", "c"]]
  result = scoring.tokenized_bleu(hypothesis, [["", "a b", "c"]])
  assert result["hyp_len"] == 3
  assert result["counts"][:3] == [3, 2, 1]
  # "a b" is one token: it must not match the two tokens "a", "b".
  assert scoring.tokenized_bleu(hypothesis, [["a", "b"]])["counts"][0] == 0


@pytest.mark.parametrize("text, expected", [
    ("well-known", "well ##AT##-##AT## known"),
    ("Nord-Süd-Gefälle ist gut-bekannt",
     "Nord ##AT##-##AT## Süd ##AT##-##AT## Gefälle ist gut ##AT##-##AT## bekannt"),
    ("2013-2014", "2013 ##AT##-##AT## 2014"),
    ("Gutach - Noch mehr", "Gutach - Noch mehr"),  # a free-standing dash is not a compound
    ("-5 und Ost-", "-5 und Ost-"),  # nothing on one side
    ("a -b c- d", "a -b c- d"),
    # tensor2tensor's perl rule, copied on purpose: any non-space character counts...
    ("U.S.-Wahl", "U.S. ##AT##-##AT## Wahl"),
    # ...and matches do not overlap: a one-character middle part is used up by the first match.
    ("Howl-O-Scream", "Howl ##AT##-##AT## O-Scream"),
])
def test_split_compounds_follows_tensor2tensor(text, expected):
  assert scoring.split_compounds(text) == expected


@pytest.fixture(scope="module")
def opusmt_scores(opusmt_output, newstest2014_de):
  return scoring.score_files(str(opusmt_output), str(newstest2014_de), "de")


def test_opusmt_sacrebleu_matches_its_published_score(opusmt_scores):
  # Published: BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.0.0 = 27.6
  # 58.6/33.3/21.2/14.0 (BP = 1.000 ratio = 1.032 hyp_len = 64669 ref_len = 62688), chrF2 0.58438.
  assert round(opusmt_scores["sacrebleu"], 5) == pytest.approx(27.59844, abs=1e-4)
  signature = opusmt_scores["sacrebleu_signature"]
  assert "tok:13a" in signature and "case:mixed" in signature and "smooth:exp" in signature
  details = opusmt_scores["sacrebleu_details"]
  assert [round(p, 1) for p in details["precisions"]] == [58.6, 33.3, 21.2, 14.0]
  assert (details["hyp_len"], details["ref_len"], details["bp"]) == (64669, 62688, 1.0)
  assert opusmt_scores["chrf"] == pytest.approx(58.43772, abs=1e-4)
  assert "nc:6" in opusmt_scores["chrf_signature"]


@pytest.mark.slow
def test_opusmt_sacrebleu_equals_the_sacrebleu_command_line(opusmt_scores, opusmt_output,
                                                           newstest2014_de):
  command = pathlib.Path(sys.executable).parent / "sacrebleu"
  output = subprocess.run(
      [str(command), str(newstest2014_de), "-i", str(opusmt_output), "-m", "bleu", "-b", "-w", "5"],
      check=True, capture_output=True, text=True).stdout
  assert output.strip() == f"{opusmt_scores['sacrebleu']:.5f}"


def test_opusmt_paper_protocol_regression(opusmt_scores):
  # Regression value, measured with this module (sacremoses 0.2.0, sacrebleu 2.6.0) via
  # score_files(OPUS-MT output, newstest2014.de, "de"): 28.17813139 59.4/33.9/21.7/14.4,
  # hyp_len 66072, ref_len 64496. Compound splitting adds ~1400 easy tokens on each side,
  # which is why it reads 0.58 above sacreBLEU.
  assert opusmt_scores["tokenized_bleu"] == pytest.approx(28.17813139, abs=1e-4)
  details = opusmt_scores["tokenized_bleu_details"]
  assert (details["hyp_len"], details["ref_len"]) == (66072, 64496)
  assert "smooth:none" in details["signature"] and "tok:none" in details["signature"]
  assert "##AT##" in opusmt_scores["tokenized_bleu_protocol"]


def multi_bleu(hypotheses: list[list[str]], references: list[list[str]]) -> float:
  """Corpus BLEU-4 as Moses' multi-bleu.perl defines it (clipped n-gram matches summed over
  the corpus, geometric mean of the four precisions, brevity penalty exp(1 - r/c) when c < r),
  written here from that definition: an independent check of scoring.tokenized_bleu, which
  goes through sacrebleu's BLEU class."""
  matches, totals, hyp_len, ref_len = [0] * 4, [0] * 4, 0, 0
  for hyp, ref in zip(hypotheses, references, strict=True):
    hyp_len, ref_len = hyp_len + len(hyp), ref_len + len(ref)
    for n in range(1, 5):
      ref_counts = collections.Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
      hyp_counts = collections.Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
      matches[n - 1] += sum(min(c, ref_counts[gram]) for gram, c in hyp_counts.items())
      totals[n - 1] += max(len(hyp) - n + 1, 0)
  if min(matches) == 0:
    return 0.0
  brevity = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
  return 100 * brevity * math.exp(sum(math.log(m / t) for m, t in zip(matches, totals)) / 4)


def test_paper_protocol_equals_an_independent_multi_bleu(opusmt_scores, opusmt_output,
                                                        newstest2014_de):
  tokenizer = MosesTokenizer(lang="de")

  def paper_tokens(path):  # tokenizer.perl -l de, then get_ende_bleu.sh's compound splitting
    return [re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", tokenizer.tokenize(line, return_str=True),
                   flags=re.ASCII).split() for line in read_lines(str(path))]

  expected = multi_bleu(paper_tokens(opusmt_output), paper_tokens(newstest2014_de))
  assert opusmt_scores["tokenized_bleu"] == pytest.approx(expected, abs=1e-9)


def test_moses_escaping_does_not_change_paper_bleu(opusmt_scores, opusmt_output,
                                                  newstest2014_de):
  # Why escape=True is safe to mirror tokenizer.perl: the same score without escaping.
  tokenizer = MosesTokenizer(lang="de")

  def unescaped_tokens(path):
    return [
        scoring.split_compounds(tokenizer.tokenize(line, escape=False, return_str=True)).split()
        for line in read_lines(str(path))]

  result = scoring.tokenized_bleu(
      unescaped_tokens(opusmt_output), unescaped_tokens(newstest2014_de))
  assert result["score"] == opusmt_scores["tokenized_bleu"]
  assert "&quot;" in scoring.moses_tokenize('"Ja"', "de")


def test_scores_are_json_serialisable_and_readable(opusmt_scores):
  assert json.loads(json.dumps(opusmt_scores)) == opusmt_scores
  text = scoring.format_scores(opusmt_scores)
  assert "BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in text and "= 27.60" in text
  assert "chrF2|" in text and "= 58.44" in text
  assert "tokenized BLEU (paper protocol) = 28.18" in text and "##AT##" in text


def test_reference_scored_against_itself_is_100(newstest2014_de):
  reference = read_lines(str(newstest2014_de))
  scores = scoring.score_translations(reference, reference, "de")
  assert scores["sacrebleu"] == pytest.approx(100.0)
  assert scores["sacrebleu_details"]["ref_len"] == 62688
  assert scores["tokenized_bleu"] == pytest.approx(100.0)
  assert scores["chrf"] == pytest.approx(100.0)


def test_score_files_names_both_files_and_counts_on_length_mismatch(tmp_path, newstest2014_de):
  short_output = tmp_path / "short.de"
  short_output.write_text("Gutach: Noch mehr Sicherheit für Fußgänger\nZweite Zeile\n", "utf-8")
  with pytest.raises(ValueError) as error:
    scoring.score_files(str(short_output), str(newstest2014_de), "de")
  message = str(error.value)
  assert str(short_output) in message and str(newstest2014_de) in message
  assert "2 lines" in message and "3003 lines" in message


def test_score_translations_names_both_counts_on_length_mismatch():
  with pytest.raises(ValueError, match=r"2 hypotheses but 3 references"):
    scoring.score_translations(["a", "b"], ["a", "b", "c"], "de")


@pytest.mark.parametrize("stem, lang, published_sha256", [
    # sha256 of multi30k/dataset's data/task1/tok/{stem}.lc.norm.tok.{lang} (commit a3d2e0d).
    ("test_2016_flickr", "de", "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4"),
    ("test_2016_flickr", "en", "5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2"),
    ("test_2017_flickr", "de", "02067e4a9402786a4fcb8c1b6f4307e4a5073ced64800abead5273b54f5f31f6"),
])
def test_multi30k_tokenization_reproduces_the_published_tokenized_files(stem, lang,
                                                                        published_sha256,
                                                                        shared_data):
  import gzip
  import hashlib
  with gzip.open(shared_data / "multi30k" / f"{stem}.{lang}.gz", "rt", encoding="utf-8") as f:
    raw = f.read().splitlines()
  tokenized = "".join(scoring.multi30k_tokenize(line, lang) + "\n" for line in raw)
  assert hashlib.sha256(tokenized.encode("utf-8")).hexdigest() == published_sha256


def test_multi30k_bleu_ignores_case_and_scores_tokens():
  references = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
                "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun."]
  hypotheses = ["EIN MANN MIT EINEM ORANGEFARBENEN HUT, DER ETWAS ANSTARRT.",
                "ein boston terrier läuft über saftig-grünes gras vor einem weißen zaun ."]
  scores = scoring.multi30k_bleu(hypotheses, references, "de")
  assert scores["score"] == pytest.approx(100.0)
  assert scores["hyp_len"] == scores["ref_len"] == 11 + 12  # "hut ," and "anstarrt ." split
  assert sacrebleu.corpus_bleu(hypotheses, [references]).score < 50  # cased sacreBLEU differs
  # One wrong word in 23: the same counts as tokenized_bleu on the published tokens.
  wrong = ["ein mann mit einem roten hut , der etwas anstarrt .", hypotheses[1]]
  expected = scoring.tokenized_bleu(
      [line.split() for line in wrong],
      [scoring.multi30k_tokenize(line, "de").split() for line in references])
  assert scoring.multi30k_bleu(wrong, references, "de")["score"] == expected["score"] < 100


def test_multi30k_bleu_is_printed_only_when_asked(opusmt_scores):
  assert "multi30k_bleu" not in opusmt_scores
  assert "Multi30k" not in scoring.format_scores(opusmt_scores)
  scores = scoring.score_translations(["Ein Hund läuft durch den Schnee."],
                                      ["ein hund läuft durch den schnee ."], "de", multi30k=True)
  assert scores["multi30k_bleu"] == pytest.approx(100.0)
  assert "lowercased tokenized BLEU (Multi30k literature" in scoring.format_scores(scores)
  json.dumps(scores)
