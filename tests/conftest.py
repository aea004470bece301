"""Shared fixtures and helpers: the real data folder, a toy run trained once, and running the
repository's scripts as a user does.

The data folder is AIAYN_DATA_DIR when set (.ci/run sets it), else ../shared/data beside the
clone when it is there, else the public originals fetched once into the cache
(aiayn_flax/data/public_data.py: ~/.cache/aiayn_flax) before any test runs. When none of them can be
had, the session stops at once with one line saying what to set. The reference EVALB is
../shared/tools/evalb when there, else the cache's, compiled there.

Markers (registered in pyproject.toml): a test that uses `toy_run` is marked `slow` here (it
trains) and one that uses `shared_data` or `evalb_dir` is marked `needs_data`; tests that start
a Python process or train otherwise carry `@pytest.mark.slow` themselves (quick tools started
from a test do not count: `make -n`, `sleep`, the EVALB binary, a shell script with a stand-in).
"""
import contextlib
import fcntl
import http.server
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading

import pytest

from aiayn_flax.runtime import garbage_collection

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
# One layer a side for the toy runs whose behaviour does not depend on depth (resuming, storage,
# the lease, several hosts, the fit, the programs a dry run compiles for a target): half the
# arrays to trace, compile, sum across hosts and save. A warm 20-step toy train.py took 2.7 s
# of CPU with it against 3.6 s with the toy's two (docs/lab_notes/TESTS.md). The toy run and
# the tests that must learn keep two.
TOY_ONE_LAYER = "--config.model.num_layers=1"
# What the tests read from the shared data folder (shared/data/README.md).
DATA_FOLDERS = ("multi30k", "wmt14")

# The tests run on the CPU. With the `aot` extra installed (libtpu, the CUDA plugin: make test
# installs it for the compiled dry run), jax would otherwise try to start a TPU and a GPU
# backend in every process, noisily, and the compiled dry run needs jax to start none of them
# before it asks for a GPU topology. Subprocesses inherit it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# TPU programs compiled deviceless (the dry run's plans) with libtpu's least effort on their run
# time: what the tests read from them (which programs, their shapes, their collectives, FLOPs
# within 0.1%, the dry run's choices among the memory it reports) comes out the same in half
# the CPU (docs/PLANNING.md's dry run for a v5e-8: 84.3 -> 40.4 s); the temporaries grow. The
# CPU and GPU compilers ignore it (a toy run's parameters bit for bit, a GPU plan's figures
# unchanged). The test of libtpu's own memory verdict compiles at the default (test_dry_run: a
# run that cannot fit, on tpu-v5e-1).
os.environ.setdefault("JAX_EXEC_TIME_OPTIMIZATION_EFFORT", "-1")

# As the entry points do, before the tests import JAX: the two pytest workers of a whole run
# collected garbage for 54.6 s of CPU at CPython's threshold, 28.5 s at this one
# (docs/lab_notes/TESTS.md, "2026-11-30, late night").
garbage_collection.collect_less_often()


def data_dir() -> pathlib.Path:
  """The shared data folder; a test that needs it fails (never skips) when it is missing."""
  path = pathlib.Path(os.environ.get("AIAYN_DATA_DIR") or SHARED / "data")
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


@pytest.fixture(scope="session")
def evalb_dir() -> pathlib.Path:
  """EVALB's folder: evalb.c, COLLINS.prm, sample/ (and the compiled `evalb` in the cache's)."""
  if (SHARED / "tools" / "evalb").is_dir():
    return SHARED / "tools" / "evalb"
  from aiayn_flax.data import public_data
  return public_data.fetch_evalb()  # fetched by pytest_configure already; compiled there


_data_source = "data: not needed (-m 'not needs_data')"


