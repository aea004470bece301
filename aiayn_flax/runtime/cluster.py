"""Joining the other processes of a run, and which of this host's devices this process drives.

Launchers start one process per host (a Cloud TPU pod slice, GKE, one SLURM task per node) or
one per GPU (`srun --gpus-per-task=1`, `srun --ntasks-per-node=8 --gpus-per-node=8`, `mpirun`
with a rank per GPU). `initialize_distributed` joins them before anything touches a device,
handing `jax.distributed.initialize()` the local devices that `local_device_ids` works out from
the launcher's variables. JAX's own guess, when a launcher is detected and nothing is given, is
"the device numbered like my local rank": right when every task sees all the host's GPUs, wrong
when each task is bound to its own GPU (it sees one, numbered 0: local ranks 1-7 ask for devices
they do not have) and when one task drives a whole node (it would take GPU 0 only).

Whether several processes were launched is read from JAX's cluster detectors (a private module,
the only one this project reads, behind `launched_process_count`); should it move, the
variables they read are read instead, with a one-line warning. Launchers JAX does not detect
(Open MPI 5, PMIx, MPICH, a Kubernetes indexed Job) are read from their public variables
(`launched_by`): they join through JAX_COORDINATOR_ADDRESS, or every process stops in one line
asking for it, rather than each training alone as "process 0 of 1".
"""
import dataclasses
import glob
import os
import re
from collections.abc import Mapping

from absl import logging


class NotJoined(ValueError):
  """A launcher started several processes that cannot find each other: every one stops."""


def initialize_distributed() -> None:
  """Joins this process to the others of its run, before anything touches a device, and logs
  the local devices asked for, then `process i of n, local devices d, global devices D`.
  NotJoined (one line, on every process alike) where a launcher started several processes
  and no coordinator can be known: each would otherwise train alone, as "process 0 of 1".

  See `join_arguments` for where the processes, this one's rank and the coordinator come
  from. A launcher that started one process (a one-host TPU VM, a one-task SLURM job) is not
  joined: one process needs no coordinator, and joining would let JAX's SLURM detector hide
  all but one local GPU from it."""
  import jax  # here: a failed start asks `maybe_launched_with_others` without importing jax
  arguments = join_arguments(os.environ, launched_process_count())
  if arguments is not None:
    # The trainer agrees on stops itself, for SIGTERM and SIGINT alike (runtime/stops.py):
    # JAX's preemption service would install its own SIGTERM handler beside ours.
    jax.config.update("jax_enable_preemption_service", False)
    device_ids = local_device_ids(os.environ, host_gpu_count())
    logging.info("local device ids asked for: %s", "all (no GPU to bind)" if device_ids is None
                 else ",".join(map(str, device_ids)))
    jax.distributed.initialize(**arguments, local_device_ids=device_ids)
  logging.info("process %d of %d, local devices %d, global devices %d", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())


def join_arguments(environ: Mapping[str, str], detected: int | None) -> dict | None:
  """The arguments of jax.distributed.initialize() for this process ({}: JAX detects them
  all), or None where it runs alone. `detected` is what JAX's own detectors count
  (`launched_process_count`: 1 where none applies, None on a TPU VM only JAX can count).

  JAX_COORDINATOR_ADDRESS (which JAX reads itself) with JAX_NUM_PROCESSES and JAX_PROCESS_ID
  are used as given; where those two are unset, the launcher's public variables give them
  (`launched_by`: Open MPI 4 and 5, PMIx, MPICH, SLURM; a Kubernetes indexed Job's pod index).
  Otherwise JAX's detectors join a Cloud TPU VM's workers (metadata: one slice or multislice),
  GKE's TPU pods, SLURM and Open MPI 4 by themselves. A launcher they do not know (Open MPI 5
  no longer sets the OMPI_MCA_orte_hnp_uri that JAX reads; a Kubernetes Job without the
  `kubernetes` package) that started several processes: NotJoined, naming the variables to
  set, as each process would otherwise train alone."""
  address = environ.get("JAX_COORDINATOR_ADDRESS")
  launch = launched_by(environ)
  count = int(environ["JAX_NUM_PROCESSES"]) if environ.get("JAX_NUM_PROCESSES") else (
      launch.count if launch else None)
  rank = int(environ["JAX_PROCESS_ID"]) if environ.get("JAX_PROCESS_ID") else (
      launch.rank if launch else None)
  if count == 1:
    return None
  if address and None not in (count, rank):
    return dict(num_processes=count, process_id=rank)
  if detected is None or detected > 1:
    return {}  # JAX's detectors find the rest (the coordinator too, unless it is given)
  if address:
    raise NotJoined(f"JAX_COORDINATOR_ADDRESS={address} is set, but not how many processes "
                    "there are and which one this is: set JAX_NUM_PROCESSES and "
                    "JAX_PROCESS_ID too")
  if launch and (launch.count is None or launch.count > 1 or (launch.rank or 0) > 0):
    started = "several processes" if launch.count is None else f"{launch.count} processes"
    count_too = "" if launch.count else " and JAX_NUM_PROCESSES (the number of processes)"
    raise NotJoined(f"{launch.name} started {started} ({launch.variables}), and JAX cannot "
                    "find their coordinator: set JAX_COORDINATOR_ADDRESS=HOST:PORT for every "
                    f"process (HOST: the host of rank 0, PORT: a free port there){count_too}; "
                    "each would otherwise train alone (docs/MULTI_HOST.md)")
  if count and count > 1:
    raise NotJoined(f"JAX_NUM_PROCESSES={count} is set, but no coordinator: set "
                    "JAX_COORDINATOR_ADDRESS=HOST:PORT (the host of process 0, a free port) "
                    "and JAX_PROCESS_ID for every process")
  return None


