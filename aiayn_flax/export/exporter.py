"""export.py's work: a run's parameters, averaged as evaluate.py averages them, written for
CTranslate2 or for transformers' Marian classes."""
import json
import os

from aiayn_flax import run_dir
from aiayn_flax.export import to_ctranslate2, to_marian, vocabulary, weights as weights_lib

WRITERS = {"ctranslate2": to_ctranslate2.write, "marian": to_marian.write}
RECORD = "aiayn_flax_export.json"  # what was exported, beside the engine's own files


def export_run(workdir: str, output_format: str, out: str, average_last: int | None = None,
               step: int | None = None) -> list[int]:
  """Writes the model folder `out`; returns the checkpoint steps averaged. The defaults are
  evaluate.py's: the run's config.average_last_checkpoints newest checkpoints."""
  config = run_dir.load_config(workdir)
  weights_lib.check_exportable(config, output_format)  # before reading any parameter
  proto = vocabulary.sentencepiece_model(workdir, config)
  _, params, steps = run_dir.load_model_and_params(
      workdir, config, average_last or config.average_last_checkpoints, step)
  WRITERS[output_format](weights_lib.plain_weights(params, config), config, proto, out)
  with open(os.path.join(out, RECORD), "w", encoding="utf-8") as f:
    json.dump({"workdir": workdir, "format": output_format, "checkpoint_steps": steps,
               "config": config.name, "decode_extra_length": config.decode_extra_length},
              f, indent=2)
  return steps
