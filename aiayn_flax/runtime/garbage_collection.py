"""Python's cyclic garbage collector, run less often by the entry points.

CPython starts a collection every 700 net allocations of container objects (its first
threshold). Importing JAX, flax, orbax and TensorFlow allocates millions of them, and tracing
a program many more, so a short run spends a tenth of its CPU collecting: a 20-step toy
train.py with its programs in the compilation cache ran 577 collections, 0.34 s of its 3.3 s;
at 10,000 it runs 36, 0.13 s (docs/lab_notes/TESTS.md, "2026-11-30, late night").

Device arrays are freed by reference counting as soon as their last reference goes; only what
is caught in a reference cycle waits for a collection, which now comes a little later.

train.py, evaluate.py, translate.py and visualize_attention.py call `collect_less_often()`
before they import JAX (tests/conftest.py too, for the tests run in pytest's processes). A
threshold the user set (any but CPython's 700) is left as it is.
"""
import gc

FIRST_THRESHOLD = 10_000
CPYTHON_FIRST_THRESHOLD = 700


def collect_less_often() -> None:
  """Raises the first generation's threshold to FIRST_THRESHOLD, unless someone changed it."""
  first, *older = gc.get_threshold()
  if first == CPYTHON_FIRST_THRESHOLD:
    gc.set_threshold(FIRST_THRESHOLD, *older)