def prepare_data(markexpr: str) -> None:
  """Sets AIAYN_DATA_DIR for this process and the pytest workers and subprocesses it starts:
  as set, else ../shared/data, else the cache, where the public originals are fetched once
  (with EVALB) unless the run deselects the tests that read them. Stops the session in one
  line when they cannot be fetched. The session's first line says which folder it is."""
  global _data_source
  if os.environ.get("AIAYN_DATA_DIR"):
    _data_source = f"data: {os.environ['AIAYN_DATA_DIR']} (AIAYN_DATA_DIR)"
    return
  if "not needs_data" in markexpr:
    return
  if (SHARED / "data").is_dir():
    os.environ["AIAYN_DATA_DIR"] = str(SHARED / "data")
    _data_source = f"data: {SHARED / 'data'} (beside the clone)"
    return
  from aiayn_flax.data import public_data
  folder = public_data.cache_dir()
  files = [*public_data.TEST_DATA,
           *(public_data.EVALB if not (SHARED / "tools" / "evalb").is_dir() else [])]
  missing = [f for f in files if not (folder / f.path).exists()]
  try:
    public_data.fetch_all(public_data.TEST_DATA, folder)
    if not (SHARED / "tools" / "evalb").is_dir():
      public_data.fetch_evalb(folder)
  except public_data.DownloadError as e:
    raise pytest.UsageError(
        f"the tests need real data: {e}; set AIAYN_DATA_DIR to a folder laid out like "
        f"shared/data, or {public_data.BASE_URL_VARIABLE} to a mirror, or deselect those tests "
        "with -m 'not needs_data' (docs/TESTS.md)") from None
  os.environ["AIAYN_DATA_DIR"] = str(folder)
  source = missing[0].url.rsplit(missing[0].source, 1)[0] if missing else ""
  _data_source = (f"data: {folder} (downloaded {len(missing)} of {len(files)} files from "
                  f"{source})" if missing else f"data: {folder} (cached, {len(files)} files)")


def pytest_sessionstart(session):
  """Says which data folder the session reads, even under -q (the header is not shown)."""
  reporter = session.config.pluginmanager.get_plugin("terminalreporter")
  if reporter and not hasattr(session.config, "workerinput"):
    reporter.write_line(_data_source)


@contextlib.contextmanager
def public_mirror(data: pathlib.Path, evalb: pathlib.Path, root: pathlib.Path, replaced=None):
  """An HTTP server on a loopback port chosen by the OS that stands in for the public hosts:
  each public file (aiayn_flax/data/public_data.py) at its path on raw.githubusercontent.com, its
  bytes those of the data folder's copy (`data`; `evalb` for EVALB), or `replaced[path]`.
  Yields (base URL for AIAYN_DOWNLOAD_BASE_URL, the list of paths requested, growing)."""
  from aiayn_flax.data import public_data
  for file in [*public_data.TEST_DATA, *public_data.EVALB]:
    served = root / file.source
    served.parent.mkdir(parents=True, exist_ok=True)
    if replaced and file.path in replaced:
      served.write_bytes(replaced[file.path])
    elif file.path.startswith("evalb/"):
      served.symlink_to(evalb / file.path.removeprefix("evalb/"))
    else:
      served.symlink_to(data / file.path)
  requested = []

  class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, directory=str(root), **kwargs)

    def do_GET(self):  # noqa: N802 - http.server's name
      requested.append(self.path.lstrip("/"))
      super().do_GET()

    def log_message(self, *args):
      pass

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}", requested
  finally:
    server.shutdown()
    server.server_close()
    thread.join()


def run_script(*args, stdin: str | bytes | None = None, env: dict | None = None,
               cwd=REPO) -> subprocess.CompletedProcess:
  """`python ARGS...` run from the repository root as a user runs it, output captured: text,
  or bytes when `stdin` is bytes. `env` adds to this process's environment. The test's
  timeout (pytest-timeout) bounds it; the child is killed with the test."""
  return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, input=stdin,
                        capture_output=True, text=not isinstance(stdin, bytes),
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})


