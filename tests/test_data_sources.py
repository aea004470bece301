"""The tfds builders for Multi30k and for plain parallel text files, on the real shared data."""
import gzip
import os
import pathlib

from etils import epath
import pytest
import tensorflow_datasets as tfds

from aiayn_flax.data import multi30k
from aiayn_flax.data import parallel_text
from aiayn_flax.data.text_files import read_lines, read_parallel_lines

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA_DIR = os.environ.get("AIAYN_DATA_DIR") or str(REPO_ROOT.parent / "shared" / "data")
MULTI30K_DIR = os.path.join(DATA_DIR, "multi30k")
WMT14_DIR = os.path.join(DATA_DIR, "wmt14")

MULTI30K_SIZES = {
    "train": 29000, "validation": 1014, "test2016": 1000, "test2017": 1000, "test2018": 1071,
    "test2017_mscoco": 461,
}


@pytest.fixture(scope="module", autouse=True)
def local_data_dir(shared_data):
  """The builders read AIAYN_DATA_DIR; set it even when the fallback path was used (and fail,
  never skip, without the data folder)."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("AIAYN_DATA_DIR", DATA_DIR)
    yield DATA_DIR


@pytest.fixture(scope="module")
def multi30k_data_dir(tmp_path_factory) -> str:
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  multi30k.prepared_builder(data_dir)
  return data_dir


def as_pairs(dataset, source_lang: str, target_lang: str) -> tuple[list[str], list[str]]:
  sources, targets = [], []
  for example in tfds.as_numpy(dataset):
    sources.append(example[source_lang].decode("utf-8"))
    targets.append(example[target_lang].decode("utf-8"))
  return sources, targets


def multi30k_files(split: str) -> tuple[str, str]:
  stem = multi30k.SPLIT_STEMS[split]
  return (os.path.join(MULTI30K_DIR, f"{stem}.en.gz"), os.path.join(MULTI30K_DIR, f"{stem}.de.gz"))


def test_multi30k_split_sizes_match_the_release(multi30k_data_dir):
  builder = multi30k.Multi30k(data_dir=multi30k_data_dir)
  sizes = {name: split.num_examples for name, split in builder.info.splits.items()}
  assert sizes == MULTI30K_SIZES
  assert multi30k.split_names() == list(MULTI30K_SIZES)
  assert builder.info.supervised_keys == ("en", "de")


def test_multi30k_first_train_example_is_first_line_of_the_files(multi30k_data_dir):
  example = next(iter(tfds.as_numpy(multi30k.load_split("train", multi30k_data_dir))))
  en_path, de_path = multi30k_files("train")
  assert example["en"].decode("utf-8") == read_lines(en_path)[0]
  assert example["de"].decode("utf-8") == read_lines(de_path)[0]


def test_multi30k_test2016_keeps_every_line_in_file_order(multi30k_data_dir):
  expected = read_parallel_lines(*multi30k_files("test2016"))
  assert as_pairs(multi30k.load_split("test2016", multi30k_data_dir), "en", "de") == expected
  assert multi30k.read_split_pairs("test2016") == expected


def test_multi30k_unknown_split_names_the_known_ones():
  with pytest.raises(ValueError, match="test2016") as error:
    multi30k.load_split("test2015")
  assert "test2015" in str(error.value) and "test2017_mscoco" in str(error.value)


def test_multi30k_downloads_pinned_files_without_a_local_copy(tmp_path, monkeypatch):
  """Without local files the builder asks tfds for the upstream URLs (served here from disk)."""
  requested = []

  def serve_from_shared_data(self, urls):
    del self
    requested.extend(urls.values())
    return {lang: epath.Path(MULTI30K_DIR) / url.rsplit("/", 1)[1] for lang, url in urls.items()}

  monkeypatch.delenv("AIAYN_DOWNLOAD_BASE_URL", raising=False)  # no mirror: the public URLs
  (tmp_path / "no_multi30k").mkdir()  # a data folder without multi30k/ (e.g. only wmt14/)
  monkeypatch.setenv("AIAYN_DATA_DIR", str(tmp_path / "no_multi30k"))
  monkeypatch.setattr(tfds.download.DownloadManager, "download", serve_from_shared_data)
  monkeypatch.setattr(multi30k, "check_download_reachable", lambda url: None)  # no network here
  builder = multi30k.prepared_builder(str(tmp_path / "tfds"))
  assert len(requested) == 2 * len(MULTI30K_SIZES)
  assert multi30k.split_urls("test2016")["de"] in requested
  assert all(url.startswith("https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56")
             for url in requested)
  assert {name: s.num_examples for name, s in builder.info.splits.items()} == MULTI30K_SIZES


@pytest.fixture(scope="module")
def newstest_files() -> dict[str, tuple[str, str]]:
  return {
      split: (os.path.join(WMT14_DIR, f"{name}.en"), os.path.join(WMT14_DIR, f"{name}.de"))
      for split, name in [("train", "newstest2013"), ("test", "newstest2014")]
  }


@pytest.fixture(scope="module")
def newstest_builder(tmp_path_factory, newstest_files):
  data_dir = str(tmp_path_factory.mktemp("tfds_parallel"))
  return parallel_text.parallel_text_builder("newstest", "en", "de", newstest_files, data_dir)


def test_parallel_text_splits_hold_every_line_in_order(newstest_builder, newstest_files):
  sizes = {name: split.num_examples for name, split in newstest_builder.info.splits.items()}
  assert sizes == {"train": 3000, "test": 3003}
  for split, files in newstest_files.items():
    dataset = newstest_builder.as_dataset(split=split, shuffle_files=False)
    assert as_pairs(dataset, "en", "de") == read_parallel_lines(*files)


def test_parallel_text_refuses_data_prepared_from_other_files(newstest_builder, newstest_files):
  other_files = {"train": newstest_files["test"]}
  with pytest.raises(ValueError, match="prepared from other files"):
    parallel_text.parallel_text_builder(
        "newstest", "en", "de", other_files, os.fspath(newstest_builder.data_dir_root))


def test_parallel_text_mismatched_files_name_both_files_and_counts(tmp_path):
  source = os.path.join(WMT14_DIR, "newstest2013.en")
  target = os.path.join(WMT14_DIR, "newstest2014.de")
  with pytest.raises(ValueError) as error:
    parallel_text.parallel_text_builder("mismatch", "en", "de", {"train": (source, target)},
                                        str(tmp_path))
  message = str(error.value)
  assert source in message and target in message
  assert "3000" in message and "3003" in message


def test_parallel_text_invalid_utf8_names_file_and_line(tmp_path):
  source, target = tmp_path / "bad.en", tmp_path / "good.de"
  source.write_bytes(b"ok\n\xff\xfe\n")
  target.write_bytes(b"gut\nauch gut\n")
  with pytest.raises(ValueError, match=f"{source}:2"):
    parallel_text.parallel_text_builder(
        "bad_utf8", "en", "de", {"train": (str(source), str(target))}, str(tmp_path / "tfds"))


def test_parallel_text_needs_two_languages(tmp_path):
  with pytest.raises(ValueError, match="both 'en'"):
    parallel_text.parallel_text_builder("same", "en", "en", {"train": ("a", "b")}, str(tmp_path))


def test_a_truncated_gz_training_file_stops_in_one_line_naming_it(tmp_path):
  whole = gzip.compress("".join(f"line {i}\n" for i in range(2000)).encode())
  source, target = tmp_path / "train.en.gz", tmp_path / "train.de"
  source.write_bytes(whole[:len(whole) // 2])  # a copy that stopped half-way
  target.write_text("".join(f"Zeile {i}\n" for i in range(2000)), "utf-8")
  with pytest.raises(ValueError) as error:
    read_parallel_lines(str(source), str(target))
  assert str(error.value) == (f"{source}: truncated gzip file (it ends before its compressed "
                              "data does); copy or download it again")
