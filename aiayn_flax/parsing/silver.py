"""Silver trees: plain English text parsed by a teacher, for training on gold and silver trees
(Table 4's semi-supervised row; the paper's teacher was the BerkeleyParser, on 17M sentences).

  python -m aiayn_flax.parsing.silver --out_dir=silver newstest2013.en europarl.en ...

Each input line is one sentence. It is tokenized as the treebank is (nltk's Treebank
tokenizer: `don't` -> `do n't`, `"` -> `` and '', brackets -> -LRB- ...), parsed by the
teacher, the strongest baseline here (baselines.PARENT_ANNOTATED_H2: the PCFG of the treebank's
training trees with parent annotation and h=2, the vanilla PCFG where it has no parse), and
written as one JSON object per input line to OUT_DIR/<file name>.silver.jsonl:

  {"line": 7, "words": [...], "tree": "(TOP (S ...))",   # null: no tree (see "by")
   "by": "teacher" | "back-off" | "no parse" | "too long" | "empty",
   "log_prob_per_word": -7.9,   # the teacher's Viterbi log-probability over the words, per word
   "agreement": 81.5}            # EVALB F1 of the tree against the second parser's (the vanilla
                                 # PCFG); null where the back-off parsed it or without a tree

Both are confidences: "high confidence" is a threshold on either, chosen on the treebank's
validation split (`validation_confidence` parses it the same way and scores each tree against
gold). The teacher's tree carries its own part-of-speech tags.

Sentences are parsed in chunks of CHUNK_LINES, in parallel over the cores (one process each,
reading the grammars once when it starts), and each chunk is cached under its content and the
teacher's (the training trees, the grammars, the tokenizer, `max_words`): a second call, or a
file sharing lines with one already parsed, reads the cache; an interrupted call resumes.
"""
import dataclasses
import functools
import gzip
import hashlib
import json
import multiprocessing
import os
import pathlib
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence

from aiayn_flax.parsing import baselines, cky, evalb, linearize

CHUNK_LINES = 100
FORMAT_VERSION = 1  # changes the cache key when the output or the parsing changes
MOSES_ESCAPES = {"&amp;": "&", "&#124;": "|", "&lt;": "<", "&gt;": ">", "&apos;": "'",
                 "&quot;": '"', "&#91;": "[", "&#93;": "]"}


def read_lines(path: str, moses_bpe: bool = False) -> list[str]:
  """The file's lines (gzip when it ends in .gz), as text: with `moses_bpe`, BPE joins
  (`@@ `) and Moses escapes (&apos; ...) undone, as in the Europarl sample of the data folder."""
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      lines = f.read().splitlines()
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not UTF-8 text ({e})") from e
  if moses_bpe:
    lines = [re.sub(r"@@( |$)", "", line) for line in lines]
    pattern = re.compile("|".join(map(re.escape, MOSES_ESCAPES)))
    lines = [pattern.sub(lambda m: MOSES_ESCAPES[m.group(0)], line) for line in lines]
  return lines


def treebank_words(line: str) -> list[str]:
  """A line of text in the treebank's tokens (nltk's TreebankWordTokenizer, brackets written
  -LRB- -RRB- ... as the treebank's words are)."""
  from nltk.tokenize import TreebankWordTokenizer
  return TreebankWordTokenizer().tokenize(line, convert_parentheses=True)


@dataclasses.dataclass(frozen=True)
class Teacher:
  """The grammars that parse: the teacher (`grammar`, with its back-off) and the second parser
  whose agreement is a confidence, all read off `train` (the treebank's training trees)."""
  train: tuple
  grammar: baselines.Grammar = baselines.PARENT_ANNOTATED_H2
  second: baselines.Grammar | None = baselines.VANILLA
  max_words: int = 40  # longer sentences get no tree: CKY time grows as the cube

  def key(self) -> str:
    """What the parses depend on besides the sentences: the cache key's teacher part."""
    digest = hashlib.sha256()
    for tree in self.train:
      digest.update(linearize.evalb_line(tree).encode() + b"\n")
    return json.dumps({"version": FORMAT_VERSION, "train": digest.hexdigest(),
                       "grammar": repr(self.grammar), "second": repr(self.second),
                       "max_words": self.max_words, "tokenizer": "nltk TreebankWordTokenizer"},
                      sort_keys=True)


