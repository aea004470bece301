"""Training batches assembled ahead of the training loop, on a background thread.

numpy's gathers release the GIL, so the next batches are built while the training thread
dispatches steps. (Whether the host-to-device copy of a ready batch then overlaps the previous
step on a TPU or GPU is up to JAX's asynchronous dispatch; it has not been measured on one.)
Items keep their order, so a run sees the same batches with and without prefetching.
"""
import queue
import threading
from collections.abc import Iterator

_END = object()
_POLL_S = 0.1  # how often a blocked producer checks whether the consumer has gone


def prefetched(items: Iterator, depth: int) -> Iterator:
  """Yields what `items` yields, in order, with up to `depth` items produced ahead on a
  background thread (depth 0: no thread). An exception raised by `items` is raised here, after
  the items before it. Closing the generator stops the thread."""
  if depth <= 0:
    yield from items
    return
  ready = queue.Queue(maxsize=depth)
  stop = threading.Event()

  def offer(entry) -> bool:
    while not stop.is_set():
      try:
        ready.put(entry, timeout=_POLL_S)
        return True
      except queue.Full:
        continue
    return False

  def produce():
    try:
      for item in items:
        if not offer((item, None)):
          return
      offer((_END, None))
    except BaseException as error:  # noqa: BLE001 -- re-raised in the consuming thread
      offer((_END, error))

  producer = threading.Thread(target=produce, name="batch-prefetch", daemon=True)
  producer.start()
  try:
    while True:
      item, error = ready.get()
      if item is _END:
        if error is not None:
          raise error
        return
      yield item
  finally:
    stop.set()
    producer.join()