def maybe_launched_with_others(environ: Mapping[str, str]) -> bool:
  """Whether this process may be one of several of a run (so that `initialize_distributed`
  would join it to others), read from the variables alone, without importing jax: JAX's own,
  a launcher's (`launched_by`), or those JAX's detectors read (a Cloud TPU VM: maybe)."""
  return bool(environ.get("JAX_COORDINATOR_ADDRESS") or environ.get("JAX_NUM_PROCESSES")
              or launched_by(environ) or process_count_from_variables(environ) != 1)


@dataclasses.dataclass(frozen=True)
class Launch:
  """What a launcher's own variables say about this process."""
  name: str  # "Open MPI", ...
  count: int | None  # how many processes it started; None where its variables do not say
  rank: int | None  # this process's rank among them
  variables: str  # the variables read, as NAME=value, for messages


def inside_srun(environ: Mapping[str, str]) -> bool:
  """Whether srun started this process (the variables JAX's SLURM detector reads as well)."""
  return all(name in environ for name in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS",
                                          "SLURM_PROCID", "SLURM_LOCALID"))


def launched_by(environ: Mapping[str, str]) -> Launch | None:
  """The launcher that started this process, from its public variables, or None where none
  did: SLURM's srun (SLURM_NTASKS, SLURM_PROCID), Open MPI 4 and 5 (OMPI_COMM_WORLD_SIZE,
  OMPI_COMM_WORLD_RANK), MPICH and Intel MPI (PMI_SIZE, PMI_RANK), any PMIx launcher
  (PMIX_RANK: no count), a Kubernetes indexed Job (JOB_COMPLETION_INDEX: its count, the Job's
  completions, is JAX_NUM_PROCESSES, which the user passes)."""
  def read(name, count_variable, rank_variable):
    shown = count_variable or rank_variable  # the same line on every process where it can
    return Launch(name, int(environ[count_variable]) if count_variable else None,
                  int(environ.get(rank_variable, "0")), f"{shown}={environ[shown]}")
  if inside_srun(environ):
    return read("SLURM", "SLURM_NTASKS", "SLURM_PROCID")
  if environ.get("OMPI_COMM_WORLD_SIZE"):
    return read("Open MPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")
  if environ.get("PMI_SIZE"):
    return read("MPICH", "PMI_SIZE", "PMI_RANK")
  if environ.get("PMIX_RANK"):
    return read("a PMIx launcher", None, "PMIX_RANK")
  # (GKE's TPU pods, indexed Jobs too, are JAX's to count: from TPU_WORKER_HOSTNAMES.)
  if environ.get("JOB_COMPLETION_INDEX") and not environ.get("TPU_WORKER_HOSTNAMES"):
    return read("a Kubernetes indexed Job", None, "JOB_COMPLETION_INDEX")
  return None


