"""The Colab notebook runs headless from top to bottom with tiny parameters, overridden as
papermill does: a cell inserted after the one tagged `parameters`. Its install decision (first
cell) is checked for each runtime without running pip."""
import pathlib
import stat
import sys

import nbclient
import nbformat
import pytest

from conftest import REPO

NOTEBOOK = REPO / "notebooks" / "aiayn_flax.ipynb"


def parameters_cell_index(notebook) -> int:
  tagged = [i for i, cell in enumerate(notebook.cells)
            if "parameters" in cell.get("metadata", {}).get("tags", [])]
  assert len(tagged) == 1, "exactly one cell should be tagged 'parameters'"
  return tagged[0]


def test_notebook_is_stored_without_outputs():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(notebook)
  for cell in notebook.cells:
    if cell.cell_type == "code":
      assert not cell.outputs and cell.execution_count is None, cell.source[:80]
  parameters = notebook.cells[parameters_cell_index(notebook)].source
  for name in ("NUM_STEPS", "CONFIG", "DATA_DIR", "WORKDIR", "INSTALL", "BEAM_SIZE"):
    assert f"\n{name} = " in f"\n{parameters}", name


def first_cell_namespace() -> dict:
  """The names the notebook's first cell defines (the REPO form field and the install decision)."""
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  first = next(cell for cell in notebook.cells if cell.cell_type == "code")
  assert '\nREPO = "https://github.com/' in first.source and '# @param {type:"string"}' in \
      first.source, first.source[:200]
  namespace = {}
  exec(compile(first.source, "first cell", "exec"), namespace)  # pylint: disable=exec-used
  return namespace


PY = "/usr/bin/python3"
URL = "https://example.org/aiayn_flax.git"


@pytest.mark.parametrize("runtime, extra", [("tpu", "[tpu]"), ("gpu", "[cuda12]"), ("cpu", "")])
def test_install_in_a_checkout_takes_the_runtimes_extra_with_the_lock(runtime, extra):
  install_commands = first_cell_namespace()["install_commands"]
  checkout = pathlib.Path("/src/aiayn_flax")
  assert install_commands(runtime, checkout, URL, PY, tensorflow_installed=False) == (checkout, [
      [PY, "-m", "pip", "install", "-q", "-e", f"/src/aiayn_flax{extra}",
       "-c", "/src/aiayn_flax/requirements.lock"]])


@pytest.mark.parametrize("runtime, extra", [("tpu", "[tpu]"), ("gpu", "[cuda12]"), ("cpu", "")])
def test_install_outside_a_checkout_clones_and_replaces_colabs_tensorflow(runtime, extra,
                                                                          tmp_path, monkeypatch):
  install_commands = first_cell_namespace()["install_commands"]
  monkeypatch.chdir(tmp_path)
  clone = tmp_path / "aiayn_flax"
  assert install_commands(runtime, None, URL, PY, tensorflow_installed=True) == (clone, [
      ["git", "clone", "--depth=1", URL, f"{clone}"],
      [PY, "-m", "pip", "uninstall", "-q", "-y", "tensorflow"],
      [PY, "-m", "pip", "install", "-q", "-e", f"{clone}{extra}",
       "-c", f"{clone}/requirements.lock"]])


@pytest.mark.parametrize("runtime, accelerator, target", [
    ("tpu", "", "tpu-v5e-1"), ("tpu", "v5litepod-1", "tpu-v5e-1"), ("tpu", "v6e-1", None),
    ("gpu", "Tesla T4", "gpu-t4x1"), ("gpu", "NVIDIA L4", "gpu-l4x1"),
    ("gpu", "NVIDIA A100-SXM4-40GB", "gpu-a100x1"), ("gpu", "NVIDIA H100 80GB HBM3", "gpu-h100x1"),
    ("gpu", "NVIDIA L40S", None), ("cpu", "", None)])
def test_dry_run_target_for_each_runtime(runtime, accelerator, target):
  assert first_cell_namespace()["dry_run_target"](runtime, accelerator) == target


class NoAccelDevices:
  """glob as on a machine without /dev/accel* or /dev/vfio/N."""

  @staticmethod
  def glob(pattern):
    del pattern
    return []


