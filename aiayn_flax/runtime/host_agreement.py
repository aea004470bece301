"""The hosts of one run agree on what they train, or every host stops saying where they differ.

Each host of a pod slice or GPU cluster loads the config, the vocabulary, the token cache and
the list of checkpoints itself. A stale NFS view, a host started with another flag or another
checkout would make it train on other batches than its peers without any error: its gradients
would be averaged into everyone's. So at start every host contributes a few facts (the config,
digests of the vocabulary and batch plan, the checkpoint steps it sees), all of them are
gathered (process_zero.gathered), and every host compares them in the same order: the first
fact that differs stops every host with the same line, naming the fact and the host.

What each host reads for itself before it can compare anything (the config file named by
--config, a trained run's config in its workdir) can fail on one host alone (a file missing from
its disk): `stop_if_any_failed` and `on_every_host` make that host's error stop every host at
once, each in one line, instead of leaving the others waiting in a collective for one that has
stopped, until JAX's timeouts.

A host can also stop alone where no host agreement is reached first: inside a library's save
(orbax), where its peers then wait for it. `say_stopped` puts its one line in the coordinator's
key-value store, and `peers_watched` (around the whole training on every host) ends any process
that finds such a line, at once, with that line (naming its process) and exit status 1: the
watch is a thread of its own, so the process's main thread may be waiting anywhere (in orbax's
polling, a barrier, a collective).
"""
import contextlib
import hashlib
import json
import os
import sys
import threading

import jax
from absl import logging
from etils import epath

from aiayn_flax.runtime import process_zero, storage_errors


class HostsDisagree(ValueError):
  pass


class AnotherHostFailed(ValueError):
  """Raised on every other process when one failed at work that each does for itself."""


def stop_if_any_failed(name: str, error: str | None) -> None:
  """Every process passes what it failed at (`error`, one line) or None; where any failed,
  raises on every process: AnotherHostFailed naming the first process that failed and its
  error, on the processes that did not (the one that did raises its own error itself). Every
  process must call it, after joining (cluster.initialize_distributed)."""
  if jax.process_count() == 1:
    return
  errors = process_zero.gathered(error)
  failed = [(process, e) for process, e in enumerate(errors) if e]
  if failed and not error:
    process, first = failed[0]
    raise AnotherHostFailed(f"process {process} stopped at {name}: {first}")


def on_every_host(name: str, work):
  """work() on every process; where it raises on any, every process stops: that process with
  its own error, the others with AnotherHostFailed naming it (stop_if_any_failed)."""
  try:
    result = work()
  except Exception as e:
    stop_if_any_failed(name, f"{type(e).__name__}: {e}")
    raise
  stop_if_any_failed(name, None)
  return result


# Where a process that stops alone says so (the coordinator's key-value store), and how often
# the other processes look there (one small request to process 0's coordinator each time).
# A line stays there until the cluster ends (the store is process 0's memory, gone with it): the
# other processes read it while they wait, and a line deleted before the slowest has read it
# would leave that one waiting. A run that ends normally has written none (a line written ends
# every process), so there is nothing to delete then.
_STOPPED_KEYS = "aiayn_flax/stopped/"
WATCH_INTERVAL_S = 0.5
# How long a process that stops waits to leave the cluster (JAX's shutdown barrier, which the
# other hosts, stopping too, reach within a watch interval or two) before it exits without
# leaving: a host that died, or a coordinator that no longer answers, must not keep it.
LEAVE_BOUND_S = 20.0
# Taken by what ends this process first, its own error or another host's line: the other stands
# down, so that the process prints one line, not two.
_ending = threading.Lock()


def say_stopped(line: str | None) -> None:
  """This process stops on `line` (one line, e.g. a failed write): the others, wherever they
  wait for it, stop with it (`peers_watched`); None: it stops on another host's line, which
  that host has said already. Where another host's line is already ending this process (the
  watch), waits for that instead."""
  if jax.process_count() == 1:
    return
  if not _ending.acquire(blocking=False):
    threading.Event().wait()  # the watch is ending this process with another host's line
  client = process_zero._client()  # noqa: SLF001 - the one place that reaches it
  if line is None or client is None:
    return
  try:
    client.key_value_set(f"{_STOPPED_KEYS}{jax.process_index()}", line)
  except Exception as e:  # noqa: BLE001 - the coordinator may be gone: nothing more to say
    logging.debug("could not tell the other hosts that this one stops: %s", e)


