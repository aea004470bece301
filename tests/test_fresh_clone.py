"""A newcomer's two commands, `make quickstart` and `make test`, in a fresh clone with nothing
beside it.

The clone is of this repository's committed HEAD; the Makefile is the real one, pointed at the
venv running these tests (no install). The network is cut by a proxy on a closed loopback port,
which the download honours as any user's proxy setting, so no test hook is needed; the public
hosts of the test data are stood in for by a local HTTP server (AIAYN_DOWNLOAD_BASE_URL).
"""
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from conftest import REPO, public_mirror


@pytest.fixture
def closed_loopback_port():
  """A loopback port that refuses connections for the whole test: bound by this socket, which
  never listens, so no other process can take it and start listening meanwhile."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]


def fresh_clone(tmp_path) -> tuple[pathlib.Path, dict]:
  """(clone, environment): a clone of HEAD with no ../shared beside it, and this process's
  environment without the data folder, a download mirror or cache, proxies, make's or pytest's
  own variables."""
  clone = tmp_path / "aiayn_flax"
  subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
  env = {k: v for k, v in os.environ.items()
         if k not in ("AIAYN_DATA_DIR", "AIAYN_DOWNLOAD_BASE_URL", "XDG_CACHE_HOME")
         and not k.lower().endswith("_proxy")
         and k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL") and not k.startswith("PYTEST_")}
  return clone, env


# A few needs-data tests that read every kind of file fetched (Multi30k, newstest2014, the
# system outputs, the treebank sample, EVALB), in seconds.
DATA_TESTS = ("tests/test_scoring.py::"
              "test_multi30k_tokenization_reproduces_the_published_tokenized_files "
              "tests/test_scoring.py::test_tokenized_bleu_matches_tensorflow_nmt_on_bpe_reference "
              "tests/test_scoring.py::test_opusmt_sacrebleu_matches_its_published_score "
              "tests/test_evalb.py")


@pytest.mark.slow
def test_make_test_in_a_fresh_clone_downloads_the_data_once_and_offline_stops_in_one_line(
    tmp_path, shared_data, evalb_dir):
  from aiayn_flax.data import public_data
  clone, env = fresh_clone(tmp_path)
  venv = pathlib.Path(sys.prefix)
  env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
  cache = tmp_path / "cache" / "aiayn_flax"

  def make_test_fast():
    result = subprocess.run(
        ["make", "test-fast", f"VENV={venv}", "-o", f"{venv}/installed-test", "TEST_WORKERS=2",
         f"TESTS={DATA_TESTS}"], cwd=clone, env=env, capture_output=True, text=True,
        timeout=600)
    header = [line for line in result.stdout.splitlines() if line.startswith("data: ")]
    return result, header

  files = [*public_data.TEST_DATA, *public_data.EVALB]
  with public_mirror(shared_data, evalb_dir, tmp_path / "mirror") as (base_url, requested):
    env[public_data.BASE_URL_VARIABLE] = base_url
    first, first_header = make_test_fast()
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert sorted(requested) == sorted(f.source for f in files)  # each once
    assert first_header == [f"data: {cache} (downloaded {len(files)} of {len(files)} files "
                            f"from {base_url}/)"]
    second, second_header = make_test_fast()
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert len(requested) == len(files)  # nothing fetched again
    assert second_header == [f"data: {cache} (cached, {len(files)} files)"]
  print(first_header[0], first.stdout.splitlines()[-1], sep="\n")
  print(second_header[0], second.stdout.splitlines()[-1], sep="\n")

  # Offline, with an empty cache: one line that says what to set, and no test run.
  env[public_data.BASE_URL_VARIABLE] = "http://127.0.0.1:9"  # nothing listens on port 9
  env["XDG_CACHE_HOME"] = str(tmp_path / "empty_cache")
  offline, _ = make_test_fast()
  assert offline.returncode == 2, offline.stderr[-3000:]  # make's status: pytest said 4
  ours = [line for line in offline.stderr.splitlines()
          if line and not line.startswith("make: ***")]
  print(*ours, sep="\n")
  assert len(ours) == 1 and ours[0].startswith(
      "ERROR: the tests need real data: could not download multi30k/train.en.gz from "
      "http://127.0.0.1:9/multi30k/dataset/"), offline.stderr[-3000:]
  assert ours[0].endswith("(ConnectionError); set AIAYN_DATA_DIR to a folder laid out like "
                          "shared/data, or AIAYN_DOWNLOAD_BASE_URL to a mirror, or deselect "
                          "those tests with -m 'not needs_data' (docs/TESTS.md)")
  assert "passed" not in offline.stdout


@pytest.mark.slow
def test_quickstart_in_a_fresh_clone_offline_ends_with_one_line_that_says_what_to_do(
    tmp_path, closed_loopback_port):
  clone, env = fresh_clone(tmp_path)
  venv = pathlib.Path(sys.prefix)
  proxy = f"http://127.0.0.1:{closed_loopback_port}"
  env.update(https_proxy=proxy, HTTPS_PROXY=proxy, http_proxy=proxy, HTTP_PROXY=proxy,
             TFDS_DATA_DIR=str(tmp_path / "tensorflow_datasets"))  # no dataset prepared before
  # -o: take the venv as installed for the CPU (a fresh clone's files are newer than its stamp).
  result = subprocess.run(
      ["make", "quickstart", f"VENV={venv}", "ACCELERATOR=cpu", "-o",
       f"{venv}/installed-run-cpu"], cwd=clone, env=env,
      capture_output=True, text=True, timeout=300)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2, result.stderr[-3000:]  # make's status when a recipe fails
  assert lines[-1].startswith("make: *** [Makefile:") and lines[-1].endswith("] Error 1"), lines
  assert lines[-2] == (
      "train.py: error: could not download Multi30k from https://raw.githubusercontent.com/"
      "multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/train.en.gz "
      "(ProxyError); offline, set AIAYN_DATA_DIR to a folder holding multi30k/ with the task 1 "
      "raw files (train.en.gz, train.de.gz, val.en.gz, ...)"), result.stderr[-3000:]
  # It stopped at training: the two evaluations never ran.
  assert "evaluate.py" not in result.stdout, result.stdout
