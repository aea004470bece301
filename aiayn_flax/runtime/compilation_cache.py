"""JAX's persistent compilation cache, on by default: a restarted run (a preempted spot VM, a
resumed training, evaluate.py after train.py) loads the programs an earlier start compiled
instead of compiling them again (base and big have 13 training buckets, plus evaluation and
decoding shapes).

Where, first match wins:
1. `config.compilation_cache_dir` when set: a folder, or gs://bucket/path (JAX writes through
   etils.epath), or "off" for no cache;
2. the JAX_COMPILATION_CACHE_DIR environment variable (JAX's own; the tests set it to share
   one cache between their processes);
3. WORKDIR/xla_cache: beside the checkpoints, so it survives the VM when the workdir is on
   Cloud Storage, and a resumed run finds it without being told.

JAX's own rules decide what is stored: programs that took at least
jax_persistent_cache_min_compile_time_secs (1 s by default) to compile; an entry is keyed by
the program, the compiler flags, the jax/jaxlib version and the device kind, so a changed
config or another accelerator compiles anew instead of loading a wrong program.

The cache is only a cache: a folder that cannot be written (read-only, full, no permission)
turns it off with one warning, and a write that fails later (the disk filled up) warns once;
training goes on either way, compiling what it cannot load.
"""
import os
import uuid
import warnings

import jax
from absl import logging
from etils import epath

from aiayn_flax.runtime import storage_errors

OFF = "off"
ENVIRONMENT_VARIABLE = "JAX_COMPILATION_CACHE_DIR"


def cache_dir(configured: str, workdir: str, environ=os.environ) -> str | None:
  """The cache folder for a run (the rules above), or None when the cache is off."""
  if configured:
    return None if configured == OFF else configured
  return environ.get(ENVIRONMENT_VARIABLE) or os.path.join(workdir, "xla_cache")


def enable(config, workdir: str) -> str | None:
  """Points JAX's persistent cache at the run's folder (before anything is compiled); returns
  the folder, or None when the config turns the cache off."""
  folder = cache_dir(config.get("compilation_cache_dir", ""), workdir)
  if folder and (problem := unwritable(folder)):
    logging.warning("compilation cache %s cannot be written (%s): it is off for this run, which "
                    "compiles every program anew; training goes on", folder, problem)
    folder = None
  jax.config.update("jax_compilation_cache_dir", folder)
  if folder:
    logging.info("compilation cache: %s", folder)
    _warn_once_about_failed_writes(folder)
  return folder


def unwritable(folder: str) -> str | None:
  """Why the folder cannot hold the cache, in plain words (one small file is written and
  removed), or None when it can."""
  try:
    path = epath.Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".write_check.{uuid.uuid4().hex}"
    probe.write_bytes(b"compilation cache\n")
    probe.unlink()
  except Exception as e:  # noqa: BLE001 - OSError, or a bucket's own error class
    reason = storage_errors.cause(e)
    return reason[0] if reason else f"{type(e).__name__}: {e}"
  return None


_JAX_WRITE_WARNING = "Error writing persistent compilation cache entry"
_failed_writes = {"folder": None, "warned": False, "installed": False}


def _warn_once_about_failed_writes(folder: str) -> None:
  """JAX warns at every program it cannot store (each message names the program): the first
  becomes one warning in plain words (the debug log has them all)."""
  _failed_writes.update(folder=folder, warned=False)
  if _failed_writes["installed"]:
    return
  _failed_writes["installed"] = True
  previous = warnings.showwarning

  def show(message, category, filename, lineno, file=None, line=None):
    if not str(message).startswith(_JAX_WRITE_WARNING):
      return previous(message, category, filename, lineno, file, line)
    if not _failed_writes["warned"]:
      _failed_writes["warned"] = True
      reason = storage_errors.cause(Exception(str(message)))
      logging.warning("compilation cache %s: cannot store a compiled program (%s); training "
                      "goes on, and programs not stored are compiled again at the next start",
                      _failed_writes["folder"], reason[0] if reason else str(message)[:300])
    logging.debug("%s", message)
  warnings.showwarning = show