def test_detect_runtime_reads_tpu_variables_and_nvidia_smi(tmp_path, monkeypatch):
  namespace = first_cell_namespace()
  namespace["glob"] = NoAccelDevices
  detect_runtime = namespace["detect_runtime"]
  for name in ("TPU_ACCELERATOR_TYPE", "COLAB_TPU_ADDR"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
  assert detect_runtime() == ("cpu", "")
  nvidia_smi = tmp_path / "nvidia-smi"
  nvidia_smi.write_text("#!/bin/sh\n[ \"$*\" = '--query-gpu=name --format=csv,noheader' ] && "
                        "printf 'Tesla T4\\nTesla T4\\n'\n")
  nvidia_smi.chmod(nvidia_smi.stat().st_mode | stat.S_IEXEC)
  assert detect_runtime() == ("gpu", "Tesla T4")
  monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
  assert detect_runtime() == ("tpu", "v5litepod-1")


def test_find_checkout_from_the_notebooks_folder(tmp_path):
  find_checkout = first_cell_namespace()["find_checkout"]
  assert find_checkout(NOTEBOOK.parent) == REPO
  assert find_checkout(tmp_path) is None


def test_notebook_trains_translates_draws_and_scores(shared_data, tmp_path, monkeypatch):
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  workdir = tmp_path / "run"
  # Tiny: 30 steps of 1k-token batches, in one bucket shape of 48 (one compilation of each
  # program), of a small model with a 1000-piece vocabulary learnt from 2,000 sentences (the
  # quick start's takes a minute to train and compile).
  overrides = dict(NUM_STEPS=30, DATA_DIR=str(shared_data), WORKDIR=str(workdir), INSTALL=False,
                   EVAL_SENTENCES=16, BEAM_SIZE=1, CONFIG_OVERRIDES={
                       "tokens_per_batch": 1024, "dataset.max_length": 48,
                       "dataset.bucket_min_length": 48, "model.vocab_size": 1000,
                       "model.d_model": 64, "model.d_ff": 256, "model.num_layers": 2,
                       "dataset.vocab_sample_sentences": 2000})
  notebook.cells.insert(parameters_cell_index(notebook) + 1, nbformat.v4.new_code_cell(
      "\n".join(f"{name} = {value!r}" for name, value in overrides.items()),
      metadata={"tags": ["injected-parameters"]}))
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
  # Started in notebooks/, as Jupyter would: the notebook finds the checkout's root itself.
  client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": str(NOTEBOOK.parent)}})
  try:
    client.execute()
  finally:
    nbformat.write(notebook, tmp_path / "executed.ipynb")  # to read when it fails
  last_output = "".join(output.get("text", "") for output in notebook.cells[-1].outputs)
  assert "multi30k/test2016 sacreBLEU" in last_output and "on 16 sentences after 30 steps" in \
      last_output, last_output
  assert (workdir / "training_curves.png").stat().st_size > 0
  assert sorted(p.name for p in (workdir / "attention").iterdir()) == [
      "cross_layer1_heads.png", "encoder_layer1_heads.png"]


def tagged_cell(tag: str) -> str:
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  [source] = [cell.source for cell in notebook.cells
              if tag in cell.get("metadata", {}).get("tags", [])]
  return source


@pytest.mark.parametrize("num_steps, expected", [(0, 100_000), (None, 100_000), (30, 30)])
def test_the_config_chosen_keeps_its_own_steps_unless_num_steps_is_set(num_steps, expected,
                                                                       monkeypatch):
  """Choosing configs/base.py trains base's 100k steps; NUM_STEPS=N trains N."""
  monkeypatch.chdir(REPO)
  namespace = dict(CONFIG="configs/base.py", NUM_STEPS=num_steps, CONFIG_OVERRIDES={},
                   EVAL_SENTENCES=0)
  exec(compile(tagged_cell("configuration"), "configuration cell", "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["config"].num_train_steps == expected


def test_the_stored_parameters_keep_the_configs_own_steps():
  namespace = {}
  exec(compile(tagged_cell("parameters"), "parameters cell", "exec"), namespace)  # pylint: disable=exec-used
  assert not namespace["NUM_STEPS"]


@pytest.mark.parametrize("workdir, storage", [
    ("/content/drive/MyDrive/aiayn/base", "drive"), ("gs://bucket/base", "gcs"),
    ("runs/multi30k_notebook", "local"), ("/content/runs/base", "local")])
def test_workdir_storage(workdir, storage):
  assert first_cell_namespace()["workdir_storage"](workdir) == storage


class FakeColab:
  """google.colab's drive and auth, recording what the storage cell asks of them."""

  def __init__(self):
    self.calls = []
    self.drive = type("drive", (), {"mount": lambda path: self.calls.append(("mount", path))})
    self.auth = type("auth", (), {"authenticate_user": lambda: self.calls.append(("auth",))})


@pytest.mark.parametrize("workdir, calls", [
    ("/content/drive/MyDrive/aiayn/base", [("mount", "/content/drive")]),
    ("gs://bucket/base", [("auth",)]), ("runs/multi30k_notebook", [])])
def test_the_storage_cell_mounts_drive_or_authenticates_only_when_the_workdir_asks(
    workdir, calls, monkeypatch):
  colab = FakeColab()
  google = type(sys)("google")
  google.colab = type(sys)("google.colab")
  google.colab.drive, google.colab.auth = colab.drive, colab.auth
  monkeypatch.setitem(sys.modules, "google", google)
  monkeypatch.setitem(sys.modules, "google.colab", google.colab)
  namespace = first_cell_namespace() | {"WORKDIR": workdir}
  exec(compile(tagged_cell("storage"), "storage cell", "exec"), namespace)  # pylint: disable=exec-used
  assert colab.calls == calls


def test_the_notebook_says_what_it_was_run_on():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  text = " ".join(notebook.cells[0].source.split())
  assert "What this notebook has been run on:** the CPU only, headless, by " \
         "`tests/test_notebook.py`" in text
  assert "not been run on Colab, on a GPU or TPU runtime" in text
