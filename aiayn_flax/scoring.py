"""Scoring translations: sacreBLEU (the number to publish) and the paper's tokenized BLEU.

Three protocols, both computed with sacrebleu's own classes (no hand-written n-gram counting):

* sacreBLEU on detokenized text: cased BLEU with the 13a tokenizer and exp smoothing, and chrF2,
  each with its signature. This is the comparable, reproducible figure.
* The paper's protocol, which is tensor2tensor's `utils/get_ende_bleu.sh`: Moses
  `tokenizer.perl -l de` on the output (the reference was tokenized the same way), compound
  splitting `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g` on both sides, then Moses `multi-bleu.perl`
  (whitespace tokens, cased, no smoothing). 27.3 (base) and 28.4 (big) on newstest2014 EN-DE
  were measured this way. It reads higher than sacreBLEU on the same output (OPUS-MT on
  newstest2014: 28.18 against 27.60), mostly because each split compound adds two easy matches.
* The Multi30k literature's BLEU (the WMT multimodal translation task's scoring): both sides
  lowercased, punctuation-normalized and Moses-tokenized exactly as multi30k/dataset made its
  `data/task1/tok/*.lc.norm.tok.*` files (lowercase.perl | normalize-punctuation.perl -l LANG |
  tokenizer.perl -l LANG), then multi-bleu.perl. It is not comparable with cased sacreBLEU
  (it reads higher: docs/RESULTS.md gives both on the same outputs); it is printed only so
  that a Multi30k result can be set beside published ones.
"""
import functools
import re

import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from aiayn_flax.data.text_files import read_lines

# tensor2tensor's `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`, copied rule for rule so that
# our numbers are comparable with the paper's:
# - perl reads bytes there, so only ASCII whitespace counts as a space (hence re.ASCII);
# - matches do not overlap, so when one character sits between two hyphens ("Howl-O-Scream")
#   the first match uses it up and the second "-" stays (perl does the same); on OPUS-MT's
#   newstest2014 output, splitting those too would give 28.1844 instead of 28.1781.
# - any non-space character may sit next to the "-", not only word characters ("U.S.-Wahl").
_COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)", re.ASCII)

PAPER_PROTOCOL = (
    "tensor2tensor get_ende_bleu.sh: sacremoses MosesTokenizer(lang={lang}) on hypotheses and "
    "references (escape=True, like tokenizer.perl), compound splitting (\\S)-(\\S) -> "
    "##AT##-##AT##, corpus BLEU-4 on whitespace tokens, cased, no smoothing (multi-bleu.perl)")

MULTI30K_PROTOCOL = (
    "Multi30k / WMT multimodal task: lowercased, sacremoses MosesPunctNormalizer(lang={lang}) "
    "and MosesTokenizer(lang={lang}) (escape=True) on hypotheses and references, as "
    "multi30k/dataset's data/task1/tok files; corpus BLEU-4 on whitespace tokens, no smoothing "
    "(multi-bleu.perl)")


def split_compounds(text: str) -> str:
  """tensor2tensor's compound splitting: "well-known" -> "well ##AT##-##AT## known".

  Apply it to Moses-tokenized text, where a "-" with non-space characters on both sides is a
  hyphen inside a word; a free-standing " - " is left alone.
  """
  return _COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", text)


def _check_same_length(hypotheses, references):
  if len(hypotheses) != len(references):
    raise ValueError(
        f"{len(hypotheses)} hypotheses but {len(references)} references: "
        "every segment needs exactly one hypothesis")


def _bleu_fields(score) -> dict:
  """The JSON-serialisable parts of a sacrebleu BLEUScore."""
  return {
      "score": score.score,
      "precisions": [float(p) for p in score.precisions],
      "counts": [int(c) for c in score.counts],
      "totals": [int(t) for t in score.totals],
      "bp": score.bp,
      "ratio": score.ratio,
      "hyp_len": int(score.sys_len),
      "ref_len": int(score.ref_len),
  }


