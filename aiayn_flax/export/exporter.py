"""export.py's work: a run's parameters, averaged as evaluate.py averages them, written for
CTranslate2 or for transformers' Marian classes.

An export folder holds RECORD (what was exported) beside the engine's files. Writing one
replaces the folder only when it is an export (it has RECORD) or empty: any other folder, a
file, or a folder holding the run itself is refused, and nothing is removed. The new folder is
written beside it first and put in its place whole, so that an export that fails leaves the old
one as it was."""
import json
import os
import shutil
import tempfile

from aiayn_flax import run_dir
from aiayn_flax.export import to_ctranslate2, to_marian, vocabulary, weights as weights_lib

WRITERS = {"ctranslate2": to_ctranslate2.write, "marian": to_marian.write}
RECORD = "aiayn_flax_export.json"  # what was exported, beside the engine's own files


def check_format(config, output_format: str) -> None:
  """Raises ValueError, one line (export.py prints it): an unknown format, or a model the
  format cannot hold (weights.check_exportable)."""
  if output_format not in WRITERS:
    raise ValueError(f"--format={output_format}: expected one of {', '.join(WRITERS)}")
  weights_lib.check_exportable(config, output_format)


def load_run(workdir: str, average_last: int | None = None, step: int | None = None):
  """(config, model, params, steps): the parameters evaluate.py decodes with, by its defaults
  (the run's config.average_last_checkpoints newest checkpoints; `step`: the ones ending at it)."""
  config = run_dir.load_config(workdir)
  model, params, steps = run_dir.load_model_and_params(
      workdir, config, average_last or config.average_last_checkpoints, step)
  return config, model, params, steps


def check_replaceable(out: str, workdir: str) -> None:
  """Raises ValueError unless `out` is absent, an empty folder or an export (it has RECORD),
  and holds no part of the run in `workdir`."""
  out_path, run_path = os.path.realpath(out), os.path.realpath(workdir)
  if os.path.commonpath([out_path, run_path]) == out_path:
    raise ValueError(f"--out={out}: holds the run {workdir}; not replaced")
  if not os.path.lexists(out):
    return
  if not os.path.isdir(out) or os.path.islink(out):
    raise ValueError(f"--out={out}: exists and is not a folder; not replaced")
  if os.listdir(out) and not os.path.isfile(os.path.join(out, RECORD)):
    raise ValueError(f"--out={out}: a folder that is not an export (no {RECORD}); not "
                     "replaced: remove it or choose another --out")


def write_export(workdir: str, config, params, steps: list[int], output_format: str,
                 out: str) -> None:
  """The model folder `out` for `output_format`, of parameters already loaded (load_run),
  replacing an earlier export there (check_replaceable says what is refused)."""
  check_format(config, output_format)
  check_replaceable(out, workdir)
  proto = vocabulary.sentencepiece_model(workdir, config)
  parent = os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", dir=parent)
  try:
    folder = os.path.join(staging, "export")
    WRITERS[output_format](weights_lib.plain_weights(params, config), config, proto, folder)
    with open(os.path.join(folder, RECORD), "w", encoding="utf-8") as f:
      json.dump({"workdir": workdir, "format": output_format, "checkpoint_steps": steps,
                 "config": config.name, "decode_extra_length": config.decode_extra_length},
                f, indent=2)
    if os.path.lexists(out):
      shutil.rmtree(out)
    os.rename(folder, out)
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def export_run(workdir: str, output_format: str, out: str, average_last: int | None = None,
               step: int | None = None) -> list[int]:
  """Writes the model folder `out`; returns the checkpoint steps averaged (load_run's)."""
  config = run_dir.load_config(workdir)
  check_format(config, output_format)  # before reading any parameter
  check_replaceable(out, workdir)
  config, _, params, steps = load_run(workdir, average_last, step)
  write_export(workdir, config, params, steps, output_format, out)
  return steps
