"""Python's cyclic garbage collector, run less often by the entry points.

CPython starts a collection every 700 net allocations of container objects (its first
threshold). Importing JAX, flax, orbax and TensorFlow allocates millions of them, and tracing
and tokenizing many more, and each collection of the older generations walks everything still
alive. At 10,000 (docs/lab_notes/TESTS.md, "2026-11-30, late night"): a 20-step toy train.py,
its programs in the compilation cache, ran 65 collections instead of 576 (0.15 s of CPU
instead of 0.41 s); tokenizing 232,000 Multi30k pairs with JAX imported took 2.6-2.7 s
instead of 3.1-3.7 s.

Device arrays are freed by reference counting as soon as their last reference goes; only what
is caught in a reference cycle waits for a collection, which now comes a little later.

train.py, evaluate.py, translate.py and visualize_attention.py call `collect_less_often()`
before they import JAX, as do bench/parsing_table.py and bench/startup.py, and
tests/conftest.py for the tests run in pytest's own processes. A threshold the user set (any
but CPython's 700) is left as it is.
"""
import gc

FIRST_THRESHOLD = 10_000
CPYTHON_FIRST_THRESHOLD = 700


def collect_less_often() -> None:
  """Raises the first generation's threshold to FIRST_THRESHOLD, unless someone changed it."""
  first, *older = gc.get_threshold()
  if first == CPYTHON_FIRST_THRESHOLD:
    gc.set_threshold(FIRST_THRESHOLD, *older)
