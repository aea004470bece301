"""Public files fetched once into a cache folder, each checked against its SHA-256.

Every file comes from a public GitHub repository at a pinned commit (raw.githubusercontent.com),
and lands in the cache laid out as `../shared/data` lays out its copies (multi30k/, wmt14/,
ptb_sample/), so that a data folder and the cache are interchangeable (AIAYN_DATA_DIR):

- Multi30k task 1 raw files, from multi30k/dataset (the files the Multi30k builder downloads);
- newstest2013 and newstest2014 EN-DE as plain text, from Helsinki-NLP/OPUS-MT-testsets: the
  3003-line newstest2014 of sacreBLEU's `wmt14/full`, extracted from the WMT .sgm files;
- two published system outputs with known scores (tensorflow/nmt's test data; OPUS-MT's
  newstest2014 output), for checking BLEU;
- the first 1000 English sentences of Europarl v7 (Moses-tokenized, BPE'd), from
  EdinburghNLP/nematus's test data: with newstest2013/2014's English, the text that
  configs/parsing_silver.py's silver trees are parsed from;
- NLTK's Penn Treebank sample, treebank.zip of nltk/nltk_data (what nltk.download fetches);
- EVALB, the parsing scorer (its copy in nikitakit/self-attentive-parser, public domain), in
  evalb/, compiled there with the C compiler when it is first fetched.

The cache is $XDG_CACHE_HOME/aiayn_flax, else ~/.cache/aiayn_flax. AIAYN_DOWNLOAD_BASE_URL
replaces https://raw.githubusercontent.com in every URL (a mirror; the tests serve the files
from a local HTTP server this way). A file is written only after its SHA-256 matched, under a
temporary name renamed into place, so a file present in the cache is a checked one.

`python -m aiayn_flax.data.public_data GROUP...` fetches groups of them and prints the folder that
holds them: $AIAYN_DATA_DIR where that has them all, else the cache.
"""
import argparse
import dataclasses
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import uuid

import requests

GITHUB_RAW = "https://raw.githubusercontent.com"
BASE_URL_VARIABLE = "AIAYN_DOWNLOAD_BASE_URL"

_MULTI30K = "multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw"
_NEWSTEST = "Helsinki-NLP/OPUS-MT-testsets/ac0f19c0be3cb4e0d9450fcb2d7a9847c4bdd180/testsets/en-de"
_TFNMT = "tensorflow/nmt/0be864257a76c151eef20ea689755f08bc1faf4e/nmt/testdata"
_OPUSMT = ("Helsinki-NLP/OPUS-MT-leaderboard/7b5f113acf67873cccf2172206b8568cd781d180/"
           "models/OPUS-MT-models/en-de/opus-2020-02-26")
_TREEBANK = "nltk/nltk_data/9373d812d4b7f6f272c489e980c670bc26622895/packages/corpora"
_NEMATUS = "EdinburghNLP/nematus/49d050863bc9644b8c0a9d9ab6e54ccd30f927dd/test/data"
_EVALB = "nikitakit/self-attentive-parser/24435a156a64d7433829e9a500a81f46b7e58030/EVALB"


@dataclasses.dataclass(frozen=True)
class PublicFile:
  path: str  # where it goes under the cache (as ../shared/data has it)
  source: str  # owner/repository/commit/path: its place on raw.githubusercontent.com
  sha256: str

  @property
  def url(self) -> str:
    base = os.environ.get(BASE_URL_VARIABLE) or GITHUB_RAW
    return f"{base.rstrip('/')}/{self.source}"


def _multi30k(stem: str, lang: str, sha256: str) -> PublicFile:
  return PublicFile(f"multi30k/{stem}.{lang}.gz", f"{_MULTI30K}/{stem}.{lang}.gz", sha256)


