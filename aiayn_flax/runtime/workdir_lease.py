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

A pid is only confirmed in the pid namespace that wrote it: the lease records the namespace
(/proc/self/ns/pid), and a holder in another one (a container beside this one with host
networking shares the hostname and boot id, not the pids; a replacement pod that kept its
hostname runs on another node, with another boot id) is judged by its heartbeat's age, as one
from another host is.

Two runs started at once cannot both take the lease: on a local or network filesystem a new
lease is created whole and exclusively (a hard link, which fails where a lease exists); a lease
taken over from a stopped run, or on Cloud Storage (no exclusive create), is written, left
SETTLE_SECONDS for any rival's write to land, and read back: the run that finds its own is the
one that trains, the others refuse, naming it. Each renewal reads the lease first and stops
renewing (`lost`, logged) where another run has taken it over: it never writes over the new
holder's lease. The trainer then stops without saving anything more (`check_still_ours`
before each checkpoint, and the hosts' stop agreement between them: stops.py), with
LeaseLost: one line naming the run that took the workdir over. Both routes ask this Lease
(`_taken_over` decides); there are two because the stop agreement is read one call late (it
never waits for the step just dispatched), while a checkpoint needs the verdict before it is
written, from a read made then.
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

from aiayn_flax.runtime import checkpoints, paths, process_zero, storage_errors

LEASE_FILENAME = "run.lease"
HEARTBEAT_SECONDS = 30
STALE_SECONDS = 300  # 10 heartbeats: a live run on a busy host (or a slow bucket) renews it
# Longer than any rival takes from reading the lease to writing its own (a read and a write,
# on Cloud Storage too): after it, a read-back shows the last of the rivals' writes.
SETTLE_SECONDS = 2.0


class WorkdirInUse(ValueError):
  pass


class LeaseLost(RuntimeError):
  """Another run took this run's workdir over while it trained: it stops, saving nothing."""


# The runs whose leases this process holds: a lease naming this process's pid is live only if
# it is one of these (the process took it), not if a previous incarnation with its pid wrote it.
_TAKEN_HERE: set[str] = set()


def is_live(lease: dict, now: float | None = None) -> bool:
  """Whether the lease's run is still running (see the module's docstring)."""
  if pid_confirmable(lease):
    pid = int(lease.get("pid", 0))
    if pid == os.getpid():
      return lease.get("run") in _TAKEN_HERE
    if not _pid_alive(pid):
      return False
    started, now_started = lease.get("pid_started"), process_start_time(pid)
    return None in (started, now_started) or started == now_started  # else: the pid reused
  now = time.time() if now is None else now
  return now - float(lease.get("heartbeat", 0)) < STALE_SECONDS


def pid_confirmable(lease: dict) -> bool:
  """Whether the lease's pid names a process this one can ask about: written on this host,
  in this boot (else another machine with the same hostname, or a reboot) and in this pid
  namespace (else another container). A field that either side lacks (an older lease, no
  /proc) does not count against it."""
  if lease.get("host") != socket.gethostname():
    return False
  return all(None in (lease.get(field), ours) or lease[field] == ours
             for field, ours in (("boot_id", boot_id()), ("pid_namespace", pid_namespace())))


