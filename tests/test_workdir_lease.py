"""The workdir's lease after a restart: a container's new trainer often has the pid its previous
incarnation had, and a pid can be reused by an unrelated process. The refusal of a live second
run and the resumption after a kill are in test_multi_host_data.py; runs racing for one
workdir, containers sharing a hostname, and a lease taken over while held (the trainer then
stops, saving nothing more) are here."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from aiayn_flax.runtime import workdir_lease
from conftest import REPO, TOY_ONE_LAYER


@pytest.fixture(autouse=True)
def quick_settling(monkeypatch):
  """A lease taken over is read back after SETTLE_SECONDS (2 s): a tenth of a second is ample
  for these tests' one taker (the race below has its own processes)."""
  monkeypatch.setattr(workdir_lease, "SETTLE_SECONDS", 0.1)


def a_lease(**fields) -> dict:
  """A lease as a run on this host writes it, from this boot, heartbeat fresh."""
  return {"host": socket.gethostname(), "pid": os.getpid(), "run": "earlier", "started": "then",
          "heartbeat": 0.0, "heartbeat_utc": "just now", "boot_id": workdir_lease.boot_id(),
          "pid_started": workdir_lease.process_start_time(os.getpid())} | fields


def take_after(tmp_path, lease: dict) -> dict:
  """Writes lease to the workdir, takes the workdir's lease, and returns the new one."""
  path = tmp_path / workdir_lease.LEASE_FILENAME
  path.write_text(json.dumps(lease))
  taken = workdir_lease.take(tmp_path)
  try:
    return json.loads(path.read_text())
  finally:
    taken.release()


def test_a_lease_naming_this_process_from_before_a_restart_is_taken_over(tmp_path):
  # The same pid, boot and start time: what a previous incarnation of this process wrote
  # before an exec, or what a restarted container's pid 1 finds.
  taken = take_after(tmp_path, a_lease())
  assert taken["run"] != "earlier" and taken["pid"] == os.getpid()


def test_this_process_cannot_take_a_workdir_twice(tmp_path):
  first = workdir_lease.take(tmp_path)
  try:
    with pytest.raises(workdir_lease.WorkdirInUse, match=rf"pid {os.getpid()} "):
      workdir_lease.take(tmp_path)
  finally:
    first.release()


@pytest.fixture
def other_process():
  process = subprocess.Popen(["sleep", "600"])
  yield process.pid
  process.kill()
  process.wait()


def test_a_live_holder_is_refused_and_its_pid_reused_is_not(tmp_path, other_process):
  started = workdir_lease.process_start_time(other_process)
  assert started is not None
  with pytest.raises(workdir_lease.WorkdirInUse, match=rf"pid {other_process} "):
    take_after(tmp_path, a_lease(pid=other_process, pid_started=started))
  # The pid answers, but it is another process than the one that wrote the lease:
  reused = take_after(tmp_path, a_lease(pid=other_process, pid_started=started - 1))
  assert reused["pid"] == os.getpid()
  # The pid answers, but the lease was written before the host rebooted:
  rebooted = take_after(tmp_path, a_lease(pid=other_process, pid_started=started,
                                          boot_id="00000000-0000-0000-0000-000000000000"))
  assert rebooted["pid"] == os.getpid()


def test_a_lease_written_before_boot_ids_and_start_times_is_read_as_before(tmp_path,
                                                                          other_process):
  old = {"host": socket.gethostname(), "pid": other_process, "run": "old", "started": "then",
         "heartbeat": 0.0, "heartbeat_utc": "just now"}
  with pytest.raises(workdir_lease.WorkdirInUse, match=rf"pid {other_process} "):
    take_after(tmp_path, old)
  assert take_after(tmp_path, old | {"pid": os.getpid()})["run"] != "old"


