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
"""
import os

import jax
from absl import logging

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
  jax.config.update("jax_compilation_cache_dir", folder)
  if folder:
    logging.info("compilation cache: %s", folder)
  return folder
