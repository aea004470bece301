"""The public originals of the test data (aiayn_flax/data/public_data.py), fetched from a local HTTP
server that serves the shared data folder's files where the public hosts have them: each is
downloaded once into the cache, checked against its SHA-256, and a wrong one is refused."""
import hashlib
import os
import subprocess

import pytest

from aiayn_flax.data import public_data
from aiayn_flax.data import multi30k
import conftest
from conftest import public_mirror, run_script


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """An empty cache folder ($XDG_CACHE_HOME/aiayn_flax), and no proxy between the downloads
  and the loopback server (nor a ProxyError instead of the refused connection)."""
  for variable in [k for k in os.environ if k.lower().endswith("_proxy")]:
    monkeypatch.delenv(variable)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg_cache"))
  return tmp_path / "xdg_cache" / "aiayn_flax"


def sha256(path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_test_data_is_downloaded_once_into_the_cache_as_the_data_folder_lays_it_out(
    shared_data, evalb_dir, cache, tmp_path, monkeypatch):
  with public_mirror(shared_data, evalb_dir, tmp_path / "mirror") as (base_url, requested):
    monkeypatch.setenv(public_data.BASE_URL_VARIABLE, base_url)
    assert public_data.cache_dir() == cache
    assert public_data.fetch_all(public_data.TEST_DATA) == cache
    assert sorted(requested) == sorted(f.source for f in public_data.TEST_DATA)
    for file in public_data.TEST_DATA:  # the same bytes, at the same place as in the folder
      assert sha256(cache / file.path) == sha256(shared_data / file.path) == file.sha256
    public_data.fetch_all(public_data.TEST_DATA)  # a second session: all read from the cache
    assert len(requested) == len(public_data.TEST_DATA)
  assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.slow  # starts Python processes
def test_the_command_fetches_a_group_and_prints_the_folder_that_holds_it(
    shared_data, evalb_dir, cache, tmp_path, monkeypatch):
  monkeypatch.delenv("AIAYN_DATA_DIR", raising=False)
  with public_mirror(shared_data, evalb_dir, tmp_path / "mirror") as (base_url, requested):
    env = {"XDG_CACHE_HOME": str(cache.parent), public_data.BASE_URL_VARIABLE: base_url}
    fetched = run_script("-m", "aiayn_flax.data.public_data", "silver_text", env=env)
    assert fetched.stdout == f"{cache}\n", fetched.stderr
    assert sorted(requested) == sorted(f.source for f in public_data.SILVER_TEXT)
    # A data folder that has the group is named instead, and nothing is downloaded.
    named = run_script("-m", "aiayn_flax.data.public_data", "silver_text",
                       env={**env, "AIAYN_DATA_DIR": str(shared_data)})
    assert named.stdout == f"{shared_data}\n", named.stderr
    assert len(requested) == len(public_data.SILVER_TEXT)
  assert [f.path for f in public_data.SILVER_TEXT] == [
      "wmt14/newstest2013.en", "wmt14/newstest2014.en",
      "wmt14/train_sample_nematus_europarl/corpus.en"]  # what configs/parsing_silver.py names
  for file in public_data.SILVER_TEXT:
    assert sha256(cache / file.path) == sha256(shared_data / file.path) == file.sha256


@pytest.mark.slow  # starts a Python process
def test_the_command_stops_in_one_line_when_a_download_fails(cache, monkeypatch):
  monkeypatch.delenv("AIAYN_DATA_DIR", raising=False)
  result = run_script("-m", "aiayn_flax.data.public_data", "silver_text",
                      env={"XDG_CACHE_HOME": str(cache.parent),
                           public_data.BASE_URL_VARIABLE: "http://127.0.0.1:9"})
  assert result.returncode == 1 and result.stdout == ""
  first = public_data.SILVER_TEXT[0]
  assert result.stderr.strip().splitlines()[-1] == (
      f"python -m aiayn_flax.data.public_data: error: could not download {first.path} from "
      f"http://127.0.0.1:9/{first.source} (ConnectionError)")


def test_a_file_whose_sha256_is_not_the_expected_one_is_refused_naming_it(
    shared_data, evalb_dir, cache, tmp_path, monkeypatch):
  wrong = {"wmt14/newstest2014.de": b"Gutach: Noch mehr Sicherheit\n"}
  with public_mirror(shared_data, evalb_dir, tmp_path / "mirror", wrong) as (base_url, _):
    monkeypatch.setenv(public_data.BASE_URL_VARIABLE, base_url)
    with pytest.raises(public_data.DownloadError) as error:
      public_data.fetch_all(public_data.TEST_DATA)
  expected = next(f for f in public_data.TEST_DATA if f.path == "wmt14/newstest2014.de")
  assert str(error.value) == (
      f"wmt14/newstest2014.de from {base_url}/{expected.source} has sha256 "
      f"{hashlib.sha256(wrong['wmt14/newstest2014.de']).hexdigest()}, not the expected "
      f"{expected.sha256}; not saved")
  assert not (cache / "wmt14" / "newstest2014.de").exists()


@pytest.mark.slow  # compiles EVALB
def test_evalb_is_fetched_and_compiled_into_the_cache(shared_data, evalb_dir, cache, tmp_path,
                                                      monkeypatch):
  with public_mirror(shared_data, evalb_dir, tmp_path / "mirror") as (base_url, requested):
    monkeypatch.setenv(public_data.BASE_URL_VARIABLE, base_url)
    assert public_data.fetch_evalb() == cache / "evalb"
    public_data.fetch_evalb()
  assert sorted(requested) == sorted(f.source for f in public_data.EVALB)
  sample = cache / "evalb" / "sample"
  output = subprocess.run([str(cache / "evalb" / "evalb"), "-p", str(sample / "sample.prm"),
                           str(sample / "sample.gld"), str(sample / "sample.tst")],
                          capture_output=True, text=True, check=True).stdout
  # The figures of EVALB's README for its sample files.
  assert "Bracketing Recall         =  87.76" in output
  assert "Bracketing Precision      =  90.53" in output


def test_multi30k_downloads_from_the_mirror_that_the_base_url_names(monkeypatch):
  monkeypatch.delenv(public_data.BASE_URL_VARIABLE, raising=False)
  assert multi30k.split_urls("test2016")["de"] == (
      "https://raw.githubusercontent.com/multi30k/dataset/"
      "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/test_2016_flickr.de.gz")
  monkeypatch.setenv(public_data.BASE_URL_VARIABLE, "http://127.0.0.1:8123/")
  assert multi30k.split_urls("validation")["en"] == (
      "http://127.0.0.1:8123/multi30k/dataset/"
      "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/val.en.gz")


def test_without_data_the_session_stops_in_one_line_that_says_what_to_set(
    tmp_path, monkeypatch, cache):
  monkeypatch.delenv("AIAYN_DATA_DIR", raising=False)
  monkeypatch.setattr(conftest, "SHARED", tmp_path / "no_shared")
  with pytest.MonkeyPatch.context() as offline:  # a port nobody listens on
    offline.setenv(public_data.BASE_URL_VARIABLE, "http://127.0.0.1:9")
    with pytest.raises(pytest.UsageError) as error:
      conftest.prepare_data("not slow")
  first = public_data.MULTI30K[0]
  assert str(error.value) == (
      f"the tests need real data: could not download {first.path} from "
      f"http://127.0.0.1:9/{first.source} (ConnectionError); set AIAYN_DATA_DIR to a folder "
      "laid out like shared/data, or AIAYN_DOWNLOAD_BASE_URL to a mirror, or deselect those "
      "tests with -m 'not needs_data' (docs/TESTS.md)")
  conftest.prepare_data("not needs_data")  # nothing to fetch: no error
  assert "AIAYN_DATA_DIR" not in os.environ
