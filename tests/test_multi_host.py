"""Several hosts: train.py as 2 processes joined by jax.distributed (loopback, gloo), 2 simulated
CPU devices each, against the same flags on 1 process with 4 devices. Parameters that no host
holds whole (FSDP across hosts, a `model` axis spanning hosts) must train to the end, and to the
same parameters as on one process."""
import os
import re

import jax
import numpy as np
import pytest

from aiayn_flax.runtime import checkpoints
from aiayn_flax import train_step
from configs import toy
from conftest import TOY_ONE_LAYER
from multi_host_launch import DEVICES_PER_HOST, launch, reserved_port

STEPS = 10
FLAGS = ["train.py", "--config=configs/toy.py", TOY_ONE_LAYER,
         f"--config.num_train_steps={STEPS}",
         "--config.log_every_steps=5", "--config.checkpoint_every_steps=1000",
         # No evaluation (about 11 s a launch across two hosts): these tests read parameters.
         "--config.eval_every_steps=0", "--config.dataset.toy_eval_examples=10",
         "--config.model.dropout_rate=0.1", "--config.label_smoothing=0.1",
         # See multi_device_check.py: Adam's eps 1e-9 turns the last bits of a tiny gradient,
         # which depend on the order of the cross-device sums (gloo across processes, XLA's
         # own within one), into whole learning-rate steps of that parameter.
         "--config.adam_eps=1e-6"]
# A `model` axis of all 4 devices, across the 2 hosts (the toy's 4 heads and 20 tokens split).
MODEL_AXIS_FLAGS = ["--config.mesh=data:1,model:4"]


# Joins (or not) as train.py does, then says what it sees.
JOIN = ["-c", "import jax; from aiayn_flax.runtime import cluster; "
              "cluster.initialize_distributed(); "
              "print('joined', jax.distributed.is_initialized(), 'process', jax.process_index(), "
              "'of', jax.process_count(), 'devices', jax.device_count())"]
# The same, logging at INFO (the local device ids asked for), with JAX's private cluster
# detectors made unimportable for us (JAX keeps its own reference) where the test says so.
JOIN_LOGGED = ["-c", "import sys; from absl import logging; logging.set_verbosity('info'); "
                     "import jax; import jax._src\n"
                     "if sys.argv[1:] == ['moved']:\n"
                     "  sys.modules['jax._src.clusters'] = None; del jax._src.clusters\n"
                     + JOIN[1]]
NO_EXPLICIT_COORDINATOR = {"JAX_COORDINATOR_ADDRESS": None, "JAX_NUM_PROCESSES": None,
                           "JAX_PROCESS_ID": None}


def digest_of(result) -> str:
  assert result.returncode == 0, result.stderr[-3000:]
  return re.search(r"^params_digest: ([0-9a-f]{64})$", result.stdout, re.M).group(1)


def final_params(workdir):
  config = toy.get_config()
  config.model.num_layers = 1  # TOY_ONE_LAYER
  model = train_step.make_model(config)
  shapes = jax.eval_shape(lambda: train_step.create_train_state(config, model).params)
  return checkpoints.load_params(str(workdir), shapes, [STEPS])


def assert_trains_as_on_one_process(workdir_two, two, workdir_one, one):
  for index, result in enumerate(two):
    assert f"process {index} of 2, local devices 2, global devices 4" in result.stderr
  assert digest_of(two[0]) == digest_of(two[1])  # both hosts finished with the same params
  digest_of(one)
  # The same parameters up to the rounding of sums taken in another order.
  worst = max(float(np.max(np.abs(a - b)))
              for a, b in zip(jax.tree.leaves(final_params(workdir_two)),
                              jax.tree.leaves(final_params(workdir_one))))
  print(f"largest parameter difference, 2 x 2 devices vs 1 x 4: {worst:.2e}")
  assert worst < 1e-5


