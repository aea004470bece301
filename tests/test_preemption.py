"""Preemption on several hosts: two train.py processes joined by jax.distributed (on this
machine's loopback, one CPU device each, gloo collectives) form one data-parallel run. SIGTERM
to one of them alone (a preemption notice seldom reaches every host at the same step) must stop
both at the same step, after one collective checkpoint, with exit status 143; the same
command then resumes both to the end."""
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

from conftest import REPO

FLAGS = ["--config=configs/toy.py", "--config.log_every_steps=10",
         "--config.checkpoint_every_steps=1000", "--config.eval_every_steps=1000",
         "--config.dataset.toy_eval_examples=20", "--config.checkpoint_asynchronously=false"]
STEP_LINE = re.compile(r"step (\d+)/\d+: loss")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_pair(workdir, steps: int) -> list[subprocess.Popen]:
  port = free_port()
  processes = []
  for index in range(2):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu",
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(index), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    env.pop("XLA_FLAGS", None)  # one device per process
    processes.append(subprocess.Popen(
        [sys.executable, "train.py", f"--workdir={workdir}", *FLAGS,
         f"--config.num_train_steps={steps}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True))
  return processes


def wait_for_step(process, step: int, timeout: float = 300) -> list[str]:
  lines, deadline = [], time.time() + timeout
  while time.time() < deadline:
    if select.select([process.stdout], [], [], 5)[0]:
      line = process.stdout.readline()
      lines.append(line)
      match = STEP_LINE.search(line)
      if match and int(match.group(1)) >= step:
        return lines
      if not line:
        break
  raise AssertionError(f"step {step} not reached:\n{''.join(lines[-30:])}")


def finish(processes) -> list[str]:
  outputs = []
  for process in processes:
    output, _ = process.communicate(timeout=300)
    outputs.append(output)
  return outputs


def test_sigterm_to_one_host_stops_every_host_at_the_same_step_then_resumes(tmp_path):
  processes = start_pair(tmp_path, 100_000)
  try:
    wait_for_step(processes[0], 20)
    processes[1].send_signal(signal.SIGTERM)  # one host only
    outputs = finish(processes)
  finally:
    for process in processes:
      process.kill()
  assert [p.returncode for p in processes] == [143, 143], outputs[1][-3000:]
  stops = [re.findall(r"stopped by SIGTERM at step (\d+)", output) for output in outputs]
  assert stops[0] == stops[1] and len(stops[0]) == 1, stops
  stopped_at = int(stops[0][0])
  assert os.path.isdir(tmp_path / "checkpoints" / str(stopped_at))

  resumed = start_pair(tmp_path, stopped_at + 10)
  outputs = finish(resumed)
  assert [p.returncode for p in resumed] == [0, 0], outputs[0][-3000:]
  digests = [re.search(r"^params_digest: (\w+)$", o, re.M).group(1) for o in outputs]
  assert digests[0] == digests[1]
  assert f"Resumed from step {stopped_at}" in outputs[0]