@pytest.mark.slow
def test_a_trainer_restarted_with_its_previous_pid_takes_its_lease_over(tmp_path):
  """A process takes the lease and is replaced by train.py through exec, keeping its pid, as
  a restarted container's trainer gets the pid (often 1) the killed one had."""
  workdir = tmp_path / "run"
  restart = textwrap.dedent(f"""
      import os, sys
      from aiayn_flax.runtime import workdir_lease
      workdir_lease.take({str(workdir)!r})  # the killed incarnation's lease, left behind
      os.execv(sys.executable, [sys.executable, "train.py", "--workdir={workdir}",
               "--config=configs/toy.py", "{TOY_ONE_LAYER}",
               "--config.num_train_steps=2",
               "--config.log_every_steps=1", "--config.eval_every_steps=0",
               "--config.checkpoint_every_steps=1000", "--config.dataset.toy_eval_examples=4"])
      """)
  environ = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
  environ.pop("XLA_FLAGS", None)
  process = subprocess.Popen([sys.executable, "-c", restart], cwd=REPO, env=environ,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  out, err = process.communicate(timeout=600)
  assert process.returncode == 0, err[-3000:]
  assert "taking over the lease of the run started " in err
  assert f", pid {process.pid} (last heartbeat " in err
  assert f"this run's lease (host {socket.gethostname()}, pid {process.pid})" in err
  assert not (workdir / workdir_lease.LEASE_FILENAME).exists()


@pytest.mark.parametrize("field", ["pid_namespace", "boot_id"])
def test_a_pid_from_another_namespace_or_boot_is_judged_by_its_heartbeat(tmp_path, field):
  """Two containers with host networking share the hostname and boot id, not the pids (both
  trainers may be pid 1: this pid here); a replacement pod that kept its hostname runs on
  another node (another boot id). Their pid says nothing here: a fresh heartbeat holds."""
  elsewhere = a_lease(heartbeat=time.time(), **{field: "elsewhere"})
  with pytest.raises(workdir_lease.WorkdirInUse, match=rf"pid {os.getpid()} "):
    take_after(tmp_path, elsewhere)
  stale = elsewhere | {"heartbeat": time.time() - workdir_lease.STALE_SECONDS - 1}
  assert take_after(tmp_path, stale)["run"] != "earlier"


def test_a_renewal_that_finds_another_runs_lease_stops_and_leaves_it(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lease, "HEARTBEAT_SECONDS", 0.05)
  lease = workdir_lease.take(tmp_path)
  try:
    other = a_lease(run="the run that took it over", pid=1, heartbeat=time.time())
    lease.path.write_text(json.dumps(other))
    assert lease.lost.wait(10)
    assert json.loads(lease.path.read_text()) == other
  finally:
    lease.release()
  assert json.loads(lease.path.read_text()) == other  # release removes only its own


# A process that takes the lease of each workdir at the instant given for it (the same for
# every process: each round a race), says whether it got it, and holds what it got until every
# process has tried every round. (The settling time shortened: a read and a write on a local
# disk take far less.)
TAKE_AT = textwrap.dedent("""
    import sys, time
    from aiayn_flax.runtime import workdir_lease
    workdir_lease.SETTLE_SECONDS = 0.3
    held = []
    for at, workdir in zip(sys.argv[1::2], sys.argv[2::2]):
      time.sleep(max(0, float(at) - time.time()))
      try:
        held.append(workdir_lease.take(workdir))
        print("took it", flush=True)
      except workdir_lease.WorkdirInUse as e:
        print("refused:", e, flush=True)
    time.sleep(max(0, float(at) + 2 - time.time()))
    for lease in held:
      lease.release()
    """)


@pytest.mark.slow
def test_of_processes_taking_the_lease_at_the_same_instant_exactly_one_gets_it(tmp_path):
  """Rounds of 2 processes racing for a workdir: with no lease there (created exclusively), and
  with a stopped run's lease to take over (written, then read back after the settling time)."""
  rounds = []
  for attempt in range(3):
    for before in ("no lease", "a stopped run's lease"):
      workdir = tmp_path / f"{attempt}-{before.replace(' ', '_')}"
      workdir.mkdir()
      if before != "no lease":  # from another host, its heartbeat stale: to be taken over
        (workdir / workdir_lease.LEASE_FILENAME).write_text(json.dumps(a_lease(
            host="another-host", heartbeat=time.time() - workdir_lease.STALE_SECONDS - 1)))
      rounds.append(workdir)
  first = time.time() + 5  # after both have imported
  schedule = [str(arg) for i, workdir in enumerate(rounds) for arg in (first + 0.6 * i, workdir)]
  processes = [subprocess.Popen([sys.executable, "-c", TAKE_AT, *schedule], cwd=REPO,
                                env=dict(os.environ, JAX_PLATFORMS="cpu"),
                                stdout=subprocess.PIPE, text=True) for _ in range(2)]
  outcomes = [p.communicate(timeout=120)[0].splitlines() for p in processes]
  for workdir, results in zip(rounds, zip(*outcomes)):
    assert sorted(result.split(":")[0] for result in results) == ["refused", "took it"], (
        workdir.name, results)


def test_a_lease_taken_over_is_found_before_a_checkpoint_and_a_lost_one_stays_lost(tmp_path):
  lease = workdir_lease.take(tmp_path)  # renewals every 30 s: none during this test
  try:
    lease.path.unlink()  # gone for a moment (or unreadable): not another run's
    lease.check_still_ours()
    other = a_lease(host="another-host", run="the run that took it over", pid=1)
    lease.path.write_text(json.dumps(other))
    with pytest.raises(workdir_lease.LeaseLost, match=(
        rf"^{tmp_path} was taken over by the run started then on host another-host, pid 1 "
        r"\(last heartbeat just now\) while this run trained .* stopped without saving a "
        "checkpoint$")):
      lease.check_still_ours()
    lease.path.write_text(json.dumps(lease.record))  # given back: too late, the run has stopped
    assert lease.lost.is_set()
    with pytest.raises(workdir_lease.LeaseLost):
      lease.check_still_ours()
  finally:
    lease.release()


def test_a_lost_lease_stops_the_run_before_any_signal_it_caught():
  import threading
  from aiayn_flax.runtime import stops
  lost = threading.Event()
  with stops.StopSignals() as signals:
    agreement = stops.StopAgreement(signals, lease_lost=lost)
    assert agreement.poll(1) is None
    signals.requested = "SIGTERM"
    assert agreement.poll(2) == "SIGTERM"
    lost.set()
    assert agreement.poll(3) == stops.LEASE_LOST
  # On several hosts the agreement is a max-reduction of each host's code: the lost lease's
  # must outrank every signal's number there (one process, above, reads the event first).
  assert stops.LEASE_LOST_CODE > max(s.value for s in signal.Signals)


def checkpoint_steps(workdir) -> set[int]:
  """The steps of the checkpoints in workdir, those being written too (orbax's temporary
  folders, named STEP.orbax-checkpoint-tmp-...)."""
  folder = workdir / "checkpoints"
  return {int(re.match(r"\d+", p.name).group()) for p in folder.iterdir()
          if re.match(r"\d+", p.name)} if folder.exists() else set()


# Put on a trainer's PYTHONPATH as sitecustomize.py: the process stops itself (SIGSTOP) right
# after logging the line that STOP_AFTER_LOG_LINE matches. The pause falls at a known step, how
# fast or slow the steps are, and the process stays there until the test sends SIGCONT.
STOP_AFTER_LOG_LINE = textwrap.dedent("""
    import logging, os, re, signal
    _call_handlers = logging.Logger.callHandlers
    def call_handlers(self, record):
      _call_handlers(self, record)
      if re.match(os.environ["STOP_AFTER_LOG_LINE"], record.getMessage()):
        os.kill(os.getpid(), signal.SIGSTOP)
    logging.Logger.callHandlers = call_handlers
""")


def stopping_after_log_line(tmp_path, pattern: str, env: dict) -> dict:
  """env for a process that stops itself after logging a line matching pattern."""
  folder = tmp_path / "stop_after_log_line"
  folder.mkdir(exist_ok=True)
  (folder / "sitecustomize.py").write_text(STOP_AFTER_LOG_LINE)
  return env | {"STOP_AFTER_LOG_LINE": pattern, "PYTHONPATH": os.pathsep.join(
      filter(None, [str(folder), env.get("PYTHONPATH", "")]))}


def wait_until_stopped(process, timeout: float = 300) -> None:
  """Returns once process is stopped (state T in /proc); fails if it ends or times out."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    with open(f"/proc/{process.pid}/stat") as f:
      if f.read().rsplit(")", 1)[1].split()[0] == "T":
        return
    assert process.poll() is None, f"ended with status {process.returncode} before stopping"
    time.sleep(0.05)
  raise AssertionError(f"pid {process.pid} not stopped after {timeout} s")


@pytest.mark.slow
def test_a_trainer_whose_lease_another_run_took_over_stops_saving_nothing_more(tmp_path):
  """A trainer paused (SIGSTOP: a VM stopped, a process swapped out) long enough for another
  run to take its workdir over: on resuming it saves no checkpoint into the other run's
  workdir, and stops in one line naming that run, with status 1."""
  from test_multi_host_data import TOY, environment, wait_for_line
  workdir = tmp_path / "run"
  trainer = subprocess.Popen(
      [sys.executable, "train.py", f"--workdir={workdir}", *TOY,
       "--config.num_train_steps=100000", "--config.log_every_steps=5",
       "--config.checkpoint_every_steps=50"], cwd=REPO,
      env=stopping_after_log_line(tmp_path, r"step 55/", environment()),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    # Paused between checkpoints, by itself, at step 55: that of step 50 is written (saves are
    # synchronous here), the next one, at step 100, is not begun.
    wait_for_line(trainer, r"step 55/")
    wait_until_stopped(trainer)
    path = workdir / workdir_lease.LEASE_FILENAME
    other = json.loads(path.read_text()) | {
        "host": "another-host", "pid": 1, "run": "the run that took it over",
        "started": "then", "heartbeat": time.time(), "heartbeat_utc": "just now"}
    path.write_text(json.dumps(other))
    saved = checkpoint_steps(workdir)
    trainer.send_signal(signal.SIGCONT)
    output, _ = trainer.communicate(timeout=300)
  finally:
    trainer.kill()
    trainer.wait()
  assert trainer.returncode == 1, output[-3000:]
  assert "Traceback" not in output, output[-3000:]
  assert re.fullmatch(
      rf"train\.py: error: {re.escape(str(workdir))} was taken over by the run started then on "
      r"host another-host, pid 1 \(last heartbeat just now\) while this run trained .*",
      output.strip().splitlines()[-1]), output[-3000:]
  assert saved == checkpoint_steps(workdir) == {50}  # nothing saved after the takeover
  assert json.loads(path.read_text()) == other  # the other run's lease, left in place


@pytest.mark.slow
def test_two_hosts_whose_lease_another_run_took_over_both_stop_saving_nothing_more(tmp_path):
  """The same on 2 processes joined on loopback (each with its own HOME and temporary folder):
  process 0 finds the lease taken over before the next checkpoint, and both stop there, each in
  one line, with status 1 (not process 0 alone, the other left in a collective)."""
  from multi_host_launch import cluster_env, reserved_port
  from test_multi_host_data import TOY, environment, wait_for_line
  workdir = tmp_path / "run"
  args = [sys.executable, "train.py", f"--workdir={workdir}", *TOY,
          "--config.num_train_steps=100000", "--config.log_every_steps=5",
          "--config.checkpoint_every_steps=10"]
  with reserved_port() as port, open(tmp_path / "1.out", "w+") as second_output:
    hosts = [environment() | cluster_env(port, 2, index, 1)
             | {"HOME": str(tmp_path / f"home{index}"), "TMPDIR": str(tmp_path / f"tmp{index}")}
             for index in range(2)]
    for env in hosts:
      os.makedirs(env["HOME"])
      os.makedirs(env["TMPDIR"])
    # Process 0 stops itself at step 15 (as at 55 in the test above); process 1, which cannot pass
    # it (every step is a collective of both), is stopped by the test.
    first = subprocess.Popen(args, cwd=REPO,
                             env=stopping_after_log_line(tmp_path, r"step 15/", hosts[0]),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    second = subprocess.Popen(args, cwd=REPO, env=hosts[1], stdout=second_output,
                              stderr=subprocess.STDOUT, text=True)  # a file: it cannot fill
    try:
      wait_for_line(first, r"step 15/")
      wait_until_stopped(first)
      second.send_signal(signal.SIGSTOP)
      path = workdir / workdir_lease.LEASE_FILENAME
      path.write_text(json.dumps(json.loads(path.read_text()) | {
          "host": "another-host", "pid": 1, "run": "the run that took it over",
          "started": "then", "heartbeat": time.time(), "heartbeat_utc": "just now"}))
      saved = checkpoint_steps(workdir)
      for process in (first, second):
        process.send_signal(signal.SIGCONT)
      outputs = [first.communicate(timeout=300)[0]]
      second.wait(timeout=60)
      second_output.seek(0)
      outputs.append(second_output.read())
    finally:
      for process in (first, second):
        process.kill()
        process.wait()
  for process, output in zip((first, second), outputs):
    assert process.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
  taken = (r"{workdir} was taken over by the run started then on host another-host, pid 1 "
           r"\(last heartbeat just now\) while this run trained .*").format(
               workdir=re.escape(str(workdir)))
  lines = [line for output in outputs for line in output.splitlines()
           if line.startswith("train.py: error")]
  assert re.fullmatch(rf"train\.py: error: {taken}", lines[0]), lines
  # Process 1 stops on process 0's verdict, through whichever of the two routes reaches it
  # first (the save's check of the lease, or the renewal thread's event at a step's stop
  # agreement; workdir_lease.py says why there are two); each is one line naming process 0.
  assert (re.fullmatch(rf"train\.py: error: process 0 stopped at the workdir's lease: "
                       rf"LeaseLost: {taken}", lines[1])
          or lines[1] == ("train.py: error: process 0 found the workdir's lease taken over by "
                          "another run: this run no longer owns the workdir and stopped without "
                          "saving a checkpoint")), lines
  assert saved == checkpoint_steps(workdir) == {10}