MULTI30K = [
    _multi30k("train", "en", "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
    _multi30k("train", "de", "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
    _multi30k("val", "en", "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
    _multi30k("val", "de", "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
    _multi30k("test_2016_flickr", "en",
              "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
    _multi30k("test_2016_flickr", "de",
              "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"),
    _multi30k("test_2017_flickr", "en",
              "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074"),
    _multi30k("test_2017_flickr", "de",
              "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee"),
    _multi30k("test_2018_flickr", "en",
              "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d"),
    _multi30k("test_2018_flickr", "de",
              "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608"),
    _multi30k("test_2017_mscoco", "en",
              "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58"),
    _multi30k("test_2017_mscoco", "de",
              "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338"),
]

NEWSTEST = [
    PublicFile(f"wmt14/{name}", f"{_NEWSTEST}/{name}", sha256) for name, sha256 in [
        ("newstest2013.en", "ace268a1d9724ca76f6d8e5c720ffdc08f01bdce45630ed8b269dc7918e1c16e"),
        ("newstest2013.de", "d7ea35ab91ff3709e03ad9cb6bf5b4f2cc775cd2d72efd5254c4aec5e69663ca"),
        ("newstest2014.en", "7294bccf2879a97b3706b95c9595f1459617a8ee7130d5d8581c910e69736971"),
        ("newstest2014.de", "ae5d110486bc33d7175e9e28c7d0051eb3e5fcd2166dd93371089852c091a20e"),
    ]
]

SYSTEM_OUTPUTS = [
    *(PublicFile(f"wmt14/systems/tfnmt_newstest2013_deen/{name}", f"{_TFNMT}/{name}", sha256)
      for name, sha256 in [
          ("deen_output", "51edc4c58960b7374ab36a6a4f629597b34284d89c44a9f256f05833ea1799c2"),
          ("deen_ref_bpe", "0f8771e44ff2f08844f40810741543580e3b87dc18ff4df58bebb070c67c808b"),
          ("deen_ref_spm", "c37b5f30400686a8ee4cf3ce777c9031fddefdab22acdedeb234c211aaf9a753"),
      ]),
    PublicFile("wmt14/systems/opusmt_newstest2014_ende/newstest2014.eng-deu.output",
               f"{_OPUSMT}/newstest2014.eng-deu.output",
               "a2f121d78c0ade71dfb1cfcb3a8173c06af70df5ced7055f1498ed0dbff5a2ad"),
]

EUROPARL_SAMPLE_EN = PublicFile(
    "wmt14/train_sample_nematus_europarl/corpus.en", f"{_NEMATUS}/corpus.en",
    "84c2b603a35ad885b97dfd49be80665c122672350a7ad08102483e97ebbafdc5")

# The English text that configs/parsing_silver.py's silver trees come from (docs/PARSING.md).
SILVER_TEXT = [*(f for f in NEWSTEST if f.path.endswith(".en")), EUROPARL_SAMPLE_EN]

TREEBANK_SAMPLE = PublicFile("ptb_sample/treebank.zip", f"{_TREEBANK}/treebank.zip",
                             "9da92d76c3666cfb6cddeaed0f7e86b344cce0f0928a286d439e555f19c37399")

# What the tests read from a data folder (tests/conftest.py).
TEST_DATA = [*MULTI30K, *NEWSTEST, *SYSTEM_OUTPUTS, EUROPARL_SAMPLE_EN, TREEBANK_SAMPLE]

EVALB = [
    PublicFile(f"evalb/{name}", f"{_EVALB}/{name}", sha256) for name, sha256 in [
        ("evalb.c", "f820089825faf91fa9b717ee99991ee4b2790a5b7f3a28eaf783b0328a15f948"),
        ("COLLINS.prm", "33c35ea3c99a7ba29a060f9448163280297a03be4b5c53d388bdfaf5f5119ad7"),
        ("sample/sample.gld", "3b7231ccbf8941a034e544026227f4becdcb049c4e9924ce4f3ff184de8c30db"),
        ("sample/sample.tst", "c3ee3805b983dc93ee7838153bbde4d2cfb7822be2eacb02d010376729ce62d1"),
        ("sample/sample.prm", "5c53e7e1f6b3eaca4bfd1934b057b4c20cd7e544480c9ef930d2dbdaccd4bc69"),
    ]
]


def cache_dir() -> pathlib.Path:
  """$XDG_CACHE_HOME/aiayn_flax, else ~/.cache/aiayn_flax."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(root) / "aiayn_flax"


class DownloadError(FileNotFoundError):
  """A file that could not be fetched, or whose bytes are not the expected ones: one line."""


def fetch(file: PublicFile, folder: pathlib.Path | None = None) -> pathlib.Path:
  """The file's path under `folder` (the cache), downloaded and checked first if missing."""
  path = (folder or cache_dir()) / file.path
  if path.exists():
    return path
  url = file.url
  try:
    response = requests.get(url, timeout=60)
    response.raise_for_status()
  except requests.RequestException as e:
    reason = (f"HTTP {e.response.status_code}" if isinstance(e, requests.HTTPError)
              else type(e).__name__)
    raise DownloadError(f"could not download {file.path} from {url} ({reason})") from e
  digest = hashlib.sha256(response.content).hexdigest()
  if digest != file.sha256:
    raise DownloadError(f"{file.path} from {url} has sha256 {digest}, not the expected "
                        f"{file.sha256}; not saved")
  path.parent.mkdir(parents=True, exist_ok=True)
  temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
  temp.write_bytes(response.content)
  temp.replace(path)
  return path


def fetch_all(files, folder: pathlib.Path | None = None) -> pathlib.Path:
  """Fetches each missing file of `files` into `folder` (the cache); returns the folder."""
  folder = folder or cache_dir()
  for file in files:
    fetch(file, folder)
  return folder


def fetch_evalb(folder: pathlib.Path | None = None) -> pathlib.Path:
  """folder/evalb (the cache's), with EVALB's source, parameter files and sample, and the
  `evalb` program compiled from it by the C compiler (cc, else gcc)."""
  evalb_dir = fetch_all(EVALB, folder) / "evalb"
  program = evalb_dir / "evalb"
  if not program.exists():
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
      raise DownloadError(f"no C compiler (cc or gcc) to build EVALB from {evalb_dir}/evalb.c")
    temp = evalb_dir / f".evalb.{uuid.uuid4().hex}.tmp"
    build = subprocess.run([compiler, "-O2", "-w", "-o", str(temp), str(evalb_dir / "evalb.c")],
                           capture_output=True, text=True)
    if build.returncode:
      raise DownloadError(f"{compiler} could not build {evalb_dir}/evalb.c: "
                          f"{build.stderr.strip().splitlines()[-1:]}")
    temp.replace(program)
  return evalb_dir


GROUPS = {"test_data": TEST_DATA, "silver_text": SILVER_TEXT, "multi30k": MULTI30K}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
      prog="python -m aiayn_flax.data.public_data",
      description="Fetch groups of public files; print the folder that holds them.")
  parser.add_argument("groups", nargs="+", choices=sorted(GROUPS))
  files = [file for group in parser.parse_args(argv).groups for file in GROUPS[group]]
  data_dir = os.environ.get("AIAYN_DATA_DIR")
  if data_dir and all((pathlib.Path(data_dir) / file.path).is_file() for file in files):
    print(data_dir)
    return
  try:
    print(fetch_all(files))
  except DownloadError as e:
    sys.exit(f"python -m aiayn_flax.data.public_data: error: {e}")


if __name__ == "__main__":
  main()
