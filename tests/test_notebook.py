"""The Colab notebook runs headless from top to bottom with tiny parameters, overridden as
papermill does: a cell inserted after the one tagged `parameters`."""
import nbclient
import nbformat

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
  for name in ("NUM_STEPS", "CONFIG", "DATA_DIR", "WORKDIR", "INSTALL"):
    assert f"\n{name} = " in f"\n{parameters}", name


def test_notebook_trains_translates_draws_and_scores(shared_data, tmp_path, monkeypatch):
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  workdir = tmp_path / "run"
  # Tiny: 30 steps of 1k-token batches, in 5 bucket shapes (fewer compilations).
  overrides = dict(NUM_STEPS=30, DATA_DIR=str(shared_data), WORKDIR=str(workdir), INSTALL=False,
                   EVAL_SENTENCES=16, BEAM_SIZE=1, CONFIG_OVERRIDES={
                       "tokens_per_batch": 1024, "dataset.bucket_growth": 2.0,
                       "dataset.bucket_quantum": 8})
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
      "cross_layer2_heads.png", "encoder_layer2_heads.png"]
