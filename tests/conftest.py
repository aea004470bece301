"""Shared fixtures and helpers: the real data folder (AIAYN_DATA_DIR, set by .ci/run), a toy run
trained once, and running the repository's scripts as a user does.

Markers (registered in pyproject.toml): a test that uses `toy_run` is marked `slow` here (it
trains) and one that uses `shared_data` is marked `needs_data`; tests that start a subprocess
or train otherwise carry `@pytest.mark.slow` themselves.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# What the tests read from the shared data folder (shared/data/README.md).
DATA_FOLDERS = ("multi30k", "wmt14")

# The tests run on the CPU. With the `aot` extra installed (libtpu, the CUDA plugin: make test
# installs it for the compiled dry run), jax would otherwise try to start a TPU and a GPU
# backend in every process, noisily, and the compiled dry run needs jax to start none of them
# before it asks for a GPU topology. Subprocesses inherit it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def data_dir() -> pathlib.Path:
  """The shared data folder; a test that needs it fails (never skips) when it is missing."""
  path = pathlib.Path(os.environ.get("AIAYN_DATA_DIR") or REPO.parent / "shared" / "data")
  missing = [f"{name}/" for name in DATA_FOLDERS if not (path / name).is_dir()]
  if missing:
    pytest.fail(f"{path}: not the shared data folder (no {', '.join(missing)}); set "
                "AIAYN_DATA_DIR to it, or deselect these tests with -m 'not needs_data'",
                pytrace=False)
  os.environ["AIAYN_DATA_DIR"] = str(path)  # the data sources read it too
  return path


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  return data_dir()


def run_script(*args, stdin: str | bytes | None = None, env: dict | None = None,
               cwd=REPO) -> subprocess.CompletedProcess:
  """`python ARGS...` run from the repository root as a user runs it, output captured: text,
  or bytes when `stdin` is bytes. `env` adds to this process's environment. The test's
  timeout (pytest-timeout) bounds it; the child is killed with the test."""
  return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, input=stdin,
                        capture_output=True, text=not isinstance(stdin, bytes),
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(items):
  for item in items:
    fixtures = getattr(item, "fixturenames", ())
    if "toy_run" in fixtures:
      item.add_marker(pytest.mark.slow)  # trains the toy model (once per worker)
    if "shared_data" in fixtures:
      item.add_marker(pytest.mark.needs_data)


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory):
  """A toy run trained once for the whole session: (config, workdir, final metrics)."""
  from aiayn_flax import trainer
  from configs import toy
  config = toy.get_config()
  workdir = str(tmp_path_factory.mktemp("toy_run"))
  summary = trainer.train_and_evaluate(config, workdir)
  return config, workdir, summary


_created_xla_cache = None


def pytest_configure():
  """One persistent XLA compilation cache for the session, shared by this process and the
  train.py / evaluate.py subprocesses the tests start (they inherit the environment): the same
  toy programs are compiled once instead of once per subprocess, which took the resume tests
  from 335 s to 189 s. The compiled programs are the same either way."""
  global _created_xla_cache
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _created_xla_cache = tempfile.mkdtemp(prefix="aiayn_flax_xla_cache_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _created_xla_cache
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_unconfigure():
  if _created_xla_cache:
    shutil.rmtree(_created_xla_cache, ignore_errors=True)
