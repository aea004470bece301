"""Penn Treebank trees for parsing: reading the bracketed `.mrg` files and the standard
preprocessing the parsing literature applies before EVALB.

Two sources, one split table each (`config.dataset.treebank_dir`):
- "" : NLTK's public sample of the treebank (`treebank.zip`, WSJ sections 00-01, 3,914 trees),
  read from `$AIAYN_DATA_DIR/ptb_sample/treebank.zip` or downloaded once from nltk_data at a
  pinned commit. Split by file: train wsj_0001-0159, validation wsj_0160-0179, test
  wsj_0180-0199 (3,396 / 273 / 245 trees).
- a folder: the LDC's Penn Treebank 3 (LDC99T42) `parsed/mrg/wsj` folder, with one subfolder
  per section (00 ... 24): the standard split, train 02-21, validation 22, test 23.

Files are read with nltk's BracketParseCorpusReader, which also drops the unlabelled root
bracket `( (S ...) )` that wraps each tree in the released files.
"""
import os
import re

import nltk
from nltk.corpus.reader import BracketParseCorpusReader
from nltk.data import ZipFilePathPointer

from aiayn_flax.data import public_data

# split -> inclusive range of file numbers (wsj_NNNN.mrg) of the sample.
SAMPLE_SPLITS = {"train": (1, 159), "validation": (160, 179), "test": (180, 199)}
# split -> WSJ sections of the full treebank (the parsing literature's standard split).
WSJ_SPLITS = {"train": tuple(range(2, 22)), "validation": (22,), "test": (23,)}

EMPTY_ELEMENT = "-NONE-"
UNLABELLED_ROOT = "TOP"  # the label given to a root bracket that came without one


def split_trees(dataset, split: str) -> list[nltk.Tree]:
  """The preprocessed trees of a split, in file order (nothing dropped)."""
  return [preprocess(tree) for tree in raw_split_trees(dataset, split)]


def raw_split_trees(dataset, split: str) -> list[nltk.Tree]:
  """The trees of a split as released (function tags, empty elements), in file order."""
  treebank_dir = dataset.get("treebank_dir", "")
  reader = _wsj_reader(treebank_dir) if treebank_dir else _sample_reader()
  fileids = _split_fileids(reader.fileids(), split, wsj=bool(treebank_dir))
  return [tree for fileid in fileids for tree in reader.parsed_sents(fileid)]


def preprocess(tree: nltk.Tree) -> nltk.Tree:
  """A copy of a released tree as EVALB's gold files have it: function tags and indices
  stripped from every label (NP-SBJ-1 -> NP, PP-LOC=2 -> PP, the first of alternatives
  ADVP|PRT -> ADVP), every -NONE- element removed together with the constituents it leaves
  empty, part-of-speech tags (-LRB-, -NONE- ...) left as they are. A root without a label
  (several trees under one unlabelled bracket) is labelled TOP."""
  cleaned = _without_empty_elements(tree)
  if cleaned is None:
    raise ValueError(f"a tree with no words outside -NONE- elements: {tree}")
  if cleaned.label() == "":
    cleaned.set_label(UNLABELLED_ROOT)
  return cleaned


def strip_function_tags(label: str) -> str:
  """NP-SBJ-1 -> NP, PP-LOC=2 -> PP, ADVP|PRT -> ADVP; labels that start with '-' (-NONE-,
  -LRB-) are part-of-speech tags and stay whole."""
  if label.startswith("-"):
    return label
  return re.split(r"[-=|]", label, maxsplit=1)[0]


def _without_empty_elements(tree):
  """The tree without -NONE- preterminals and the constituents left empty, labels stripped;
  None when nothing is left."""
  if _is_preterminal(tree):
    return None if tree.label() == EMPTY_ELEMENT else nltk.Tree(tree.label(), list(tree))
  children = [child for child in (_without_empty_elements(c) for c in tree) if child is not None]
  if not children:
    return None
  return nltk.Tree(strip_function_tags(tree.label()), children)


def _is_preterminal(tree) -> bool:
  return len(tree) == 1 and isinstance(tree[0], str)


def _split_fileids(fileids: list[str], split: str, wsj: bool) -> list[str]:
  table = WSJ_SPLITS if wsj else SAMPLE_SPLITS
  if split not in table:
    raise ValueError(f"config.dataset: the treebank has splits {sorted(table)}, not {split!r}")
  if wsj:
    chosen = [f for f in fileids if int(f.split("/")[0]) in table[split]]
  else:
    first, last = table[split]
    chosen = [f for f in fileids if first <= int(re.search(r"(\d+)", f).group(1)) <= last]
  if not chosen:
    raise ValueError(f"the treebank has no files for split {split!r} ({table[split]})")
  return sorted(chosen)


def _allow_nltk_to_read(folder: str) -> None:
  """nltk (3.10+) opens files only under its data paths: add the folder we read from."""
  folder = os.path.abspath(folder)
  if folder not in nltk.data.path:
    nltk.data.path.append(folder)


def _wsj_reader(treebank_dir: str) -> BracketParseCorpusReader:
  if not os.path.isdir(treebank_dir):
    raise FileNotFoundError(
        f"config.dataset.treebank_dir={treebank_dir}: no such folder; point it at the LDC "
        "treebank's parsed/mrg/wsj folder (subfolders 00 ... 24 of .mrg files)")
  _allow_nltk_to_read(treebank_dir)
  return BracketParseCorpusReader(treebank_dir, r"\d\d/wsj_\d{4}\.mrg")


def _sample_reader() -> BracketParseCorpusReader:
  zip_path = sample_zip_path()
  _allow_nltk_to_read(os.path.dirname(zip_path))
  return BracketParseCorpusReader(ZipFilePathPointer(zip_path, "treebank/combined/"),
                                  r"wsj_\d{4}\.mrg")


def sample_zip_path() -> str:
  """treebank.zip: `$AIAYN_DATA_DIR/ptb_sample/treebank.zip` when that folder is set and holds
  it; otherwise nltk_data's, fetched once into the cache (public_data.TREEBANK_SAMPLE)."""
  data_dir = os.environ.get("AIAYN_DATA_DIR")
  if data_dir:
    local = os.path.join(data_dir, "ptb_sample", "treebank.zip")
    if os.path.exists(local):
      return local
  try:
    return str(public_data.fetch(public_data.TREEBANK_SAMPLE))
  except public_data.DownloadError as e:
    raise FileNotFoundError(f"{e}; offline, set AIAYN_DATA_DIR to a folder holding "
                            "ptb_sample/treebank.zip") from e