def end_process(line: str) -> None:
  """Ends this process with exit status 1 after `line` on stderr: leaves the cluster (the
  other hosts are stopping too, so JAX's shutdown barrier passes) within LEAVE_BOUND_S, then
  exits without waiting for threads that a library left waiting (orbax polls up to 10 minutes
  for a folder that a host which stopped will never make). Whatever fails or hangs on the way
  (a closed stderr, a shutdown that never returns), the process still ends."""
  if jax.process_count() == 1:
    sys.exit(line)
  try:
    storage_errors.stopping()  # a library thread failing here too: its records after the line
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)
    logging.flush()
    leave_cluster(LEAVE_BOUND_S)
  finally:
    os._exit(1)


def leave_cluster(bound_s: float) -> bool:
  """jax.distributed.shutdown() in a thread of its own, waited for at most `bound_s` seconds;
  True where it returned (an error in it is logged: this process is leaving anyway)."""
  def shutdown():
    try:
      jax.distributed.shutdown()
    except Exception as e:  # noqa: BLE001 - leaving anyway
      logging.debug("leaving the cluster: %s", e)

  leaving = threading.Thread(target=shutdown, name="leave_cluster", daemon=True)
  leaving.start()
  leaving.join(bound_s)
  if leaving.is_alive():
    logging.debug("leaving the cluster took over %.0f s: exiting without it", bound_s)
  return not leaving.is_alive()


@contextlib.contextmanager
def peers_watched(program: str):
  """While the block runs, a thread reads every WATCH_INTERVAL_S the lines of hosts that
  stopped alone (`say_stopped`); on one from another host, it ends this process
  (`end_process`) with "PROGRAM: error: process N stopped: LINE". One process: nothing."""
  client = process_zero._client() if jax.process_count() > 1 else None  # noqa: SLF001
  if client is None:
    yield
    return
  done = threading.Event()

  def watch():
    while not done.wait(WATCH_INTERVAL_S):
      try:
        stopped = sorted(client.key_value_dir_get(_STOPPED_KEYS))
      except Exception:  # noqa: BLE001 - the coordinator is gone: this process ends anyway
        return
      others = [(key, line) for key, line in stopped
                if key.rsplit("/", 1)[-1] != str(jax.process_index())]
      if others and _ending.acquire(blocking=False):
        key, line = others[0]
        end_process(f"{program}: error: process {key.rsplit('/', 1)[-1]} stopped: {line}")
  thread = threading.Thread(target=watch, name="peers_watched", daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()


def check(facts: dict, hints: dict | None = None) -> None:
  """Raises HostsDisagree on every process when any process's facts (JSON values, compared in
  the order given) differ from process 0's; `hints[name]` says what to do about a fact."""
  if jax.process_count() == 1:
    return
  everyone = process_zero.gathered(facts)
  for name in facts:
    for host, theirs in enumerate(everyone[1:], start=1):
      if theirs.get(name) != everyone[0].get(name):
        where, ours, other = first_difference(everyone[0].get(name), theirs.get(name))
        hint = (hints or {}).get(name)
        raise HostsDisagree(
            f"host {host} differs from host 0 in its {name}: {where + ': ' if where else ''}"
            f"{json.dumps(ours)} on host 0, {json.dumps(other)} on host {host}"
            + (f"; {hint}" if hint else ""))


def first_difference(ours, theirs, where: str = "") -> tuple[str, object, object]:
  """(dotted key, our value, their value) of the first difference between two JSON values,
  keys in sorted order, e.g. ("model.d_model", 512, 256)."""
  if isinstance(ours, dict) and isinstance(theirs, dict):
    for key in sorted(set(ours) | set(theirs)):
      if ours.get(key) != theirs.get(key):
        return first_difference(ours.get(key), theirs.get(key), f"{where}.{key}".lstrip("."))
  return where, ours, theirs


def file_digest(path) -> str | None:
  """sha256 of a file's bytes (None when there is no file, as for the toy task's vocabulary)."""
  if not path or not epath.Path(path).exists():
    return None
  return hashlib.sha256(epath.Path(path).read_bytes()).hexdigest()
