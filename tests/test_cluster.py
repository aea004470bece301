"""Which local devices each process of a launch drives, and how many processes were launched,
from the launchers' variables as SLURM, Open MPI, GKE and a Cloud TPU VM set them. The joins
themselves, with real processes, are in test_multi_host.py."""
import os
import re
import subprocess
import sys

import pytest

from aiayn_flax.runtime import cluster
from conftest import REPO

SLURM_STEP = {"SLURM_JOB_ID": "42", "SLURM_STEP_NODELIST": "gpu[01-02]", "SLURM_NTASKS": "16",
              "SLURM_PROCID": "11", "SLURM_NODEID": "1"}


@pytest.mark.parametrize("local_rank", range(8))
def test_slurm_task_bound_to_its_gpu_drives_the_one_it_sees(local_rank):
  # srun --ntasks-per-node=8 --gpus-per-task=1: each task sees its own GPU, numbered 0.
  environ = SLURM_STEP | {"SLURM_LOCALID": str(local_rank), "SLURM_NTASKS_PER_NODE": "8",
                          "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_GPUS_PER_TASK": "1",
                          "CUDA_VISIBLE_DEVICES": str(local_rank)}
  assert cluster.local_device_ids(environ, host_gpus=8) == [0]


def test_slurm_task_bound_to_two_gpus_drives_both():
  environ = SLURM_STEP | {"SLURM_LOCALID": "3", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
                          "SLURM_GPUS_PER_TASK": "a100:2", "CUDA_VISIBLE_DEVICES": "6,7"}
  assert cluster.local_device_ids(environ, host_gpus=8) == [0, 1]


def test_slurm_tasks_bound_without_gpus_per_task_drive_what_they_see():
  # srun --gpu-bind=single:1: one GPU visible per task, more tasks than that on the node.
  environ = SLURM_STEP | {"SLURM_LOCALID": "5", "SLURM_TASKS_PER_NODE": "8(x2)",
                          "CUDA_VISIBLE_DEVICES": "5"}
  assert cluster.local_device_ids(environ, host_gpus=8) == [0]


