"""JAX's persistent compilation cache: a resumed run loads the programs its first start
compiled (aiayn_flax/runtime/compilation_cache.py), in the folder the config or the environment
names, else WORKDIR/xla_cache."""
import os
import re
import subprocess
import sys

import pytest

from aiayn_flax.runtime import compilation_cache
from conftest import TOY_ONE_LAYER

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_config_key_wins_over_the_environment_which_wins_over_the_workdir():
  env = {"JAX_COMPILATION_CACHE_DIR": "/env/cache"}
  assert compilation_cache.cache_dir("gs://b/cache", "runs/a", env) == "gs://b/cache"
  assert compilation_cache.cache_dir("", "runs/a", env) == "/env/cache"
  assert compilation_cache.cache_dir("", "runs/a", {}) == "runs/a/xla_cache"
  assert compilation_cache.cache_dir("", "gs://b/run", {}) == "gs://b/run/xla_cache"
  assert compilation_cache.cache_dir("off", "runs/a", env) is None


def train_toy(workdir, steps: int):
  # No JAX_COMPILATION_CACHE_DIR (conftest sets one for the session): the run's default,
  # WORKDIR/xla_cache. JAX logs each cache write and hit at DEBUG for these modules.
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  env |= {"JAX_DEBUG_LOG_MODULES": "jax._src.compiler,jax._src.compilation_cache",
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  result = subprocess.run(
      [sys.executable, "train.py", "--config=configs/toy.py", f"--workdir={workdir}", TOY_ONE_LAYER,
       f"--config.num_train_steps={steps}", "--config.checkpoint_every_steps=10",
       "--config.eval_every_steps=10", "--config.log_every_steps=10"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  written = set(re.findall(r"Writing (\S+) to persistent compilation cache", result.stderr))
  loaded = set(re.findall(r"Persistent compilation cache hit for '([^']+)'", result.stderr))
  return written, loaded


@pytest.mark.slow
def test_a_resumed_run_loads_the_programs_its_first_start_compiled(tmp_path):
  workdir = tmp_path / "run"
  written, loaded = train_toy(workdir, 10)
  assert "jit_train_step" in written and "jit_eval_step" in written and not loaded
  entries = set(os.listdir(workdir / "xla_cache"))
  assert entries  # the default folder, beside the checkpoints
  written_again, loaded = train_toy(workdir, 20)  # resumes from step 10
  assert {"jit_train_step", "jit_eval_step"} <= loaded
  assert not {"jit_train_step", "jit_eval_step"} & written_again