class Parsers:
  """The teacher's CKY parsers, built once per process that parses."""

  def __init__(self, teacher: Teacher):
    self.teacher = teacher
    self.terminal = baselines.word_classes(teacher.train)
    built = {}  # grammar -> its parser (the back-off and the second parser are often one)

    def parser_of(grammar):
      if grammar not in built:
        built[grammar] = cky.ViterbiCKY(baselines.induce_grammar(teacher.train, self.terminal,
                                                                 grammar))
      return built[grammar]

    self.chain = []
    grammar = teacher.grammar
    while grammar is not None:
      self.chain.append(parser_of(grammar))
      grammar = grammar.backoff
    self.second = parser_of(teacher.second) if teacher.second else None

  def parse(self, number: int, words: list[str]) -> dict:
    record = {"line": number, "words": words, "tree": None, "log_prob_per_word": None,
              "agreement": None}
    if not words:
      return dict(record, by="empty")
    if len(words) > self.teacher.max_words:
      return dict(record, by="too long")
    terminals = [self.terminal(word, None) for word in words]
    for rank, parser in enumerate(self.chain):
      tree, log_prob = parser.parse_scored(terminals)
      if tree is not None:
        break
    else:
      return dict(record, by="no parse")
    tree = _with_words(baselines.debinarize(tree), words)
    line = linearize.evalb_line(tree)
    record.update(tree=line, by="teacher" if rank == 0 else "back-off",
                  log_prob_per_word=round(log_prob / len(words), 4))
    if self.second is not None and rank == 0:
      other, _ = self.second.parse_scored(terminals)
      if other is not None:  # scored with the teacher's tags on both (same punctuation)
        other = baselines.with_tags(_with_words(baselines.debinarize(other), words),
                                    tree.pos())
        score = evalb.score_sentence(line, linearize.evalb_line(other))
        record["agreement"] = round(200.0 * score.matched / max(score.gold + score.test, 1), 2)
      else:
        record["agreement"] = 0.0
    return record


def _with_words(tree, words: Sequence[str]):
  """The parse (over word classes) with the words back on its leaves, its own tags kept."""
  tree = tree.copy(deep=True)
  positions = tree.treepositions("leaves")
  for position, word in zip(positions, words, strict=True):
    tree[position] = word
  return tree


_PARSERS: Parsers | None = None  # this process's parsers (a worker builds its own)


def _start_worker(teacher: Teacher) -> None:
  global _PARSERS
  _PARSERS = Parsers(teacher)


def _parse_chunk(chunk: tuple[int, list[str], bool]) -> list[dict]:
  first, lines, tokenized = chunk
  return [_PARSERS.parse(first + i, line.split() if tokenized else treebank_words(line))
          for i, line in enumerate(lines)]


def chunk_key(teacher_key: str, lines: Sequence[str]) -> str:
  digest = hashlib.sha256(teacher_key.encode())
  for line in lines:
    digest.update(line.encode() + b"\n")
  return digest.hexdigest()


def default_cache_dir() -> pathlib.Path:
  from aiayn_flax.data import public_data
  return public_data.cache_dir() / "silver"


def parse_lines(lines: Sequence[str], teacher: Teacher, cache_dir: pathlib.Path,
                workers: int = 0, progress: Callable[[int, int], None] | None = None,
                parsers: Callable[[], Parsers] | None = None,
                tokenized: bool = False) -> tuple[list[dict], int]:
  """(one record per line, in order; the number of chunks read from the cache). `workers`: 0
  for one per core. `parsers()`: the teacher's parsers when parsing in this process, called
  only when a chunk is not in the cache (default: built here; workers build their own).
  `tokenized`: the lines are treebank tokens already, split at spaces (the treebank's own
  sentences)."""
  global _PARSERS
  cache_dir.mkdir(parents=True, exist_ok=True)
  teacher_key = teacher.key() + ("tokenized" if tokenized else "")
  chunks = [(start, list(lines[start:start + CHUNK_LINES]), tokenized)
            for start in range(0, len(lines), CHUNK_LINES)]
  keys = [chunk_key(teacher_key, chunk_lines) for _, chunk_lines, _ in chunks]
  results: dict[int, list[dict]] = {}
  for index, key in enumerate(keys):
    path = cache_dir / f"{key}.json"
    if path.exists():
      cached = json.loads(path.read_text())
      first = chunks[index][0]
      results[index] = [dict(record, line=first + i) for i, record in enumerate(cached)]
  missing = [index for index in range(len(chunks)) if index not in results]
  cached_count = len(results)
  if missing:
    workers = workers or os.cpu_count() or 1
    todo = [chunks[index] for index in missing]
    if workers > 1 and len(todo) > 1:
      # Fresh processes (spawned, not forked: the caller may hold JAX's threads), each reading
      # the grammars once (seconds) and parsing chunks in turn.
      pool = multiprocessing.get_context("spawn").Pool(min(workers, len(todo)), _start_worker,
                                                       (teacher,))
      parsed = pool.imap(_parse_chunk, todo)
    else:
      _PARSERS = parsers() if parsers else Parsers(teacher)
      pool, parsed = None, map(_parse_chunk, todo)
    try:
      for done, (index, records) in enumerate(zip(missing, parsed), 1):
        path = cache_dir / f"{keys[index]}.json"
        temporary = path.with_suffix(f".tmp{os.getpid()}")
        temporary.write_text(json.dumps(records))
        temporary.replace(path)  # a chunk in the cache is a whole one
        results[index] = records
        if progress:
          progress(done, len(missing))
    except BaseException:
      if pool:
        pool.terminate()  # a worker's error, or an interrupt: the finished chunks are cached
      raise
    if pool:
      pool.close()
      pool.join()
  return [record for index in range(len(chunks)) for record in results[index]], cached_count


