"""Multi30k task 1 (EN-DE) as a tensorflow-datasets builder.

Reads the raw released files from `$AIAYN_DATA_DIR/multi30k/` when they are there (offline, as in
tests and CI), and downloads the same files from the multi30k/dataset repository otherwise.
Every line is kept and examples stay in file order, so test sets can be scored line by line.
"""
import os

from absl import logging
import requests
import tensorflow as tf
import tensorflow_datasets as tfds

from aiayn_flax.runtime import process_zero
from aiayn_flax.data import public_data
from aiayn_flax.data.text_files import read_parallel_lines

LANGUAGES = ("en", "de")

# tfds split name -> file stem in data/task1/raw of the multi30k/dataset repository.
SPLIT_STEMS = {
    "train": "train",  # 29000 lines
    "validation": "val",  # 1014
    "test2016": "test_2016_flickr",  # 1000
    "test2017": "test_2017_flickr",  # 1000
    "test2018": "test_2018_flickr",  # 1071
    "test2017_mscoco": "test_2017_mscoco",  # 461
}


_CITATION = """\
@inproceedings{elliott-etal-2016-multi30k,
  title = {Multi30K: Multilingual English-German Image Descriptions},
  author = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  year = {2016},
  pages = {70--74},
}"""


def split_names() -> list[str]:
  """The tfds split names of Multi30k task 1, in the order of SPLIT_STEMS."""
  return list(SPLIT_STEMS)


def _check_split(split: str) -> str:
  """The file stem of a split, or a ValueError listing the known splits."""
  if split not in SPLIT_STEMS:
    raise ValueError(f"unknown Multi30k split {split!r}; known splits: {', '.join(SPLIT_STEMS)}")
  return SPLIT_STEMS[split]


def local_split_paths(split: str) -> tuple[str, str] | None:
  """(en, de) paths under $AIAYN_DATA_DIR/multi30k/ if the split is there, else None."""
  stem = _check_split(split)
  data_dir = os.environ.get("AIAYN_DATA_DIR")
  if not data_dir:
    return None
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(
        f"AIAYN_DATA_DIR={data_dir}: no such folder; point it at a folder laid out like "
        "../shared/data (with multi30k/ inside), or unset it to download Multi30k")
  en_path, de_path = (os.path.join(data_dir, "multi30k", f"{stem}.{lang}.gz") for lang in LANGUAGES)
  # Only the EN file decides: a missing DE file then fails loudly instead of downloading.
  return (en_path, de_path) if os.path.exists(en_path) else None


def split_urls(split: str) -> dict[str, str]:
  """{language: url} of a split's gzipped raw files at the pinned upstream commit, the very
  bytes of our offline copy (public_data.MULTI30K; AIAYN_DOWNLOAD_BASE_URL names a mirror)."""
  stem = _check_split(split)
  files = {file.path: file for file in public_data.MULTI30K}
  return {lang: files[f"multi30k/{stem}.{lang}.gz"].url for lang in LANGUAGES}


def check_download_reachable(url: str, timeout_s: float = 20.0) -> None:
  """One request to `url`, or a FileNotFoundError in one line that says what to do.

  tfds' downloader retries a refused connection ten times with backoff (minutes); an offline
  user should hear at once where the data comes from and how to do without the network.
  """
  try:
    requests.head(url, timeout=timeout_s, allow_redirects=True).raise_for_status()
  except requests.RequestException as e:
    reason = type(e).__name__
    if isinstance(e, requests.HTTPError):
      reason = f"HTTP {e.response.status_code}"
    raise FileNotFoundError(
        f"could not download Multi30k from {url} ({reason}); offline, set AIAYN_DATA_DIR to a "
        "folder holding multi30k/ with the task 1 raw files (train.en.gz, train.de.gz, "
        "val.en.gz, ...)") from e


class Multi30k(tfds.core.GeneratorBasedBuilder):
  """Multi30k task 1: image descriptions in English with German translations."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Raw cased files of task 1, every line kept, in file order."}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="Multi30k task 1 EN-DE, raw untokenized text, one example per line.",
        features=tfds.features.FeaturesDict({lang: tfds.features.Text() for lang in LANGUAGES}),
        supervised_keys=LANGUAGES,
        # Keep file order: tfds would otherwise shuffle examples by key when writing.
        disable_shuffling=True,
        homepage="https://github.com/multi30k/dataset",
        citation=_CITATION,
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    if not all(local_split_paths(split) for split in SPLIT_STEMS):
      check_download_reachable(split_urls("train")["en"])
    return {
        split: self._generate_examples(*self._split_paths(split, dl_manager))
        for split in SPLIT_STEMS
    }

  def _split_paths(self, split: str, dl_manager: tfds.download.DownloadManager) -> tuple[str, str]:
    local = local_split_paths(split)
    if local:
      logging.info("Multi30k %s: reading local files %s", split, local)
      return local
    urls = split_urls(split)
    try:
      downloaded = dl_manager.download(urls)
    except Exception as e:  # noqa: BLE001 - offline, proxy, HTTP error: one line that says what to do
      raise FileNotFoundError(
          f"could not download Multi30k {split} from {urls['en']} ({type(e).__name__}); "
          "offline, set AIAYN_DATA_DIR to a folder holding multi30k/ with the task 1 raw files "
          "(train.en.gz, train.de.gz, val.en.gz, ...)") from e
    return tuple(os.fspath(downloaded[lang]) for lang in LANGUAGES)

  def _generate_examples(self, en_path: str, de_path: str):
    en_lines, de_lines = read_parallel_lines(en_path, de_path)
    for index, (en, de) in enumerate(zip(en_lines, de_lines)):
      yield index, {"en": en, "de": de}


def prepared_builder(data_dir: str | None = None) -> Multi30k:
  """The Multi30k builder with its data prepared in data_dir (tfds' default if None)."""
  process_zero.require_process_zero("Multi30k (tfds download and prepare)")
  builder = Multi30k(data_dir=data_dir)
  builder.download_and_prepare()
  return builder


def load_split(split: str, data_dir: str | None = None) -> tf.data.Dataset:
  """A split as {"en", "de"} string examples, in the original line order.

  Builds the dataset into data_dir on first use (tfds' default: $TFDS_DATA_DIR or
  ~/tensorflow_datasets).
  """
  _check_split(split)
  return prepared_builder(data_dir).as_dataset(split=split, shuffle_files=False)


def read_split_pairs(split: str, data_dir: str | None = None) -> tuple[list[str], list[str]]:
  """(English lines, German lines) of a split, aligned and in file order.

  Reads the local files when $AIAYN_DATA_DIR has them; otherwise reads the built dataset,
  which keeps the same order (see disable_shuffling above).
  """
  local = local_split_paths(split)
  if local:
    return read_parallel_lines(*local)
  en_lines, de_lines = [], []
  for example in tfds.as_numpy(load_split(split, data_dir)):
    en_lines.append(example["en"].decode("utf-8"))
    de_lines.append(example["de"].decode("utf-8"))
  return en_lines, de_lines
