"""The tasks (aiayn_flax/tasks/) and the shared code that calls them: the data layer, the dry
run, evaluate.py and translate.py import nothing of parsing/ (read from their imports), the token
cache is keyed by every field that changes the ids, and the evaluation size's old name stops a
run with the new one."""
import ast
import pathlib

import pytest

from aiayn_flax import config_checks, tasks
from conftest import run_script

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = (sorted((REPO / "aiayn_flax" / "data").glob("*.py"))
          + sorted((REPO / "aiayn_flax" / "decoding").glob("*.py"))
          + [REPO / "aiayn_flax" / name for name in (
              "planning/compiled_plan.py", "planning/fit.py", "planning/run_plan.py",
              "training/trainer.py", "translator.py", "run_dir.py")]
          + [REPO / "evaluate.py", REPO / "translate.py", REPO / "train.py"])


def imported_modules(path: pathlib.Path) -> set[str]:
  """Every module a file imports, at the top or inside a function: `import a.b` gives a.b,
  `from a import b` gives a and a.b."""
  modules = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      modules |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      modules |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
  return modules


@pytest.mark.parametrize("path", SHARED, ids=lambda p: str(p.relative_to(REPO)))
def test_shared_code_imports_nothing_of_parsing(path):
  parsing = {m for m in imported_modules(path)
             if m == "aiayn_flax.parsing" or m.startswith("aiayn_flax.parsing.")}
  assert not parsing, f"{path.name} imports {sorted(parsing)}"


def test_the_data_layer_does_not_call_up_to_the_tasks():
  """data/ is handed a task; it imports no task (and so nothing a task imports)."""
  data = sorted((REPO / "aiayn_flax" / "data").glob("*.py"))
  assert len(data) >= 10
  for path in data:
    upward = {m for m in imported_modules(path)
              if m.startswith(("aiayn_flax.tasks", "aiayn_flax.parsing", "aiayn_flax.training"))}
    assert not upward, f"{path.name} imports {sorted(upward)}"


def test_imports_are_read_from_functions_too(tmp_path):
  """The check above sees an import inside a function (as data/pipeline.py once had)."""
  path = tmp_path / "example.py"
  path.write_text("def f():\n  from aiayn_flax import tasks\n  import aiayn_flax.parsing.evalb\n")
  assert {"aiayn_flax.tasks", "aiayn_flax.parsing.evalb"} <= imported_modules(path)


def test_each_dataset_has_its_task_and_the_constraint_follows_the_config():
  from configs import multi30k, parsing_sample, toy
  assert isinstance(tasks.for_config(multi30k.get_config()), tasks.Translation)
  assert isinstance(tasks.for_config(toy.get_config()), tasks.ToyReversal)
  config = parsing_sample.get_config()
  task = tasks.for_config(config)
  assert isinstance(task, tasks.Parsing) and task.leaves == "words" and task.constrained
  assert task.stand_in_decoding_constraint(64) is not None
  config.decode_constrained = False
  assert tasks.for_config(config).stand_in_decoding_constraint(64) is None
  assert tasks.for_config(toy.get_config()).validation_sentences(toy.get_config()) > 0


def test_token_cache_is_rebuilt_when_tree_leaves_change(shared_data, tmp_path):
  """The target ids of a parsing split depend on config.dataset.tree_leaves (XX or the words)
  and on the treebank read: both are in the cache's key, so changing one tokenizes again
  instead of reading ids of the other setting."""
  from aiayn_flax.data import pipeline, tokenized
  from configs import parsing_sample
  config = parsing_sample.get_config()
  task = tasks.for_config(config)
  vocab = pipeline.vocabulary_for(config, str(tmp_path), task)
  words = tokenized.split_ids(config, vocab, "test", task)
  config.dataset.tree_leaves = "XX"
  xx_task = tasks.for_config(config)
  placeholder = tokenized.split_ids(config, vocab, "test", xx_task)
  fresh = tokenized.tokenize_split(config, vocab, "test", xx_task)
  assert placeholder.targets.flat.tolist() == fresh.targets.flat.tolist()
  assert placeholder.targets.flat.tolist() != words.targets.flat.tolist()
  assert placeholder.sources.flat.tolist() == words.sources.flat.tolist()  # the same sentences
  assert len(list((tmp_path / tokenized.TOKENIZED_DIRNAME).glob("*.npz"))) == 2
  keys = {tokenized._cache_path_and_key(config, vocab, "test", xx_task)[1]}
  config.dataset.treebank_dir = "/elsewhere/wsj"
  keys.add(tokenized._cache_path_and_key(config, vocab, "test", tasks.for_config(config))[1])
  assert len(keys) == 2


@pytest.mark.slow  # starts train.py
def test_the_old_name_of_the_evaluation_size_stops_a_run_naming_the_new_one(tmp_path):
  from configs import toy
  config = toy.get_config()
  config.eval_bleu_sentences = 4
  with pytest.raises(ValueError, match="eval_bleu_sentences was renamed "
                     "config.eval_decode_sentences"):
    config_checks.check_config(config)
  result = run_script("train.py", "--config=configs/toy.py", f"--workdir={tmp_path}",
                      "--config.eval_bleu_sentences=4")
  assert result.returncode != 0
  assert ("train.py: error: --config.eval_bleu_sentences=4: config.eval_bleu_sentences was "
          "renamed config.eval_decode_sentences") in result.stderr
