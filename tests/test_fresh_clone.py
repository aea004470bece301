"""A newcomer's first command: `make quickstart` in a fresh clone with nothing beside it.

The clone is of this repository's committed HEAD; the Makefile is the real one, pointed at the
venv running these tests (no install). The network is cut by a proxy on a closed loopback port,
which the download honours as any user's proxy setting, so no test hook is needed.
"""
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.fixture
def closed_loopback_port():
  """A loopback port that refuses connections for the whole test: bound by this socket, which
  never listens, so no other process can take it and start listening meanwhile."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]


@pytest.mark.slow
def test_quickstart_in_a_fresh_clone_offline_ends_with_one_line_that_says_what_to_do(
    tmp_path, closed_loopback_port):
  clone = tmp_path / "aiayn_flax"  # no ../shared/data beside it
  subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
  venv = pathlib.Path(sys.prefix)
  proxy = f"http://127.0.0.1:{closed_loopback_port}"
  env = {k: v for k, v in os.environ.items()
         if k != "AIAYN_DATA_DIR" and not k.lower().endswith("_proxy")
         and k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
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
