"""Batches prefetched on a background thread: same items, same order, errors where they
happened, a bounded lead, and no thread left behind."""
import threading
import time

import pytest

from aiayn_flax.data import prefetch


def prefetch_threads() -> list[threading.Thread]:
  return [t for t in threading.enumerate() if t.name == "batch-prefetch"]


def test_items_come_in_order_with_and_without_a_thread():
  assert list(prefetch.prefetched(iter(range(1000)), 3)) == list(range(1000))
  assert list(prefetch.prefetched(iter(range(10)), 0)) == list(range(10))
  assert not prefetch_threads()


def test_an_error_is_raised_after_the_items_before_it():
  def items():
    yield from range(5)
    raise KeyError("batch 5")
  seen = []
  with pytest.raises(KeyError, match="batch 5"):
    for item in prefetch.prefetched(items(), 2):
      seen.append(item)
  assert seen == list(range(5))
  assert not prefetch_threads()


def test_the_producer_stays_at_most_depth_items_ahead_and_stops_when_closed():
  produced = []

  def endless():
    while True:
      produced.append(len(produced))
      yield produced[-1]
  batches = prefetch.prefetched(endless(), 2)
  assert next(batches) == 0
  deadline = time.monotonic() + 60
  while len(produced) < 1 + 2 and time.monotonic() < deadline:  # it runs ahead...
    time.sleep(0.01)
  time.sleep(0.2)  # ...and would go on, were it not bounded
  # one taken, two waiting in the queue, one more built and waiting for room
  assert 1 + 2 <= len(produced) <= 1 + 2 + 1
  batches.close()
  assert not prefetch_threads()