def sacrebleu_scores(hypotheses: list[str], references: list[str]) -> dict:
  """sacreBLEU with its defaults (cased, 13a, exp smoothing) and chrF2, with signatures.

  Texts must be detokenized; `line` is the score line exactly as the sacrebleu command prints it.
  """
  _check_same_length(hypotheses, references)
  bleu = BLEU()
  bleu_score = bleu.corpus_score(hypotheses, [references])
  bleu_signature = bleu.get_signature().format()
  chrf = CHRF()
  chrf_score = chrf.corpus_score(hypotheses, [references])
  chrf_signature = chrf.get_signature().format()
  return {
      "bleu": _bleu_fields(bleu_score) | {
          "signature": bleu_signature,
          "line": bleu_score.format(signature=bleu_signature),
      },
      "chrf": {
          "score": chrf_score.score,
          "signature": chrf_signature,
          "line": chrf_score.format(signature=chrf_signature),
      },
  }


def tokenized_bleu(hypothesis_tokens: list[list[str]], reference_tokens: list[list[str]],
                   smooth: str = "none") -> dict:
  """Corpus BLEU-4 (cased, one reference) on token lists, counted exactly as given.

  sacrebleu splits each line on whitespace, which would drop empty tokens ("".split(" ") gives
  [""], one token for tensorflow/nmt's BLEU) and split tokens that hold spaces. So every distinct
  token is first renamed to a space-free id ("t0", "t1", ...); that renaming is one-to-one, so
  sacrebleu's n-gram matches, clipping and lengths are those of the original tokens.
  """
  _check_same_length(hypothesis_tokens, reference_tokens)
  token_ids: dict[str, str] = {}

  def as_id_line(tokens):
    return " ".join(token_ids.setdefault(t, f"t{len(token_ids)}") for t in tokens)

  hypotheses = [as_id_line(tokens) for tokens in hypothesis_tokens]
  references = [as_id_line(tokens) for tokens in reference_tokens]
  # force: the ids look nothing like text; skip sacrebleu's "is this tokenized?" guess.
  bleu = BLEU(tokenize="none", smooth_method=smooth, force=True)
  score = bleu.corpus_score(hypotheses, [references])
  return _bleu_fields(score) | {"signature": bleu.get_signature().format()}


@functools.lru_cache(maxsize=None)
def _moses_tokenizer(lang: str):
  # Imported here: sacremoses takes 0.2-0.35 s to import, a third of what train.py imports,
  # and only the tokenized BLEUs read it.
  from sacremoses import MosesTokenizer
  return MosesTokenizer(lang=lang)


def moses_tokenize(text: str, lang: str) -> str:
  """Moses tokenizer.perl -l LANG with its defaults: no aggressive dash splitting, escaping on.

  Escaping (& -> &amp;, " -> &quot;, ...) is what tokenizer.perl does by default, as
  get_ende_bleu.sh and the newstest*.tok.de references used it. It cannot change BLEU: it maps
  one character to one fixed entity inside a token, on both sides, and never touches "-" or a
  token boundary (measured on OPUS-MT's newstest2014 output: identical with escape=False).
  """
  return _moses_tokenizer(lang).tokenize(text, escape=True, return_str=True)


def paper_tokenized_bleu(hypotheses: list[str], references: list[str], lang: str) -> dict:
  """BLEU as the paper measured it (see the module docstring), from detokenized text."""
  _check_same_length(hypotheses, references)

  def paper_tokens(line):
    # multi-bleu.perl splits on whitespace, so empty tokens never occur here.
    return split_compounds(moses_tokenize(line, lang)).split()

  scores = tokenized_bleu([paper_tokens(h) for h in hypotheses],
                          [paper_tokens(r) for r in references], smooth="none")
  return scores | {"protocol": PAPER_PROTOCOL.format(lang=lang)}


@functools.lru_cache(maxsize=None)
def _moses_punct_normalizer(lang: str):
  from sacremoses import MosesPunctNormalizer
  return MosesPunctNormalizer(lang=lang)


def multi30k_tokenize(text: str, lang: str) -> str:
  """A raw line as multi30k/dataset's `*.lc.norm.tok.*` files hold it: lowercased, then
  punctuation normalized, then Moses-tokenized (tokenizer.perl defaults, escaping on).
  Reproduces those files of test2016 and test2017 byte for byte (tests/test_scoring.py)."""
  normalized = _moses_punct_normalizer(lang).normalize(text.lower())
  return moses_tokenize(normalized, lang)


