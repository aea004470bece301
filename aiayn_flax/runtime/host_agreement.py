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
"""
import hashlib
import json

import jax
from etils import epath

from aiayn_flax.runtime import process_zero


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
