"""TensorFlow (there for tf.data and tfds) is kept off the accelerators, before any tf.data
work, in every entry point and in the notebook.

What this can prove without a GPU: that the function leaves TensorFlow only the CPU and still
working, that it is idempotent, and that every entry point and the notebook call it before
anything that imports tfds; with a stand-in for the tf.config of a build that sees a GPU and a
TPU, that both are hidden. What it cannot: that a GPU build of TF would really have taken the
GPU without it (that needs a GPU and TensorFlow's GPU build); the function relies on
tf.config.set_visible_devices, which TensorFlow documents for exactly this."""
import ast
import json
import re

import pytest

from conftest import REPO, run_script

ENTRY_POINTS = ["train.py", "evaluate.py", "translate.py", "visualize_attention.py"]
SETUP = "keep_tensorflow_off_accelerators"


@pytest.mark.slow
@pytest.mark.parametrize("imported_before", [False, True])
def test_tensorflow_sees_only_the_cpu_and_still_works(imported_before):
  """Called before TensorFlow is imported, it does not import it, and hides the accelerators
  the moment it is (the hook); called after, at once. Either way, twice is harmless."""
  script = (("import tensorflow\n" if imported_before else "")
            + "import sys\n"
            f"from aiayn_flax.runtime import tensorflow_setup\n"
            "hidden = []\n"
            "hide = tensorflow_setup._hide_accelerators\n"
            "tensorflow_setup._hide_accelerators = lambda tf: (hidden.append(tf.__name__), "
            "hide(tf))\n"
            f"tensorflow_setup.{SETUP}(); tensorflow_setup.{SETUP}()\n"
            "print('tensorflow' in sys.modules, hidden)\n"
            "import tensorflow as tf\n"
            "print(hidden)\n"
            "print(sorted({d.device_type for d in tf.config.get_visible_devices()}))\n"
            "print([int(x) for x in tf.data.Dataset.range(3).as_numpy_iterator()])\n")
  result = run_script("-c", script)
  assert result.returncode == 0, result.stderr[-2000:]
  first = ("True ['tensorflow', 'tensorflow']" if imported_before else "False []")
  hidden = "['tensorflow', 'tensorflow']" if imported_before else "['tensorflow']"
  assert result.stdout.splitlines() == [first, hidden, "['CPU']", "[0, 1, 2]"]


class FakeTensorFlowConfig:
  """tf.config of a TensorFlow build that sees `kinds` (GPUs, a TPU), for what no CPU-only
  build shows: which of them the hook hides, and a late call's refusal."""

  def __init__(self, kinds, initialised=False):
    self.kinds, self.initialised, self.hidden = kinds, initialised, []

  def list_physical_devices(self, kind):
    return [f"/physical_device:{kind}:0"] if kind in self.kinds else []

  def set_visible_devices(self, devices, kind):
    if self.initialised:
      raise RuntimeError("Visible devices cannot be modified after being initialized")
    self.hidden.append((kind, devices))

  def get_visible_devices(self, kind):
    return self.list_physical_devices(kind) if self.initialised else []


def test_the_hook_hides_every_accelerator_a_tensorflow_build_sees_and_refuses_too_late():
  """tensorflow-cpu sees no accelerator, so the test above passes whether or not the hook hides
  one: here a build that sees a GPU and a TPU has both hidden, and one that initialised its GPU
  already is refused in one line."""
  import types
  from aiayn_flax.runtime import tensorflow_setup
  config = FakeTensorFlowConfig({"GPU", "TPU"})
  tensorflow_setup._hide_accelerators(types.SimpleNamespace(config=config))
  assert config.hidden == [("GPU", []), ("TPU", [])]
  late = FakeTensorFlowConfig({"GPU"}, initialised=True)
  with pytest.raises(RuntimeError, match="TensorFlow initialised its GPUs before"):
    tensorflow_setup._hide_accelerators(types.SimpleNamespace(config=late))


@pytest.mark.slow
def test_a_run_whose_data_needs_no_tf_data_never_imports_tensorflow(tmp_path):
  """The toy config trains, evaluates, checkpoints and writes TensorBoard's event files
  without TensorFlow (its import is ~9 s of every start), nor sacremoses (0.2-0.35 s, a third
  of train.py's imports; only the tokenized BLEUs need it)."""
  result = run_script("-X", "importtime", "train.py", "--config=configs/toy.py",
                      "--config.num_train_steps=2", "--config.eval_every_steps=2",
                      "--config.checkpoint_every_steps=2", "--config.log_every_steps=1",
                      "--config.dataset.toy_eval_examples=4", f"--workdir={tmp_path}")
  assert result.returncode == 0, result.stderr[-2000:]
  imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
              if line.startswith("import time:")}
  assert "jax" in imported and "tensorflow" not in imported and "sacremoses" not in imported
  assert list(tmp_path.glob("events.out.tfevents.*"))


def main_statements(path):
  tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
  [main] = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
  return main.body


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_every_entry_point_calls_it_before_importing_anything_that_uses_tensorflow(path):
  calls_setup = imports_project = None
  for index, statement in enumerate(main_statements(path)):
    text = ast.unparse(statement)
    if calls_setup is None and text.startswith(f"{SETUP}("):
      calls_setup = index
    if (imports_project is None and "aiayn_flax" in text and "tensorflow_setup" not in text
        and isinstance(statement, (ast.Import, ast.ImportFrom, ast.Try))):
      imports_project = index
  assert calls_setup is not None, f"{path}: main() does not call {SETUP}()"
  assert imports_project is None or calls_setup < imports_project, path
  module_imports = [ast.unparse(node) for node in ast.parse(
      (REPO / path).read_text(encoding="utf-8")).body if isinstance(node, (ast.Import,
                                                                          ast.ImportFrom))]
  assert not [m for m in module_imports if "aiayn_flax" in m or "tensorflow" in m], path


def test_the_notebook_calls_it_before_any_cell_that_uses_the_data_pipeline():
  notebook = json.loads((REPO / "notebooks/aiayn_flax.ipynb").read_text(encoding="utf-8"))
  sources = ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]
  setup = next(i for i, source in enumerate(sources) if f"\n{SETUP}()" in f"\n{source}")
  imports = re.compile(r"^\s*(from aiayn_flax(?!\.tensorflow_setup)[\w.]* import|"
                       r"import tensorflow|from tensorflow)", re.M)
  first_import = next(i for i, source in enumerate(sources) if imports.search(source))
  assert setup <= first_import, (setup, first_import)