def multi30k_bleu(hypotheses: list[str], references: list[str], lang: str) -> dict:
  """The BLEU the Multi30k literature reports (see the module docstring), from raw text."""
  _check_same_length(hypotheses, references)
  scores = tokenized_bleu([multi30k_tokenize(h, lang).split() for h in hypotheses],
                          [multi30k_tokenize(r, lang).split() for r in references],
                          smooth="none")
  return scores | {"protocol": MULTI30K_PROTOCOL.format(lang=lang)}


def score_translations(hypotheses: list[str], references: list[str], target_lang: str,
                       multi30k: bool = False) -> dict:
  """sacreBLEU, chrF2 and the paper's tokenized BLEU in one JSON-serialisable dict; with
  `multi30k`, also the Multi30k literature's lowercased tokenized BLEU."""
  _check_same_length(hypotheses, references)
  sacre = sacrebleu_scores(hypotheses, references)
  paper = paper_tokenized_bleu(hypotheses, references, target_lang)
  extra = {}
  if multi30k:
    lowercased = multi30k_bleu(hypotheses, references, target_lang)
    extra = {"multi30k_bleu": lowercased["score"],
             "multi30k_bleu_protocol": lowercased["protocol"],
             "multi30k_bleu_details": {k: v for k, v in lowercased.items()
                                       if k not in ("score", "protocol")}}
  bleu_details = {
      k: v for k, v in sacre["bleu"].items() if k not in ("score", "signature", "line")}
  return {
      "num_segments": len(hypotheses),
      "target_lang": target_lang,
      "sacrebleu": sacre["bleu"]["score"],
      "sacrebleu_signature": sacre["bleu"]["signature"],
      "sacrebleu_details": bleu_details,
      "sacrebleu_line": sacre["bleu"]["line"],
      "chrf": sacre["chrf"]["score"],
      "chrf_signature": sacre["chrf"]["signature"],
      "chrf_line": sacre["chrf"]["line"],
      "tokenized_bleu": paper["score"],
      "tokenized_bleu_protocol": paper["protocol"],
      "tokenized_bleu_details": {
          k: v for k, v in paper.items() if k not in ("score", "protocol")},
      "sacrebleu_version": sacrebleu.__version__,
  } | extra


def score_files(hyp_path: str, ref_path: str, target_lang: str, multi30k: bool = False) -> dict:
  """score_translations on two aligned text files (one segment per line)."""
  hypotheses, references = read_lines(hyp_path), read_lines(ref_path)
  if len(hypotheses) != len(references):
    raise ValueError(
        f"hypothesis and reference files differ in length: {hyp_path} has {len(hypotheses)} "
        f"lines, {ref_path} has {len(references)} lines")
  return score_translations(hypotheses, references, target_lang, multi30k) | {
      "hypotheses_file": hyp_path, "references_file": ref_path}


def format_scores(scores: dict) -> str:
  """A few human-readable lines from a score_translations dict."""
  lines = [scores["sacrebleu_line"], scores["chrf_line"],
           _bleu_line("tokenized BLEU (paper protocol)", scores["tokenized_bleu"],
                      scores["tokenized_bleu_details"]),
           f"  protocol: {scores['tokenized_bleu_protocol']}"]
  if "multi30k_bleu" in scores:
    lines += [_bleu_line("lowercased tokenized BLEU (Multi30k literature, not comparable with "
                         "sacreBLEU)", scores["multi30k_bleu"], scores["multi30k_bleu_details"]),
              f"  protocol: {scores['multi30k_bleu_protocol']}"]
  return "\n".join(lines)


def _bleu_line(name: str, score: float, details: dict) -> str:
  precisions = "/".join(f"{p:.1f}" for p in details["precisions"])
  return (f"{name} = {score:.2f} {precisions} (BP = {details['bp']:.3f} "
          f"hyp_len = {details['hyp_len']} ref_len = {details['ref_len']})")