def truncate_array_files(workdir, step: int, under: str = "") -> None:
  """Cuts every data file of a finished checkpoint's train state (or of its folder `under`) to
  half its size.

  Every file, not only the largest: which arrays share a file varies from run to run, and the
  parameters alone (all that evaluation reads) must be unreadable too.
  """
  from aiayn_flax.runtime import checkpoints
  state = os.path.join(checkpoints.checkpoint_dir(workdir), str(step), "state", under)
  data_files = [os.path.join(root, name) for root, _, names in os.walk(state)
                if os.path.basename(root) == "d" for name in names]
  assert data_files, f"no array data files under {state}"
  for path in data_files:
    os.truncate(path, os.path.getsize(path) // 2)


# Seconds each test file took in the run of record (docs/TESTS.md), which
# `pytest tests --record-file-durations` rewrites. The files run longest first: with
# `--dist loadfile --no-loadscope-reorder` (make test) the workers take them in that order, so
# a long file does not start last and leave the other worker idle at the end.
FILE_DURATIONS = pathlib.Path(__file__).with_name("file_durations.json")


def pytest_addoption(parser):
  parser.addoption("--record-file-durations", action="store_true",
                   help=f"write each test file's seconds to {FILE_DURATIONS.name}")


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(items):
  for item in items:
    fixtures = getattr(item, "fixturenames", ())
    if "toy_run" in fixtures:
      item.add_marker(pytest.mark.slow)  # trains the toy model (once per worker)
    if "shared_data" in fixtures or "evalb_dir" in fixtures:
      item.add_marker(pytest.mark.needs_data)
  seconds = json.loads(FILE_DURATIONS.read_text()) if FILE_DURATIONS.exists() else {}
  new_file = max(seconds.values(), default=0)  # a file not yet timed: as if the longest
  items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], new_file))  # stable


_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
  """Sums each file's setup, call and teardown seconds (in the process that reports: under
  xdist the controller receives every worker's reports)."""
  file = report.nodeid.split("::")[0]
  _file_seconds[file] = _file_seconds.get(file, 0.0) + report.duration


def pytest_sessionfinish(session):
  if (session.config.getoption("--record-file-durations")
      and not hasattr(session.config, "workerinput")):
    FILE_DURATIONS.write_text(json.dumps(
        {file: round(t) for file, t in sorted(_file_seconds.items())}, indent=1) + "\n")


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory):
  """A toy run trained once for the whole test run: (config, workdir, final metrics). Under
  pytest-xdist the first worker to ask trains it, holding a lock in the folder the workers
  share, and the others read its workdir and metrics: the tests only read that workdir."""
  from aiayn_flax.training import trainer
  from configs import toy
  config = toy.get_config()
  if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: its own temporary folder
    workdir = str(tmp_path_factory.mktemp("toy_run"))
    return config, workdir, trainer.train_and_evaluate(config, workdir)
  shared = tmp_path_factory.getbasetemp().parent  # this run's, above each worker's own
  workdir, metrics = shared / "toy_run", shared / "toy_run.json"
  with open(shared / "toy_run.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not metrics.exists():
      summary = trainer.train_and_evaluate(config, str(workdir))
      metrics.write_text(json.dumps(summary, default=float))
  return config, str(workdir), json.loads(metrics.read_text())


_created_xla_cache = None


def pytest_configure(config):
  """The data folder (prepare_data), once, before the xdist workers start. Then one persistent
  XLA compilation cache for the session, shared by this process and the xdist workers and the
  train.py / evaluate.py subprocesses the tests start (they inherit the environment): the same
  toy programs are compiled once instead of once per subprocess, which took the resume tests
  from 335 s to 189 s. The compiled programs are the same either way."""
  global _created_xla_cache
  if not hasattr(config, "workerinput"):  # not in a pytest-xdist worker
    prepare_data(config.option.markexpr or "")
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _created_xla_cache = tempfile.mkdtemp(prefix="aiayn_flax_xla_cache_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _created_xla_cache
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_unconfigure():
  if _created_xla_cache:
    shutil.rmtree(_created_xla_cache, ignore_errors=True)