def local_device_ids(environ: Mapping[str, str], host_gpus: int | None) -> list[int] | None:
  """The GPUs (numbered as this process sees them) that this process should drive, or None
  where there is no GPU to choose (a TPU, a CPU: JAX then restricts nothing that matters).

  `host_gpus` is the number of GPUs on the host (`host_gpu_count()`), used where
  CUDA_VISIBLE_DEVICES is unset. JAX_LOCAL_DEVICE_IDS ("0,1") is obeyed as JAX obeys it.
  Otherwise the GPUs this process sees are shared among the launcher's tasks on this host
  (SLURM_LOCALID of SLURM's count for this node; OMPI_COMM_WORLD_LOCAL_RANK of
  OMPI_COMM_WORLD_LOCAL_SIZE), each taking an equal, consecutive share; unless the task was
  bound to its own GPUs (SLURM_GPUS_PER_TASK of them visible, or fewer GPUs visible than tasks
  on the host), when it takes all it sees."""
  if environ.get("JAX_LOCAL_DEVICE_IDS"):
    return [int(i) for i in environ["JAX_LOCAL_DEVICE_IDS"].split(",")]
  visible = environ.get("CUDA_VISIBLE_DEVICES")
  # CUDA numbers the devices it lets through 0, 1, ...: "3,5" are this process's GPUs 0 and 1.
  gpus = len([d for d in visible.split(",") if d.strip()]) if visible is not None else host_gpus
  if not gpus:
    return None
  local_rank, tasks_here = _local_rank_and_tasks(environ)
  per_task = environ.get("SLURM_GPUS_PER_TASK", "")
  bound = gpus < tasks_here or (re.fullmatch(r"(?:.*:)?\d+", per_task) is not None
                                and int(per_task.rsplit(":", 1)[-1]) == gpus)
  if bound:
    return list(range(gpus))
  if gpus % tasks_here:
    raise ValueError(f"{gpus} GPUs visible cannot be shared evenly by the {tasks_here} tasks on "
                     "this host: bind each task to its GPUs (srun --gpus-per-task=N) or set "
                     "JAX_LOCAL_DEVICE_IDS")
  share = gpus // tasks_here
  return list(range(local_rank * share, (local_rank + 1) * share))


def _local_rank_and_tasks(environ: Mapping[str, str]) -> tuple[int, int]:
  """(this process's rank among the launcher's tasks on this host, their number)."""
  if "SLURM_LOCALID" in environ:
    return int(environ["SLURM_LOCALID"]), slurm_tasks_on_this_node(environ)
  if "OMPI_COMM_WORLD_LOCAL_RANK" in environ:
    return (int(environ["OMPI_COMM_WORLD_LOCAL_RANK"]),
            int(environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")))
  return 0, 1


def slurm_tasks_on_this_node(environ: Mapping[str, str]) -> int:
  """The number of tasks SLURM started on this node: from the step's (or the job's) tasks per
  node, "8(x2),4" meaning 8 on each of the first two nodes and 4 on the third, indexed by
  SLURM_NODEID; else --ntasks-per-node (SLURM_NTASKS_PER_NODE); else 1."""
  layout = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
  if layout:
    per_node = []
    for part in layout.split(","):
      count, _, repeat = re.fullmatch(r"(\d+)(\(x(\d+)\))?", part.strip()).groups()
      per_node += [int(count)] * int(repeat or 1)
    return per_node[min(int(environ.get("SLURM_NODEID", "0")), len(per_node) - 1)]
  return int(environ.get("SLURM_NTASKS_PER_NODE", "1"))


def host_gpu_count() -> int | None:
  """The NVIDIA GPUs this host has (its /dev/nvidia0, /dev/nvidia1, ... device files), or None
  where it has none (a TPU VM, a CPU host, macOS)."""
  return len(glob.glob("/dev/nvidia[0-9]*")) or None


def launched_process_count() -> int | None:
  """How many processes the launcher started (1 where there is no launcher), as
  `jax.distributed.initialize()` would find them; None where only JAX can tell (a Cloud TPU VM
  whose workers are listed in its metadata, with JAX's detectors gone)."""
  try:
    # The detectors jax.distributed.initialize() itself uses; private, hence this one place.
    from jax._src import clusters
    detected = next((env for env in clusters.ClusterEnv._cluster_types
                     if not env.opt_in_only_method and env.is_env_present()), None)
    return 1 if detected is None else detected.get_process_count()
  except (ImportError, AttributeError) as e:
    logging.warning("JAX's cluster detection (jax._src.clusters) is not where it was (%s): "
                    "counting processes from the launchers' variables instead", e)
    return process_count_from_variables(os.environ)


def process_count_from_variables(environ: Mapping[str, str]) -> int | None:
  """How many processes JAX's own detectors would find, from the variables they read (1 where
  none applies); None on a Cloud TPU VM without them (its workers are listed in its metadata
  only). (`launched_by` reads the launchers JAX does not know.)"""
  if inside_srun(environ):
    return int(environ["SLURM_NTASKS"])
  if environ.get("OMPI_MCA_orte_hnp_uri") and environ.get("OMPI_COMM_WORLD_SIZE"):
    return int(environ["OMPI_COMM_WORLD_SIZE"])  # Open MPI 4 (JAX's detector: not 5)
  workers = environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES")
  if workers:  # GKE: this slice's workers, times the slices of a multislice job
    return len(workers.split(",")) * int(environ.get("MEGASCALE_NUM_SLICES", "1"))
  if glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"):
    return None  # a Cloud TPU VM: one worker or several, its metadata says
  return 1