FSDP = ["--config.fsdp=True"]


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
  """FSDP over 2 hosts x 2 devices, each host building only its own rows (the default), and
  the same flags on 1 process x 4 devices: launched once for the two tests below."""
  root = tmp_path_factory.mktemp("fsdp")
  two = launch([*FLAGS, *FSDP, f"--workdir={root / 'two'}"], 2, DEVICES_PER_HOST)
  one = launch([*FLAGS, *FSDP, f"--workdir={root / 'one'}"], 1, 2 * DEVICES_PER_HOST)[0]
  return root, two, one


@pytest.mark.slow
def test_fsdp_across_hosts_trains_to_the_end_as_on_one_process(fsdp_runs):
  root, two, one = fsdp_runs
  assert_trains_as_on_one_process(root / "two", two, root / "one", one)


LOSS = re.compile(r"step (\d+)/\d+: loss ([0-9.]+)")


@pytest.mark.slow
def test_hosts_building_only_their_own_rows_train_as_hosts_building_every_row(fsdp_runs,
                                                                               tmp_path):
  """Each of 2 hosts builds half of every batch (config.host_local_batches, the default): the
  parameters are bit for bit those of hosts that each build every row, and the loss curve
  (summed over the hosts' rows) is the one process's."""
  _, own, one = fsdp_runs
  every = launch([*FLAGS, *FSDP, "--config.host_local_batches=False",
                  f"--workdir={tmp_path / 'every'}"], 2, DEVICES_PER_HOST)
  assert digest_of(own[0]) == digest_of(own[1]) == digest_of(every[0])
  curves = [[(int(step), float(loss)) for step, loss in LOSS.findall(result.stderr)]
            for result in (own[0], every[0], one)]
  assert [step for step, _ in curves[0]] == [5, 10]
  assert curves[0] == curves[1]
  # (logged to 3 decimals; the sums of 2 processes and of 1 differ in their last bits)
  np.testing.assert_allclose([loss for _, loss in curves[0]], [loss for _, loss in curves[2]],
                             atol=1.5e-3)
  tokens = [re.findall(r"\| ([0-9]+)/([0-9]+) real tokens/step", result.stderr)
            for result in (own[0], one)]
  assert tokens[0] == tokens[1] != []  # each host's counts, summed: the whole batch's


@pytest.mark.slow
def test_model_axis_spanning_hosts_trains_to_the_end_as_on_one_process(tmp_path):
  two = launch([*FLAGS, *MODEL_AXIS_FLAGS, f"--workdir={tmp_path / 'two'}"], 2,
               DEVICES_PER_HOST)
  one = launch([*FLAGS, *MODEL_AXIS_FLAGS, f"--workdir={tmp_path / 'one'}"], 1,
               2 * DEVICES_PER_HOST)[0]
  assert_trains_as_on_one_process(tmp_path / "two", two, tmp_path / "one", one)


@pytest.mark.slow
def test_processes_join_through_jax_cluster_detection():
  """Open MPI's variables (as mpirun sets them), no JAX_* ones: JAX's detector finds the
  cluster (the coordinator's port given by JAX_COORDINATOR_PORT, held until it is used). Both
  ranks see the host's 2 GPUs: each asks for its own."""
  with reserved_port() as port:
    results = launch([*JOIN_LOGGED, "present"], 2, 1, env=NO_EXPLICIT_COORDINATOR | {
        "JAX_COORDINATOR_PORT": str(port), "OMPI_MCA_orte_hnp_uri": "1.0;tcp://127.0.0.1:1",
        "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "CUDA_VISIBLE_DEVICES": "0,1"}, process_env={
            i: {"OMPI_COMM_WORLD_RANK": str(i), "OMPI_COMM_WORLD_LOCAL_RANK": str(i)}
            for i in range(2)})
  for index, result in enumerate(results):
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"joined True process {index} of 2 devices 2" in result.stdout
    assert re.findall(r"local device ids asked for: (.*)", result.stderr) == [str(index)]


