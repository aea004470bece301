"""One run per workdir: a lease file (WORKDIR/run.lease) names the run training there.

Two runs in one workdir would save the same steps and delete each other's checkpoints. The
run's process 0 writes the lease (host, pid, start time) when it starts, renews its heartbeat
every HEARTBEAT_SECONDS while it trains, and removes it when it ends. A run that finds a live
lease refuses to start, in one line naming the holder. A lease is live when its holder still
runs: on the same host, while its pid is alive; from another host (where the pid cannot be
asked), while its heartbeat is fresher than STALE_SECONDS. So a run killed without a chance to
remove its lease (SIGKILL, a preempted VM) does not block its own resumption: at once on the
same host, after STALE_SECONDS from another. Through etils.epath: gs:// workdirs work alike.

A pid alone does not name a process for long: a restarted container (Docker, Kubernetes, GKE
JobSet) usually hands its new trainer the pid the old one had, often 1, and a rebooted host
reuses pids too. So the lease also records the host's boot id (/proc/sys/kernel/random/boot_id)
and the holder's start time (/proc/PID/stat, field 22), and on the same host its holder is
live only if the pid answers, from the same boot, with the same start time; and a lease
naming this very process, which it did not take itself, was written by a previous incarnation
(the same pid, before a restart or an exec). Without /proc (macOS), or in a lease written before
these fields, the pid alone decides, as before.

(Two runs started within the same second can both miss each other's lease: the lease guards
against the common mistake, a second command on a workdir in use, not against a race.)
"""
import contextlib
import datetime
import json
import os
import socket
import threading
import time
import uuid

from absl import logging
from etils import epath

from aiayn_flax import paths, process_zero

LEASE_FILENAME = "run.lease"
HEARTBEAT_SECONDS = 30
STALE_SECONDS = 300  # 10 heartbeats: a live run on a busy host (or a slow bucket) renews it


class WorkdirInUse(ValueError):
  pass


# The runs whose leases this process holds: a lease naming this process's pid is live only if
# it is one of these (the process took it), not if a previous incarnation with its pid wrote it.
_TAKEN_HERE: set[str] = set()


def is_live(lease: dict, now: float | None = None) -> bool:
  """Whether the lease's run is still running (see the module's docstring)."""
  if lease.get("host") == socket.gethostname():
    pid = int(lease.get("pid", 0))
    if pid == os.getpid():
      return lease.get("run") in _TAKEN_HERE
    if None not in (lease.get("boot_id"), boot_id()) and lease["boot_id"] != boot_id():
      return False  # written before the host (or the container's host) rebooted
    if not _pid_alive(pid):
      return False
    started, now_started = lease.get("pid_started"), process_start_time(pid)
    return None in (started, now_started) or started == now_started  # else: the pid reused
  now = time.time() if now is None else now
  return now - float(lease.get("heartbeat", 0)) < STALE_SECONDS


def boot_id() -> str | None:
  """This host's boot id (a new one at every boot), or None without /proc."""
  try:
    return open("/proc/sys/kernel/random/boot_id").read().strip()
  except OSError:
    return None


def process_start_time(pid: int) -> int | None:
  """When process pid started, in clock ticks after boot (/proc/PID/stat, field 22), or None
  without /proc or without that process."""
  try:  # the name (field 2) may hold spaces and parentheses: the fields after its last ")"
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])
  except (OSError, IndexError, ValueError):
    return None


def _pid_alive(pid: int) -> bool:
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # someone else's process: alive
    return True
  try:  # a killed process that its parent has not reaped yet is dead all the same
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
  except (OSError, IndexError):  # no /proc (macOS): the pid answered
    return True


def read_lease(path: epath.Path) -> dict | None:
  """The lease at path, or None when there is none (an unreadable one is reported and
  ignored: it was cut while written, and holds no run's name)."""
  try:
    return json.loads(path.read_text())
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    logging.warning("%s: unreadable lease (%s); taking it over", path, e)
    return None


def describe(lease: dict) -> str:
  return (f"the run started {lease.get('started')} on host {lease.get('host')}, pid "
          f"{lease.get('pid')} (last heartbeat {lease.get('heartbeat_utc')})")


class Lease:
  """This run's lease, renewed by a daemon thread until `release`."""

  def __init__(self, path: epath.Path):
    self.path = path
    now = time.time()
    self.record = {"host": socket.gethostname(), "pid": os.getpid(), "run": uuid.uuid4().hex,
                   "started": _utc(now), "boot_id": boot_id(),
                   "pid_started": process_start_time(os.getpid())}
    _TAKEN_HERE.add(self.record["run"])
    self._stop = threading.Event()
    self._write(now)
    self._thread = threading.Thread(target=self._renew, name="workdir-lease", daemon=True)
    self._thread.start()

  def _write(self, now: float) -> None:
    record = self.record | {"heartbeat": now, "heartbeat_utc": _utc(now)}
    paths.write_atomically(self.path, lambda f: f.write(json.dumps(record).encode()))

  def _renew(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECONDS):
      try:
        self._write(time.time())
      except OSError as e:  # a transient storage error: the next heartbeat tries again
        logging.warning("%s: could not renew the lease: %s", self.path, e)

  def is_ours(self) -> bool:
    lease = read_lease(self.path)
    return bool(lease) and lease.get("run") == self.record["run"]

  def release(self) -> None:
    self._stop.set()
    self._thread.join()
    if self.is_ours():
      self.path.unlink(missing_ok=True)
    _TAKEN_HERE.discard(self.record["run"])


def take(workdir) -> Lease:
  """This run's lease on workdir; WorkdirInUse (one line naming the holder) when a live run
  holds it."""
  path = paths.workdir_path(workdir) / LEASE_FILENAME
  existing = read_lease(path)
  if existing and is_live(existing):
    raise WorkdirInUse(f"{paths.workdir_path(workdir)} is in use by {describe(existing)}; "
                       f"wait for it to end or stop it, or train in another --workdir (a "
                       f"killed run's lease ({path}) stops counting once its pid is gone, or "
                       f"after {STALE_SECONDS} s without a heartbeat from another host)")
  if existing:
    logging.info("%s: taking over the lease of %s, which has stopped", path, describe(existing))
  lease = Lease(path)
  logging.info("%s: this run's lease (host %s, pid %d)", path, lease.record["host"],
               lease.record["pid"])
  return lease


@contextlib.contextmanager
def held(workdir):
  """The lease, held by process 0 for the whole run (the other processes of the run wait for
  its verdict and refuse with it)."""
  lease = process_zero.first("workdir lease", lambda: take(workdir), lambda: None)
  try:
    yield lease
  finally:
    if lease:
      lease.release()


def _utc(seconds: float) -> str:
  return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(
      timespec="seconds")