@pytest.mark.parametrize("local_rank", range(8))
def test_slurm_tasks_sharing_a_nodes_gpus_take_one_each(local_rank):
  # srun --ntasks-per-node=8 --gpus-per-node=8: every task sees all 8.
  environ = SLURM_STEP | {"SLURM_LOCALID": str(local_rank), "SLURM_NTASKS_PER_NODE": "8",
                          "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
                          "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
  assert cluster.local_device_ids(environ, host_gpus=8) == [local_rank]


def test_slurm_tasks_sharing_gpus_without_cuda_visible_devices_count_the_hosts():
  environ = SLURM_STEP | {"SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "4,2",
                          "SLURM_NODEID": "1"}  # 2 tasks on this node, 8 GPUs: 4 each
  assert cluster.local_device_ids(environ, host_gpus=8) == [4, 5, 6, 7]


def test_one_slurm_task_per_node_drives_all_its_gpus():
  environ = SLURM_STEP | {"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
                          "SLURM_NTASKS_PER_NODE": "1", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
                          "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
  assert cluster.local_device_ids(environ, host_gpus=8) == list(range(8))
  environ.pop("CUDA_VISIBLE_DEVICES")
  assert cluster.local_device_ids(environ, host_gpus=8) == list(range(8))


def test_gpus_that_tasks_cannot_share_evenly_are_one_line_naming_the_remedy():
  environ = SLURM_STEP | {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "3",
                          "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
  with pytest.raises(ValueError, match=r"4 GPUs visible cannot be shared evenly by the 3 tasks"
                                       r".*--gpus-per-task=N.*JAX_LOCAL_DEVICE_IDS"):
    cluster.local_device_ids(environ, host_gpus=4)


@pytest.mark.parametrize("local_rank", range(4))
def test_open_mpi_ranks_sharing_a_hosts_gpus_take_one_each(local_rank):
  environ = {"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": str(4 + local_rank),
             "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
  assert cluster.local_device_ids(environ, host_gpus=4) == [local_rank]
  # A wrapper that binds each rank (CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK):
  environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)
  assert cluster.local_device_ids(environ, host_gpus=4) == [0]


def test_one_open_mpi_rank_per_host_drives_all_its_gpus():
  environ = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
  assert cluster.local_device_ids(environ, host_gpus=4) == [0, 1, 2, 3]


@pytest.mark.parametrize("environ", [
    {"TPU_WORKER_HOSTNAMES": "w-0,w-1,w-2,w-3", "TPU_WORKER_ID": "2"},  # GKE
    {},  # a Cloud TPU VM (its workers are in its metadata), or a CPU host
    {"SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2"}])  # SLURM on CPU hosts
def test_no_gpu_no_binding(environ):
  assert cluster.local_device_ids(environ, host_gpus=None) is None


def test_jax_local_device_ids_is_obeyed():
  environ = SLURM_STEP | {"SLURM_LOCALID": "3", "SLURM_NTASKS_PER_NODE": "8",
                          "JAX_LOCAL_DEVICE_IDS": "6,7"}
  assert cluster.local_device_ids(environ, host_gpus=8) == [6, 7]


@pytest.mark.parametrize("layout, node, tasks", [
    ("8(x2)", "1", 8), ("4(x2),2", "2", 2), ("3,5", "1", 5), ("2", "0", 2)])
def test_slurm_tasks_per_node_layouts(layout, node, tasks):
  environ = {"SLURM_STEP_TASKS_PER_NODE": layout, "SLURM_NODEID": node}
  assert cluster.slurm_tasks_on_this_node(environ) == tasks


# What Open MPI 5's mpirun (PRRTE, PMIx) sets in each rank: no OMPI_MCA_orte_hnp_uri.
OPEN_MPI_5 = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
              "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_UNIVERSE_SIZE": "2",
              "PMIX_NAMESPACE": "prterun-host0-12345@1",
              "PMIX_SERVER_URI41": "prterun-host0-12345@0.0;tcp4://10.0.0.1:5000"}


@pytest.mark.parametrize("launcher, environ", [
    ("Open MPI", OPEN_MPI_5 | {"OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "1"}),
    ("SLURM", SLURM_STEP | {"SLURM_LOCALID": "3"}),
    ("MPICH", {"PMI_SIZE": "2", "PMI_RANK": "1"}),
    ("a PMIx launcher", {"PMIX_RANK": "1", "PMIX_NAMESPACE": "x"}),
    ("a Kubernetes indexed Job", {"JOB_COMPLETION_INDEX": "1", "KUBERNETES_SERVICE_HOST": "h"})])
def test_launchers_jax_does_not_detect_join_through_the_coordinators_address(launcher, environ):
  count = cluster.launched_by(environ).count or 2
  assert cluster.launched_by(environ).name == launcher
  given = {"JAX_COORDINATOR_ADDRESS": "host0:1234"}
  if launcher.startswith("a "):  # the launcher does not say how many: the user does
    with pytest.raises(cluster.NotJoined, match="JAX_NUM_PROCESSES and JAX_PROCESS_ID"):
      cluster.join_arguments(environ | given, detected=1)
    given["JAX_NUM_PROCESSES"] = "2"
  assert cluster.join_arguments(environ | given, detected=1) == dict(
      num_processes=count, process_id=1 if launcher != "SLURM" else 11)


@pytest.mark.parametrize("environ, line", [
    (OPEN_MPI_5 | {"OMPI_COMM_WORLD_RANK": "0", "PMIX_RANK": "0"},
     "Open MPI started 2 processes (OMPI_COMM_WORLD_SIZE=2), and JAX cannot find their "
     "coordinator: set JAX_COORDINATOR_ADDRESS=HOST:PORT for every process (HOST: the host of "
     "rank 0, PORT: a free port there); each would otherwise train alone (docs/MULTI_HOST.md)"),
    ({"JOB_COMPLETION_INDEX": "0"},
     "a Kubernetes indexed Job started several processes (JOB_COMPLETION_INDEX=0), and JAX "
     "cannot find their coordinator: set JAX_COORDINATOR_ADDRESS=HOST:PORT for every process "
     "(HOST: the host of rank 0, PORT: a free port there) and JAX_NUM_PROCESSES (the number "
     "of processes); each would otherwise train alone (docs/MULTI_HOST.md)"),
    ({"JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "0"},
     "JAX_NUM_PROCESSES=4 is set, but no coordinator: set JAX_COORDINATOR_ADDRESS=HOST:PORT "
     "(the host of process 0, a free port) and JAX_PROCESS_ID for every process")])
def test_several_processes_that_cannot_join_stop_in_one_line_naming_the_address(environ, line):
  with pytest.raises(cluster.NotJoined) as refused:
    cluster.join_arguments(environ, detected=1)
  assert str(refused.value) == line


@pytest.mark.parametrize("environ, detected, arguments", [
    ({}, 1, None),  # a laptop
    (OPEN_MPI_5 | {"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}, 1, None),
    ({"JOB_COMPLETION_INDEX": "0", "JAX_NUM_PROCESSES": "1"}, 1, None),  # a one-pod Job
    (SLURM_STEP | {"SLURM_LOCALID": "3"}, 16, {}),  # JAX's SLURM detector joins them
    ({}, None, {}),  # a Cloud TPU VM: JAX reads its workers from the metadata
    ({"JOB_COMPLETION_INDEX": "0", "TPU_WORKER_HOSTNAMES": "w-0"}, 1, None),  # GKE, one TPU host
    ({"JOB_COMPLETION_INDEX": "1", "TPU_WORKER_HOSTNAMES": "w-0,w-1"}, 2, {}),  # GKE, two
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}, 1,
     dict(num_processes=2, process_id=1))])
def test_who_joins_and_who_runs_alone(environ, detected, arguments):
  assert cluster.join_arguments(environ, detected) == arguments


@pytest.mark.parametrize("environ, count", [
    ({}, 1),
    (SLURM_STEP | {"SLURM_LOCALID": "3"}, 16),
    ({"SLURM_JOB_ID": "42", "SLURM_NTASKS": "16"}, 1),  # the batch script, outside srun
    ({"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1", "OMPI_COMM_WORLD_SIZE": "8"}, 8),
    (OPEN_MPI_5 | {"OMPI_COMM_WORLD_RANK": "1"}, 1),  # JAX's detector reads Open MPI 4 only
    ({"TPU_WORKER_HOSTNAMES": "w-0,w-1,w-2,w-3", "TPU_WORKER_ID": "0"}, 4),
    ({"TPU_WORKER_HOSTNAMES": "w-0,w-1", "MEGASCALE_NUM_SLICES": "2"}, 4)])
def test_process_count_from_the_launchers_variables(environ, count):
  assert cluster.process_count_from_variables(environ) == count


def test_the_sbatch_script_runs_one_task_per_gpu_each_seeing_the_nodes_gpus(tmp_path):
  """scripts/slurm/train.sbatch under a stand-in srun that records what it was asked to run,
  with the variables sbatch sets from the script's #SBATCH lines."""
  (tmp_path / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$PWD" "$@" > "$SRUN_ARGS"\n')
  (tmp_path / "srun").chmod(0o755)
  environ = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(REPO),
                 SLURM_NTASKS_PER_NODE="8", SLURM_GPUS_PER_NODE="8", SLURM_CPUS_PER_TASK="8",
                 SRUN_ARGS=str(tmp_path / "args"))
  script = os.path.join(REPO, "scripts/slurm/train.sbatch")
  subprocess.run(["bash", script, "configs/big.py", "/shared/runs/big", "--config.seed=2"],
                 cwd=tmp_path, env=environ, check=True)
  assert (tmp_path / "args").read_text().splitlines() == [
      str(REPO), "--ntasks-per-node=8", "--gpus-per-node=8", "--cpus-per-task=8",
      "--kill-on-bad-exit=1", ".venv/bin/python", "train.py", "--config=configs/big.py",
      "--workdir=/shared/runs/big", "--config.seed=2"]
  refused = subprocess.run(["bash", script, "configs/big.py"], env=environ, capture_output=True,
                           text=True)
  assert refused.returncode == 2 and "usage: sbatch" in refused.stderr
  directives = re.findall(r"^#SBATCH (\S+)", open(script).read(), re.M)
  # Every GPU of the node visible to every task (NVLink for NCCL), one task per GPU.
  assert {"--ntasks-per-node=8", "--gpus-per-node=8", "--signal=TERM@300"} <= set(directives)
  assert not [d for d in directives if d.startswith("--gpus-per-task")]


@pytest.mark.parametrize("environ,maybe", [
    ({}, False), ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, True),
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, True),
    ({"PMIX_RANK": "0"}, True), ({"TPU_WORKER_HOSTNAMES": "w0,w1"}, True)])
def test_whether_a_failed_start_may_have_others_to_tell_is_read_from_variables(environ, maybe):
  # (train.py joins the others to hand them a config that failed to load only where it may.)
  assert cluster.maybe_launched_with_others(environ) is maybe


@pytest.mark.slow  # starts a Python process
def test_importing_cluster_imports_no_jax():
  # A config typo stays one line: train.py asks maybe_launched_with_others before any jax
  # (whose start logs its own lines).
  probe = subprocess.run([sys.executable, "-c", "import sys, aiayn_flax.runtime.cluster; "
                          "print('jax' in sys.modules)"], cwd=REPO, capture_output=True,
                         text=True)
  assert probe.stdout.strip() == "False", probe.stderr[-2000:]
