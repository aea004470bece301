"""Several hosts on one machine: N copies of a command joined into one JAX cluster over
loopback (jax.distributed, gloo collectives on the CPU), D simulated devices each.

    results = launch(["train.py", "--config=configs/toy.py", ...], num_processes=2,
                     devices_per_process=DEVICES_PER_HOST)
    results[i].returncode, results[i].stdout, results[i].stderr

The coordinator's port is chosen by the OS (bind to port 0) and held by this process until the
cluster has ended, with SO_REUSEPORT so that process 0's coordinator (gRPC, which sets it too)
can listen on it meanwhile: no other program can be handed that port between our choice and
the coordinator's bind.
"""
import contextlib
import os
import random
import socket
import subprocess
import sys
import tempfile

from conftest import REPO

CLUSTER_SITE = REPO / "tests" / "cluster_site"
# Simulated CPU devices per host in the tests that train on several hosts. Two, not more: the
# gradient sum over gloo costs about 4 ms per array (71 for the toy model) with 8 devices on 2
# cores and about 1 ms with 4, so a toy step takes 0.28 s on 2 hosts x 4 devices and 0.08 s on
# 2 x 2 (docs/lab_notes/TESTS.md). With two, each host still sums over its own devices before
# it sums across hosts.
DEVICES_PER_HOST = 2


@contextlib.contextmanager
def reserved_port(within: range | None = None):
  """A free TCP port (the OS's choice, or one of `within`, tried in random order), kept bound
  (not listening) while the block runs."""
  with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    for port in random.sample(within, len(within)) if within else [0]:
      if port and not _nobody_holds(port):  # a port someone else bound with SO_REUSEPORT too
        continue
      try:
        s.bind(("::", port))
        break
      except OSError:
        if port == 0:
          raise
    else:
      raise OSError(f"no free port in {within}")
    yield s.getsockname()[1]


def _nobody_holds(port: int) -> bool:
  with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
    try:
      probe.bind(("::", port))
      return True
    except OSError:
      return False


def cluster_env(port: int, num_processes: int, process_id: int, devices: int) -> dict:
  """The variables that make one process of the cluster (what a launcher such as SLURM or a
  TPU VM's metadata provides on real hosts)."""
  return {"JAX_PLATFORMS": "cpu", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
          "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
          "JAX_NUM_PROCESSES": str(num_processes), "JAX_PROCESS_ID": str(process_id),
          # A collective whose peer died fails after this long instead of hanging the test.
          "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} "
                       "--xla_cpu_collective_call_terminate_timeout_seconds=300",
          "TF_CPP_MIN_LOG_LEVEL": "2",
          "PYTHONPATH": pythonpath_with_cluster_site()}


def pythonpath_with_cluster_site() -> str:
  """PYTHONPATH for a process of a test cluster: processes 1.. load the programs process 0
  compiled from the compilation cache, as on a TPU or GPU cluster (cluster_site/). And this
  clone: cluster_site imports aiayn_flax before Python puts the script's folder on the path, so
  without it a clone whose venv was installed from another clone ran that clone's code."""
  return os.pathsep.join(filter(None, [str(CLUSTER_SITE), str(REPO),
                                       os.environ.get("PYTHONPATH")]))


def launch(args: list[str], num_processes: int, devices_per_process: int,
           env: dict | None = None, process_env: dict[int, dict] | None = None,
           timeout: float = 600) -> list[subprocess.CompletedProcess]:
  """Runs `python *args` (from the repository root) as processes 0..num_processes-1 of one
  cluster and waits for all of them. `env` is added to every process's environment,
  `process_env[i]` to process i's only; a variable given as None is removed. A timeout kills
  them all and raises with their output's tails."""
  if num_processes == 1:  # one process alone: no coordinator, as a laptop or one host runs
    base = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}")
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
      base.pop(name, None)
    return _run_all([[sys.executable, *args]],
                    [_without_none(base | (env or {}) | (process_env or {}).get(0, {}))], timeout)
  with reserved_port() as port:
    envs = [_without_none(dict(os.environ)
                          | cluster_env(port, num_processes, i, devices_per_process)
                          | (env or {}) | (process_env or {}).get(i, {}))
            for i in range(num_processes)]
    return _run_all([[sys.executable, *args]] * num_processes, envs, timeout)


def _without_none(env: dict) -> dict:
  return {name: value for name, value in env.items() if value is not None}


def _run_all(commands, envs, timeout) -> list[subprocess.CompletedProcess]:
  with tempfile.TemporaryDirectory(prefix="multi_host_") as logs:
    processes, files = [], []
    for i, (command, env) in enumerate(zip(commands, envs)):
      out = open(os.path.join(logs, f"{i}.out"), "w+")  # files, not pipes: no pipe can fill up
      err = open(os.path.join(logs, f"{i}.err"), "w+")
      files.append((out, err))
      processes.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=err,
                                        text=True))
    try:
      for process in processes:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      for process in processes:
        process.kill()
        process.wait()
      raise AssertionError("cluster timed out:\n" + "\n".join(
          f"--- process {i} ---\n{_read(err)[-3000:]}" for i, (_, err) in enumerate(files)))
    results = [subprocess.CompletedProcess(command, process.returncode, _read(out), _read(err))
               for command, process, (out, err) in zip(commands, processes, files)]
    for out, err in files:
      out.close()
      err.close()
    return results


def _read(file) -> str:
  file.flush()
  file.seek(0)
  return file.read()
