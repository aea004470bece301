"""Shared fixtures: the real data folder (AIAYN_DATA_DIR, set by .ci/run) and small configs."""
import os
import pathlib
import shutil
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# The tests run on the CPU. With the `aot` extra installed (libtpu, the CUDA plugin: make test
# installs it for the compiled dry run), jax would otherwise try to start a TPU and a GPU
# backend in every process, noisily, and the compiled dry run needs jax to start none of them
# before it asks for a GPU topology. Subprocesses inherit it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def data_dir() -> pathlib.Path:
  path = pathlib.Path(os.environ.get("AIAYN_DATA_DIR") or REPO.parent / "shared" / "data")
  if not (path / "multi30k").is_dir():
    raise RuntimeError(f"{path}: not the shared data folder (no multi30k/); set AIAYN_DATA_DIR")
  os.environ["AIAYN_DATA_DIR"] = str(path)  # the data sources read it too
  return path


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  return data_dir()


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
