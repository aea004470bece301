"""Work that process 0 does once for a whole multi-host run while the other processes wait.

A pod slice or a GPU cluster runs the same command on every host. Files of the run (the
prepared tfds data, the vocabulary, the tokenized cache, the evaluation's outputs) must be
written by one process: several hosts writing one gs:// object race, and each would redo hours
of work. `first(name, make, read)` runs make() on process 0 while the others wait on the
distributed client's key-value store, then read() on the others. An error on process 0 is
raised on every process, in one line, so that no host waits for a peer that has stopped.

`read_once(name, read)` is for what every process needs but hosts may not all have: process 0
reads (a test set, the validation text) and the others receive the same value, so that hosts with
separate disks neither download nor prepare anything, and cannot read different text.

`gathered(value)` collects one JSON value from every process (e.g. the translations of each
process's share of a test set).
"""
import itertools
import json

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

# Process 0 may prepare a tfds dataset (hours for WMT14) or train a 37k vocabulary while the
# others wait: their wait is bounded only to end a run whose process 0 is gone.
WAIT_HOURS = 24
_WAIT_MS = WAIT_HOURS * 3600 * 1000
_counter = itertools.count()  # every process makes the same calls in the same order


class ProcessZeroFailed(ValueError):
  """Raised on the other processes when process 0 failed at the work they waited for."""


def _client():
  """The client jax.distributed.initialize() started (its key-value store lets the others wait
  for hours), or None where a JAX release has moved it: process 0's verdict then travels by a
  broadcast over the devices, as read_once's does (a wait bounded by the collectives' own
  timeouts), with one warning. Private, hence this one place (as cluster.py's detectors)."""
  try:
    from jax._src import distributed
    return distributed.global_state.client
  except (ImportError, AttributeError) as e:
    logging.log_first_n(logging.WARNING, "JAX's distributed client (jax._src.distributed) is "
                        "not where it was (%s): process 0's verdicts go by broadcast instead",
                        1, e)
    return None


def _key(name: str) -> str:
  return f"aiayn_flax/{name}/{next(_counter)}"


def first(name: str, make, read):
  """make() on process 0 (alone: on this process), then read() on every other process once
  process 0 is done. Returns what make() or read() returned."""
  if jax.process_count() == 1:
    return make()
  key, client = _key(name), _client()
  if client is None:  # no key-value store to wait on: process 0's verdict is broadcast
    announce, await_verdict = _broadcast_json, lambda: _broadcast_json(None)
  else:
    announce = lambda verdict: client.key_value_set(key, verdict)  # noqa: E731
    await_verdict = lambda: client.blocking_key_value_get(key, _WAIT_MS)  # noqa: E731
  if jax.process_index() == 0:
    try:
      result = make()
    except Exception as e:
      announce(f"{type(e).__name__}: {e}")
      raise
    announce("")
    return result
  error = await_verdict()
  if error:
    raise ProcessZeroFailed(f"process 0 stopped at {name}: {error}")
  return read()


class NotProcessZero(RuntimeError):
  """Raised when a process other than 0 of a multi-host run would read a dataset itself."""


def require_process_zero(what: str) -> None:
  """Stops a process other than 0 of a multi-host run from reading, downloading or preparing
  `what`: its disk may hold none of it (hosts with separate disks), and only process 0's copy
  is what the run trains and evaluates on (`first`, `read_once`)."""
  if jax.process_count() > 1 and jax.process_index() != 0:
    raise NotProcessZero(f"process {jax.process_index()} of {jax.process_count()} would read "
                         f"{what} itself; only process 0 reads data (process_zero.read_once)")


def read_once(name: str, read):
  """read() on process 0, and its JSON value (lists for tuples) on every process. An error on
  process 0 is raised on every process in one line (ProcessZeroFailed on the others)."""
  if jax.process_count() == 1:
    return read()
  if jax.process_index() == 0:
    try:
      value, error = read(), ""
    except Exception as e:
      value, error = None, f"{type(e).__name__}: {e}"
      _broadcast_json([None, error])
      raise
    return _broadcast_json([value, error])[0]
  value, error = _broadcast_json(None)
  if error:
    raise ProcessZeroFailed(f"process 0 stopped at {name}: {error}")
  return value


def _broadcast_json(value):
  """Process 0's JSON value on every process (the others pass anything): its size, then its
  UTF-8 bytes, through multihost_utils.broadcast_one_to_all."""
  data = np.frombuffer(json.dumps(value).encode(), np.uint8)
  size = int(multihost_utils.broadcast_one_to_all(np.array(data.size, np.int64)))
  padded = np.zeros(size, np.uint8)
  if jax.process_index() == 0:
    padded[:] = data
  received = np.asarray(multihost_utils.broadcast_one_to_all(padded))
  return json.loads(bytes(received))


def gathered(value) -> list:
  """[value of process 0, value of process 1, ...]: a JSON-serializable value from every
  process, on every process (as UTF-8 bytes gathered over the devices: any size)."""
  if jax.process_count() == 1:
    return [value]
  data = np.frombuffer(json.dumps(value).encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.array([data.size], np.int64))[:, 0]
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:data.size] = data
  rows = multihost_utils.process_allgather(padded)  # [processes, longest]
  return [json.loads(bytes(row[:size])) for row, size in zip(rows, sizes)]
