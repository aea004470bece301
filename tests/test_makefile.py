"""The Makefile: it refuses a Python older than 3.11 in one line naming the fix, and `make
quickstart` installs and trains for the accelerator the host has (faked here through the
environment: a TPU VM's TPU_ACCELERATOR_TYPE, an nvidia-smi on the PATH)."""
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make(*args, env):
  return subprocess.run(["make", *args], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=60)


def executable(path, text):
  path.write_text(text)
  path.chmod(0o755)
  return path


def host_env(tmp_path, accelerator: str) -> dict:
  """The environment of a host with `accelerator` (tpu, gpu or cpu): no TPU variable, and a
  PATH whose only nvidia-smi is a fake one that lists a GPU (gpu) or none at all."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for tool in ("sh", "make", "python3", "env"):  # what make and its recipes call
    os.symlink(shutil.which(tool), bin_dir / tool)
  # Not the variables of a `make test` around this test: a nested make would say make[1].
  env = {k: v for k, v in os.environ.items()
         if k not in ("TPU_ACCELERATOR_TYPE", "ACCELERATOR", "MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
  env["PATH"] = str(bin_dir)
  if accelerator == "gpu":
    executable(bin_dir / "nvidia-smi", "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3'\n")
  if accelerator == "tpu":
    env["TPU_ACCELERATOR_TYPE"] = "v4-8"
  return env


def test_make_refuses_a_python_older_than_3_11_in_one_line(tmp_path):
  python310 = executable(tmp_path / "python3.10", "#!/bin/sh\necho 3.10\n")  # prints its version
  venv = tmp_path / "venv"
  result = make("quickstart", f"PYTHON={python310}", f"VENV={venv}",
                env=host_env(tmp_path, "cpu"))
  assert result.returncode != 0
  ours = [line for line in result.stderr.splitlines() if not line.startswith("make: ***")]
  assert ours == [f"make: {python310} is Python 3.10; aiayn_flax needs Python >= 3.11: make "
                  "PYTHON=python3.11, or get one with uv (curl -LsSf "
                  "https://astral.sh/uv/install.sh | sh; uv python install 3.11; make "
                  "PYTHON=$(uv python find 3.11)), docs/INSTALL.md"]
  assert not venv.exists()


@pytest.mark.parametrize("accelerator,extra,platform", [("cpu", "'.'", "cpu"),
                                                        ("gpu", "'.[cuda12]'", "cuda"),
                                                        ("tpu", "'.[tpu]'", "tpu")])
def test_quickstart_installs_and_trains_for_the_accelerator_the_host_has(
    tmp_path, accelerator, extra, platform):
  # -n: the commands make would run, none run.
  result = make("-n", "quickstart", f"VENV={tmp_path / 'venv'}",
                env=host_env(tmp_path, accelerator))
  assert result.returncode == 0, result.stderr
  assert f"-m pip install -q -e {extra} -c requirements.lock" in result.stdout
  assert "aot" not in result.stdout  # the deviceless compilers are the tests' extra
  assert (f"make quickstart: training on the {accelerator} (JAX_PLATFORMS={platform})"
          in result.stdout)


def test_the_tests_install_the_compilers_and_run_on_the_cpu(tmp_path):
  result = make("-n", "test", f"VENV={tmp_path / 'venv'}", env=host_env(tmp_path, "gpu"))
  assert "-m pip install -q -e '.[dev,aot,export]' -c requirements.lock" in result.stdout
  # The tests force the CPU even on a GPU host, one worker per core unless told otherwise.
  assert ("JAX_PLATFORMS=cpu " + f"{tmp_path / 'venv'}/bin/python -m pytest tests -n auto "
          "--dist loadfile") in result.stdout


@pytest.mark.parametrize("target", ["test", "test-fast"])
def test_test_workers_and_tests_choose_the_workers_and_the_files(tmp_path, target):
  result = make("-n", target, f"VENV={tmp_path / 'venv'}", "TEST_WORKERS=3",
                "TESTS=tests/test_model.py", env=host_env(tmp_path, "cpu"))
  assert result.returncode == 0, result.stderr
  assert "-m pytest tests/test_model.py " in result.stdout
  assert " -n 3 --dist loadfile" in result.stdout and "-n auto" not in result.stdout


@pytest.mark.parametrize("accelerator,user_tunables,expected", [
    ("cpu", None, "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "),
    ("cpu", "glibc.malloc.arena_max=2", "GLIBC_TUNABLES=glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1 "),
    ("cpu", "glibc.malloc.hugetlb=0", ""),  # the user's own choice stands
    ("gpu", None, ""),  # nothing measured a gain on an accelerator
    ("tpu", None, "")])
def test_quickstart_starts_malloc_on_huge_pages_on_the_cpu_only(
    tmp_path, accelerator, user_tunables, expected):
  """The setting is the environment's, given by the command line make prints, not a restart of
  the entry points (aiayn_flax/runtime/huge_pages.py)."""
  env = host_env(tmp_path, accelerator)
  env.pop("GLIBC_TUNABLES", None)
  if user_tunables:
    env["GLIBC_TUNABLES"] = user_tunables
  result = make("-n", "quickstart", f"VENV={tmp_path / 'venv'}", env=env)
  assert result.returncode == 0, result.stderr
  commands = [line for line in result.stdout.splitlines() if " train.py " in line or
              " evaluate.py " in line]
  assert len(commands) == 3
  for command in commands:
    assert command.startswith(f"{expected}{tmp_path / 'venv'}/bin/python "), command


@pytest.mark.parametrize("host", ["cpu", "gpu"])
def test_install_accelerator_gpu_installs_the_cuda_extra_and_trains_nothing(tmp_path, host):
  """A SLURM login node has no GPU: `make install ACCELERATOR=gpu` there installs what the GPU
  nodes' jobs run, and neither trains nor scores (docs/MULTI_HOST.md)."""
  result = make("-n", "install", "ACCELERATOR=gpu", f"VENV={tmp_path / 'venv'}",
                env=host_env(tmp_path, host))
  assert result.returncode == 0, result.stderr
  assert "-m pip install -q -e '.[cuda12]' -c requirements.lock" in result.stdout
  assert "aot" not in result.stdout
  assert " train.py " not in result.stdout and " evaluate.py " not in result.stdout
  assert "make install: .venv has the gpu install" in result.stdout