@pytest.mark.slow
@pytest.mark.parametrize("cluster", [
    {},  # a laptop, one host
    {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "1",
     "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}])  # a one-task SLURM job
@pytest.mark.parametrize("jax_detection", ["present", "moved"])
def test_one_process_alone_starts_no_coordinator(cluster, jax_detection):
  [result] = launch([*JOIN_LOGGED, jax_detection], 1, 2, env=cluster)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "joined False process 0 of 1 devices 2" in result.stdout
  assert ("is not where it was" in result.stderr) == (jax_detection == "moved")


@pytest.mark.slow
@pytest.mark.parametrize("jax_detection", ["present", "moved"])
def test_srun_tasks_bound_to_one_gpu_each_join_and_ask_for_the_gpu_they_see(tmp_path,
                                                                           jax_detection):
  """`srun --ntasks-per-node=2 --gpus-per-task=1` on one node: each task sees its own GPU as
  CUDA_VISIBLE_DEVICES=<k>, numbered 0 inside the task (JAX's own guess, the local rank, asks
  task 1 for a GPU 1 it does not have). JAX's SLURM detector finds the coordinator at the first
  node of the step and port SLURM_JOB_ID % 4096 + 61440 (a free one, reserved until used); each
  task has its own HOME and TMPDIR. With JAX's detectors moved, the launcher's variables say
  that there are 2 tasks, in one warning line."""
  with reserved_port(within=range(61440, 65536)) as port:
    job_id = 4096 * 300 + port - 61440
    slurm = {"SLURM_JOB_ID": str(job_id), "SLURM_STEP_NODELIST": "localhost",
             "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_NTASKS": "2",
             "SLURM_NTASKS_PER_NODE": "2", "SLURM_STEP_TASKS_PER_NODE": "2",
             "SLURM_TASKS_PER_NODE": "2", "SLURM_GPUS_PER_TASK": "1"}
    homes = {i: {"HOME": str(tmp_path / f"home{i}"), "TMPDIR": str(tmp_path / f"tmp{i}")}
             for i in range(2)}
    for dirs in homes.values():
      for folder in dirs.values():
        os.makedirs(folder)
    results = launch([*JOIN_LOGGED, jax_detection], 2, 2, env=NO_EXPLICIT_COORDINATOR | slurm,
                     process_env={i: homes[i] | {"SLURM_PROCID": str(i), "SLURM_LOCALID": str(i),
                                                 "CUDA_VISIBLE_DEVICES": str(i)}
                                  for i in range(2)})
  for index, result in enumerate(results):
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"joined True process {index} of 2 devices 4" in result.stdout
    assert re.findall(r"local device ids asked for: (.*)", result.stderr) == ["0"]
    moved = re.findall(r"cluster detection \(jax._src.clusters\) is not where it was.*",
                       result.stderr)
    assert len(moved) == (jax_detection == "moved")


@pytest.mark.slow
def test_open_mpi_5_ranks_join_through_the_coordinators_address_or_all_stop_in_one_line(
    tmp_path):
  """What Open MPI 5's mpirun sets (OMPI_COMM_WORLD_*, PMIX_*; no OMPI_MCA_orte_hnp_uri, which
  JAX's detector reads): with JAX_COORDINATOR_ADDRESS given (`mpirun -x`), the 2 ranks join as
  one run; without it, train.py stops on both ranks in one line naming it, instead of each
  training alone as "process 0 of 1"."""
  open_mpi_5 = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                "OMPI_UNIVERSE_SIZE": "2", "PMIX_NAMESPACE": "prterun-localhost-4242@1",
                "OMPI_MCA_orte_hnp_uri": None}
  ranks = {i: {"OMPI_COMM_WORLD_RANK": str(i), "OMPI_COMM_WORLD_LOCAL_RANK": str(i),
               "PMIX_RANK": str(i)} for i in range(2)}
  joined = launch([*JOIN_LOGGED, "present"], 2, 2, process_env=ranks, env=open_mpi_5 | {
      "JAX_NUM_PROCESSES": None, "JAX_PROCESS_ID": None})  # the address alone, as -x gives it
  for index, result in enumerate(joined):
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"joined True process {index} of 2 devices 4" in result.stdout
  alone = launch([*FLAGS, f"--workdir={tmp_path}"], 2, 2, process_env=ranks,
                 env=open_mpi_5 | NO_EXPLICIT_COORDINATOR)
  for result in alone:
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "train.py: error: Open MPI started 2 processes (OMPI_COMM_WORLD_SIZE=2), and JAX cannot "
        "find their coordinator: set JAX_COORDINATOR_ADDRESS=HOST:PORT for every process (HOST: "
        "the host of rank 0, PORT: a free port there); each would otherwise train alone "
        "(docs/MULTI_HOST.md)")
    assert "process 0 of 1" not in result.stderr
  assert not tmp_path.joinpath("checkpoints").exists()


# Joins, then hides JAX's private distributed module from process_zero (as a JAX release that
# moved it would), and has process 0 fail at a piece of work the others wait for.
VERDICT_BY_BROADCAST = ["-c", JOIN[1] + "\n" + "\n".join([
    "import sys, jax._src",
    "from aiayn_flax.runtime import process_zero",  # (jax's multihost_utils imports it too)
    "sys.modules['jax._src.distributed'] = None; del jax._src.distributed",
    "print('read', process_zero.first('a file', lambda: 'made', lambda: 'read'))",
    "def make(): raise FileNotFoundError('corpus.en: no such file')",
    "try: process_zero.first('the corpus', make, lambda: 'read')",
    "except Exception as e: print('stopped:', type(e).__name__, e)"])]


# Both processes gather an array of length argv[1], process 0 a second after process 1: process
# 1 reaches the gather's programs first.
FRESH_PROGRAMS = ["-c", JOIN[1] + "\n" + "\n".join([
    "import sys, time, jax.numpy as jnp",
    "from jax.experimental import multihost_utils",
    "multihost_utils.sync_global_devices('start')",
    "time.sleep(1 if jax.process_index() == 0 else 0)",
    "rows = multihost_utils.process_allgather(jnp.full(int(sys.argv[1]), jax.process_index()))",
    "print('gathered', rows.sum(axis=1).tolist())"])]


@pytest.mark.slow
@pytest.mark.parametrize("own_cache", [False, True])
def test_the_other_processes_load_what_process_0_compiles_rather_than_compile_it_again(
    own_cache, tmp_path):
  """The test clusters' start-up (tests/cluster_site/sitecustomize.py): the gather's program,
  which spans the processes, is compiled by process 0 alone; process 1, there first, waits and
  reads its cache entry (or, were it the later one after all, finds the entry). A process 1
  with a cache folder of its own compiles the program itself, without waiting for process 0's
  compile."""
  length = 1237
  # A cache folder of the test's own, empty: none of the programs is there yet.
  results = launch([*FRESH_PROGRAMS, str(length)], 2, 1,
                   env={"JAX_DEBUG_LOG_MODULES": "jax._src.compiler",
                        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "shared")},
                   process_env={1: {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "own")}}
                   if own_cache else None)
  for result in results:
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"gathered [0, {length}]" in result.stdout
  loaded = re.compile(r"jit__identity_fn: read the entry process 0 compiled|"
                      r"Persistent compilation cache hit for 'jit__identity_fn'")
  elsewhere = "jit__identity_fn: process 0 writes to another cache folder"
  assert not loaded.search(results[0].stderr), results[0].stderr[-3000:]
  assert bool(loaded.search(results[1].stderr)) != own_cache, results[1].stderr[-3000:]
  assert (elsewhere in results[1].stderr) == own_cache, results[1].stderr[-3000:]


@pytest.mark.slow
def test_process_zeros_verdict_reaches_every_process_without_jaxs_private_client():
  results = launch(VERDICT_BY_BROADCAST, 2, 1)
  for index, result in enumerate(results):
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("read made" if index == 0 else "read read") in result.stdout
    assert ("stopped: FileNotFoundError corpus.en: no such file" if index == 0 else
            "stopped: ProcessZeroFailed process 0 stopped at the corpus: FileNotFoundError: "
            "corpus.en: no such file") in result.stdout
  assert "jax._src.distributed) is not where it was" in results[1].stderr