def pid_namespace() -> str | None:
  """This process's pid namespace ("pid:[4026531836]"), or None without /proc."""
  try:
    return os.readlink("/proc/self/ns/pid")
  except OSError:
    return None


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
  """This run's lease (taken by `take`), renewed by a daemon thread until `release`."""

  def __init__(self, path: epath.Path):
    self.path = path
    self.record = {"host": socket.gethostname(), "pid": os.getpid(), "run": uuid.uuid4().hex,
                   "started": _utc(time.time()), "boot_id": boot_id(),
                   "pid_namespace": pid_namespace(),
                   "pid_started": process_start_time(os.getpid())}
    self.lost = threading.Event()  # set when another run has taken the lease over
    self.taken_over_by: dict | None = None  # that run's lease
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._renew, name="workdir-lease", daemon=True)

  def _text(self, now: float) -> bytes:
    return json.dumps(self.record | {"heartbeat": now, "heartbeat_utc": _utc(now)}).encode()

  def _write(self, now: float) -> None:
    text = self._text(now)
    paths.write_atomically(self.path, lambda f: f.write(text))

  def _create_exclusively(self) -> bool:
    """Creates the lease, whole, where there is none (a hard link to a written file fails
    where the lease exists: atomic on local and network filesystems); False where one exists
    or the storage has no hard links (Cloud Storage, some FUSE mounts)."""
    if paths.is_url(self.path):
      return False
    temp = self.path.parent / f".{self.path.name}.{self.record['run']}.tmp"
    self.path.parent.mkdir(parents=True, exist_ok=True)
    temp.write_bytes(self._text(time.time()))
    try:
      os.link(temp, self.path)
      return True
    except OSError:  # FileExistsError, or no hard links here
      return False
    finally:
      temp.unlink(missing_ok=True)

  def _start_renewing(self) -> None:
    _TAKEN_HERE.add(self.record["run"])
    self._thread.start()

  def _renew(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECONDS):
      try:
        if self._taken_over():
          # Taken over (this run's heartbeat went stale: a stopped VM, a slow bucket): two
          # runs share the workdir now, and this one must not write over the other's lease.
          logging.error("%s: the workdir's lease was taken over by %s; this run no longer "
                        "holds it, stops renewing it, and stops training without saving",
                        self.path, describe(self.taken_over_by))
          return
        self._write(time.time())
      except OSError as e:  # a transient storage error: the next heartbeat tries again
        logging.warning("%s: could not renew the lease: %s", self.path, e)

  def _taken_over(self) -> bool:
    """Whether another run's lease is in the file now (then `lost` and `taken_over_by` are
    set); a lease missing or unreadable for a moment is not another run's: the next renewal
    writes this run's again."""
    if self.lost.is_set():
      return True
    holder = read_lease(self.path)
    if holder and holder.get("run") != self.record["run"]:
      self.taken_over_by = holder
      self.lost.set()
    return self.lost.is_set()

  def check_still_ours(self) -> None:
    """Raises LeaseLost where another run has taken the lease over (found now or by a
    renewal): before a checkpoint, which would otherwise be written into that run's workdir."""
    if self._taken_over():
      raise lost_error(self)

  def is_ours(self) -> bool:
    lease = read_lease(self.path)
    return bool(lease) and lease.get("run") == self.record["run"]

  def release(self) -> None:
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()
    if self.is_ours():
      self.path.unlink(missing_ok=True)
    _TAKEN_HERE.discard(self.record["run"])


def take(workdir) -> Lease:
  """This run's lease on workdir; WorkdirInUse (one line naming the holder) when a live run
  holds it."""
  path = paths.workdir_path(workdir) / LEASE_FILENAME
  lease = Lease(path)
  existing = read_lease(path)
  if existing is None and not lease._create_exclusively():
    existing = read_lease(path)  # a rival created it first, or there are no hard links here
  if existing and is_live(existing):
    raise _in_use(workdir, path, existing)
  if existing or not lease.is_ours():  # taking a stopped run's lease over, or no hard links
    if existing:
      logging.info("%s: taking over the lease of %s, which has stopped", path,
                   describe(existing))
    lease._write(time.time())
    time.sleep(SETTLE_SECONDS)  # every rival that read what this run read has written now
    holder = read_lease(path)
    if not holder or holder.get("run") != lease.record["run"]:
      raise _in_use(workdir, path, holder or {})  # the last rival to write holds it
  lease._start_renewing()
  logging.info("%s: this run's lease (host %s, pid %d)", path, lease.record["host"],
               lease.record["pid"])
  return lease


def _take_or_say_why(workdir) -> Lease:
  """take(workdir), or WriteFailed in one line where the lease cannot be written (a full disk,
  a read-only workdir): the run has not started, and every checkpoint there is intact."""
  try:
    return take(workdir)
  except OSError as e:
    failure = storage_errors.write_failure(e, paths.workdir_path(workdir) / LEASE_FILENAME,
                                           checkpoints.intact_text(workdir))
    if failure is None:
      raise
    raise failure from e


def lost_error(lease: Lease | None) -> LeaseLost:
  """The one line that stops a run whose lease was taken over: naming the run that took it
  where this process held the lease (process 0), else saying process 0 found it."""
  if lease is None or lease.taken_over_by is None:
    return LeaseLost("process 0 found the workdir's lease taken over by another run: this run "
                     "no longer owns the workdir and stopped without saving a checkpoint")
  return LeaseLost(f"{lease.path.parent} was taken over by {describe(lease.taken_over_by)} "
                   "while this run trained (its heartbeat had gone stale, or its lease was "
                   "removed): it no longer owns the workdir and stopped without saving a "
                   "checkpoint")


def _in_use(workdir, path: epath.Path, holder: dict) -> WorkdirInUse:
  return WorkdirInUse(f"{paths.workdir_path(workdir)} is in use by {describe(holder)}; wait "
                      f"for it to end or stop it, or train in another --workdir (a killed "
                      f"run's lease ({path}) stops counting once its pid is gone, or after "
                      f"{STALE_SECONDS} s without a heartbeat from another host)")


@contextlib.contextmanager
def held(workdir):
  """The lease, held by process 0 for the whole run (the other processes of the run wait for
  its verdict and refuse with it)."""
  lease = process_zero.first("workdir lease", lambda: _take_or_say_why(workdir), lambda: None)
  try:
    yield lease
  finally:
    if lease:
      lease.release()


def _utc(seconds: float) -> str:
  return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(
      timespec="seconds")
