"""A trained run's workdir as evaluate.py and translate.py see it: its config, vocabulary and
(averaged) parameters, and the test sets it can be scored on.

It imports no task (aiayn_flax/tasks/): a task's own evaluation (parsing/evaluation.py) reads
a run through this module, so the caller hands in the task where one is needed.

It lies in the model layer, not in runtime/ with the workdir's other readers: it builds the
model and its parameters' shapes through train_step to restore them."""
import json
import os

import jax
import jax.numpy as jnp
import ml_collections

from aiayn_flax.runtime import checkpoints, host_agreement, paths, process_zero
from aiayn_flax import config_checks, train_step
from aiayn_flax.data import pipeline


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config the run was trained with, as saved in its latest checkpoint."""
  if not paths.workdir_path(workdir).is_dir():
    raise FileNotFoundError(f"--workdir={workdir}: no such directory")
  mngr = checkpoints.manager(workdir, read_only=True)
  try:
    newest = checkpoints.newest_readable(mngr, lambda step: checkpoints.restore_meta(mngr, step))
  finally:
    mngr.close()
  if not newest:
    raise FileNotFoundError(f"{checkpoints.checkpoint_dir(workdir)}: no checkpoint; train first "
                            f"(python train.py --config=... --workdir={workdir})")
  return ml_collections.ConfigDict(config_checks.read_saved(dict(newest[0][1]["config"])))


def load_model_and_params(workdir: str, config, average_last: int = 1,
                          step: int | None = None):
  """(model, params, steps): parameters averaged over the newest `average_last` checkpoints
  that can be read (6.1; an unreadable one is skipped with a warning naming it), or over the
  `average_last` stored checkpoints ending at `step` when it is given."""
  model = train_step.make_model(config)
  abstract = jax.eval_shape(lambda: train_step.init_params(model, 0))
  if step is None:
    params, steps = checkpoints.load_newest_params(workdir, abstract, average_last)
  else:
    params, steps = checkpoints.load_params_ending_at(workdir, abstract, step, average_last)
  # Each host lists the checkpoints itself: a stale view would decode with other parameters.
  host_agreement.check({"config": json.loads(config.to_json_best_effort(sort_keys=True)),
                        "checkpoint steps": steps})
  return model, jax.tree.map(jnp.asarray, params), steps


def load_vocabulary(workdir: str, config):
  """The run's vocabulary, read from its workdir (never trained here: no task is needed)."""
  path = paths.workdir_path(workdir) / pipeline.VOCAB_FILENAME
  if config.dataset.name != "toy_reverse" and not path.exists():
    raise FileNotFoundError(f"{path}: the run's vocabulary is missing")
  return pipeline.vocabulary_for(config, workdir, task=None)


def testset_pairs(testset: str, config, task) -> tuple[list[str], list[str]]:
  """(sources, references) of a named test set, in file order.

  "multi30k/test2016" (or test2017, test2018, test2017_mscoco, validation); "wmt14"
  (newstest2014 EN->DE); "split:NAME" for a split of the run's own dataset, read by `task`
  (tasks.for_config(config), which the caller passes). On process 0 of a
  multi-host run only (evaluate.py hands the others its lines: process_zero.read_once).
  """
  process_zero.require_process_zero(f"test set {testset}")
  if testset.startswith("multi30k/"):
    from aiayn_flax.data import multi30k
    return multi30k.read_split_pairs(testset.split("/", 1)[1])
  if testset == "wmt14":
    return newstest2014_pairs()
  if testset.startswith("split:"):
    return task.sources_and_references(config, testset.split(":", 1)[1])
  raise ValueError(f"--testset={testset!r}: expected multi30k/SPLIT, wmt14 or split:NAME")


def newstest2014_pairs() -> tuple[list[str], list[str]]:
  """newstest2014 EN->DE, the full 3003 lines: from $AIAYN_DATA_DIR/wmt14 when present, else
  tfds' wmt14_translate test split when prepared, else sacrebleu's download (online)."""
  from aiayn_flax.data import text_files
  local = os.path.join(os.environ.get("AIAYN_DATA_DIR", ""), "wmt14")
  if os.path.exists(os.path.join(local, "newstest2014.en")):
    return text_files.read_parallel_lines(os.path.join(local, "newstest2014.en"),
                                          os.path.join(local, "newstest2014.de"))
  try:
    import tensorflow_datasets as tfds
    builder = tfds.builder("wmt14_translate/de-en")
    if builder.is_prepared():
      examples = list(tfds.as_numpy(builder.as_dataset(split="test", shuffle_files=False)))
      return ([e["en"].decode("utf-8") for e in examples],
              [e["de"].decode("utf-8") for e in examples])
  except Exception:  # noqa: BLE001 - fall through to sacrebleu's download
    pass
  from sacrebleu.utils import get_source_file, get_reference_files
  return text_files.read_parallel_lines(get_source_file("wmt14/full", "en-de"),
                                        get_reference_files("wmt14/full", "en-de")[0])