def read_silver(path: str) -> list[dict]:
  """The records of a .silver.jsonl file; an error names the file and line of a bad one."""
  records = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      try:
        record = json.loads(line)
        if not {"words", "tree", "by", "log_prob_per_word", "agreement"} <= set(record):
          raise ValueError(f"fields missing: {sorted(record)}")
      except ValueError as e:
        raise ValueError(f"{path}:{number}: not a silver-tree record ({e})") from e
      records.append(record)
  return records


def confident(records: Iterable[dict], min_log_prob_per_word: float | None = None,
              min_agreement: float | None = None) -> list[dict]:
  """The records with a tree whose confidences pass the thresholds (None: no threshold; a
  tree with no agreement, parsed by the back-off, fails an agreement threshold)."""
  kept = []
  for record in records:
    if record["tree"] is None:
      continue
    if min_log_prob_per_word is not None and record["log_prob_per_word"] < min_log_prob_per_word:
      continue
    if min_agreement is not None and (record["agreement"] is None
                                      or record["agreement"] < min_agreement):
      continue
    kept.append(record)
  return kept


def training_pairs(paths: Sequence[str], leaves: str, min_agreement: float | None = None,
                   min_log_prob_per_word: float | None = None) -> tuple[list[str], list[str]]:
  """(sentences, linearized trees) of the silver files' trees that pass the thresholds, in file
  order: the parsing task's "silver" split. Each tree is checked to be a tree over its words."""
  import nltk
  sources, targets = [], []
  for path in paths:
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{path}: no silver trees there; make them with python -m "
                              "aiayn_flax.parsing.silver --out_dir=DIR TEXT_FILES "
                              "(docs/PARSING.md), or set config.dataset.silver_files")
    for record in confident(read_silver(path), min_log_prob_per_word, min_agreement):
      tree = nltk.Tree.fromstring(record["tree"])
      if tree.label() == linearize.REPAIR_ROOT and len(tree) == 1:
        tree = tree[0]
      if tree.leaves() != record["words"]:
        raise ValueError(f"{path}: line {record['line']}'s tree is not over its words")
      sources.append(" ".join(record["words"]))
      targets.append(" ".join(linearize.linearize(tree, leaves)))
  return sources, targets


def file_digests(paths: Sequence[str]) -> list[list[str]]:
  """[path, sha256 of its content] of each file (the token cache's key: new trees, new ids)."""
  from aiayn_flax.runtime import host_agreement
  return [[path, host_agreement.file_digest(path) or "missing"] for path in paths]


def validation_confidence(teacher: Teacher, dataset, cache_dir: pathlib.Path, workers: int = 0,
                          parsers: Callable[[], Parsers] | None = None,
                          split: str = "validation") -> list[dict]:
  """The treebank's `split` parsed as silver text is (from its gold words), each record with
  "gold_f1", the tree's EVALB F1 against the gold tree (both with the gold tags, as the
  baselines are scored): what a confidence threshold is chosen on."""
  from aiayn_flax.parsing import sentences
  gold = sentences.split_trees(dataset, split)
  records, _ = parse_lines([" ".join(tree.leaves()) for tree in gold], teacher, cache_dir,
                           workers, parsers=parsers, tokenized=True)
  for record, tree in zip(records, gold):
    record["gold_f1"] = None
    if record["tree"] is not None:
      import nltk
      test = baselines.with_tags(nltk.Tree.fromstring(record["tree"]), tree.pos())
      score = evalb.score_sentence(linearize.evalb_line(tree), linearize.evalb_line(test))
      record["gold_f1"] = round(200.0 * score.matched / max(score.gold + score.test, 1), 2)
  return records


