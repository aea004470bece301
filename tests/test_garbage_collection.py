"""The entry points collect garbage less often (aiayn_flax/runtime/garbage_collection.py): they
raise CPython's first threshold in their `__main__` block, which `python SCRIPT`, IPython's
`%run` and `python -m pdb` all run, before importing JAX, and leave a threshold the user set
alone."""
import gc
import os
import subprocess
import sys

import pytest

from aiayn_flax.runtime import garbage_collection

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY_POINTS = ["train.py", "evaluate.py", "translate.py", "visualize_attention.py"]


def test_the_first_threshold_is_raised_from_cpython_s_and_the_older_ones_kept():
  saved = gc.get_threshold()
  try:
    gc.set_threshold(700, 11, 12)
    garbage_collection.collect_less_often()
    assert gc.get_threshold() == (garbage_collection.FIRST_THRESHOLD, 11, 12)
    gc.set_threshold(2_000, 10, 10)  # the user's own
    garbage_collection.collect_less_often()
    assert gc.get_threshold() == (2_000, 10, 10)
  finally:
    gc.set_threshold(*saved)


@pytest.mark.slow  # starts each entry point
@pytest.mark.parametrize("script", ENTRY_POINTS)
@pytest.mark.parametrize("user_threshold", [None, 2_000])
def test_each_entry_point_raises_the_threshold_before_jax_unless_the_user_set_one(
    script, user_threshold):
  # Started as IPython's %run starts it (runpy, __main__), with --help: absl prints the help
  # and exits while parsing flags, after the entry point set the threshold and before any
  # import of JAX.
  code = (f"import gc, runpy, sys; sys.argv = [{script!r}, '--help']\n"
          + (f"gc.set_threshold({user_threshold})\n" if user_threshold else "")
          + f"try:\n  runpy.run_path({script!r}, run_name='__main__')\n"
          "except SystemExit:\n  pass\n"
          "print(gc.get_threshold()[0], 'jax' in sys.modules)")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  expected = user_threshold or garbage_collection.FIRST_THRESHOLD
  assert result.stdout.split()[-2:] == [str(expected), "False"], result.stdout[-500:]
