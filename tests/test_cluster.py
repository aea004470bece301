"""Which local devices each process of a launch drives, and how many processes were launched,
from the launchers' variables as SLURM, Open MPI, GKE and a Cloud TPU VM set them. The joins
themselves, with real processes, are in test_multi_host.py."""
import os
import re
import subprocess

import pytest

from aiayn_flax import cluster
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


@pytest.mark.parametrize("environ, count", [
    ({}, 1),
    ({"JAX_NUM_PROCESSES": "4"}, 4),
    (SLURM_STEP | {"SLURM_LOCALID": "3"}, 16),
    ({"SLURM_JOB_ID": "42", "SLURM_NTASKS": "16"}, 1),  # the batch script, outside srun
    ({"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1", "OMPI_COMM_WORLD_SIZE": "8"}, 8),
    ({"TPU_WORKER_HOSTNAMES": "w-0,w-1,w-2,w-3", "TPU_WORKER_ID": "0"}, 4),
    ({"TPU_WORKER_HOSTNAMES": "w-0,w-1", "MEGASCALE_NUM_SLICES": "2"}, 4)])
def test_process_count_from_the_launchers_variables(environ, count):
  assert cluster.process_count_from_variables(environ) == count


def test_the_sbatch_script_runs_one_task_per_gpu_with_the_clones_python(tmp_path):
  """scripts/slurm/train.sbatch under a stand-in srun that records what it was asked to run,
  with the variables sbatch sets from the script's #SBATCH lines."""
  (tmp_path / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$PWD" "$@" > "$SRUN_ARGS"\n')
  (tmp_path / "srun").chmod(0o755)
  environ = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(REPO),
                 SLURM_NTASKS_PER_NODE="8", SLURM_GPUS_PER_TASK="1", SLURM_CPUS_PER_TASK="8",
                 SRUN_ARGS=str(tmp_path / "args"))
  script = os.path.join(REPO, "scripts/slurm/train.sbatch")
  subprocess.run(["bash", script, "configs/big.py", "/shared/runs/big", "--config.seed=2"],
                 cwd=tmp_path, env=environ, check=True)
  assert (tmp_path / "args").read_text().splitlines() == [
      str(REPO), "--ntasks-per-node=8", "--gpus-per-task=1", "--cpus-per-task=8",
      "--kill-on-bad-exit=1", ".venv/bin/python", "train.py", "--config=configs/big.py",
      "--workdir=/shared/runs/big", "--config.seed=2"]
  refused = subprocess.run(["bash", script, "configs/big.py"], env=environ, capture_output=True,
                           text=True)
  assert refused.returncode == 2 and "usage: sbatch" in refused.stderr
  directives = re.findall(r"^#SBATCH (\S+)", open(script).read(), re.M)
  assert "--gpus-per-task=1" in directives and "--signal=TERM@300" in directives