def threshold_table(records: Sequence[dict], field: str,
                    fractions: Sequence[float] = (1.0, 0.8, 0.6, 0.4, 0.2)) -> list[tuple]:
  """(threshold, trees kept, their mean gold F1) when keeping the given fractions of the
  trees with the highest `field` (log_prob_per_word or agreement)."""
  scored = sorted((r for r in records if r["tree"] is not None and r[field] is not None),
                  key=lambda r: r[field], reverse=True)
  rows = []
  for fraction in fractions:
    kept = scored[:max(1, round(fraction * len(scored)))]
    rows.append((kept[-1][field], len(kept), sum(r["gold_f1"] for r in kept) / len(kept)))
  return rows


def main(argv: list[str]) -> None:
  import argparse
  parser = argparse.ArgumentParser(
      prog="python -m aiayn_flax.parsing.silver",
      description="Parse plain English text (one sentence a line) into silver trees.")
  parser.add_argument("files", nargs="*", help="text files (.gz read as gzip)")
  parser.add_argument("--validation", action="store_true",
                      help="parse the treebank's validation split too, and print each "
                      "confidence's thresholds with the gold F1 of the trees they keep")
  parser.add_argument("--out_dir", required=True, help="where FILE.silver.jsonl goes")
  parser.add_argument("--cache_dir", default=None, help="default ~/.cache/aiayn_flax/silver")
  parser.add_argument("--workers", type=int, default=0, help="processes (0: one per core)")
  parser.add_argument("--max_words", type=int, default=Teacher.max_words,
                      help="longer sentences get no tree (CKY time grows as the cube)")
  parser.add_argument("--max_lines", type=int, default=0, help="first N lines of each file")
  parser.add_argument("--moses_bpe", action="store_true",
                      help="the files are Moses-escaped and BPE'd (@@ ): undo both first")
  parser.add_argument("--treebank_dir", default="",
                      help="the treebank the teacher is read from (config.dataset.treebank_dir)")
  args = parser.parse_args(argv)
  for path in args.files:
    if not os.path.isfile(path):
      parser.error(f"{path}: no such file")
  import ml_collections
  from aiayn_flax.parsing import sentences
  dataset = ml_collections.ConfigDict(dict(treebank_dir=args.treebank_dir, train_split="train"))
  teacher = Teacher(tuple(sentences.split_trees(dataset, "train")), max_words=args.max_words)
  cache_dir = pathlib.Path(args.cache_dir) if args.cache_dir else default_cache_dir()
  out_dir = pathlib.Path(args.out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  parsers = functools.cache(lambda: Parsers(teacher))  # built once, and only if needed
  if args.validation:
    start = time.time()
    records = validation_confidence(teacher, dataset, cache_dir, args.workers, parsers)
    target = out_dir / "treebank_validation.silver.jsonl"
    target.write_text("".join(json.dumps(record) + "\n" for record in records))
    print(f"{target}: {len(records)} trees, {time.time() - start:.0f} s; keeping the most "
          "confident (threshold, trees, mean gold F1 of the trees kept):")
    for field in ("log_prob_per_word", "agreement"):
      print(f"  {field}: " + "; ".join(f">= {t:g}: {n} trees, F1 {f1:.2f}"
                                       for t, n, f1 in threshold_table(records, field)))
  if not args.files and not args.validation:
    parser.error("name text files to parse (or --validation)")
  for path in args.files:
    lines = read_lines(path, args.moses_bpe)
    lines = lines[:args.max_lines or None]
    start = time.time()

    def progress(done, total, path=path, start=start):
      if done % 10 == 0 or done == total:
        print(f"{path}: {done}/{total} chunks parsed, {time.time() - start:.0f} s", flush=True)

    records, cached = parse_lines(lines, teacher, cache_dir, args.workers, progress, parsers)
    name = os.path.basename(path)
    name = name[:-3] if name.endswith(".gz") else name
    target = out_dir / f"{name}.silver.jsonl"
    target.write_text("".join(json.dumps(record) + "\n" for record in records))
    counts = {by: sum(r["by"] == by for r in records)
              for by in ("teacher", "back-off", "no parse", "too long", "empty")}
    print(f"{target}: {len(records)} lines, {counts}, {cached} of "
          f"{-(-len(records) // CHUNK_LINES)} chunks from the cache, {time.time() - start:.0f} s",
          flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
