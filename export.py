"""Export a trained run for the engines people serve models with (docs/EXPORT.md).

  python export.py --workdir=runs/multi30k --format=ctranslate2 --out=exported/ct2
  python export.py --workdir=runs/multi30k --format=marian --out=exported/marian
  python export.py --workdir=runs/multi30k --format=marian --out=DIR --step=3000 --average_last=3

The parameters are those evaluate.py decodes with, by the same defaults: the run's
config.average_last_checkpoints newest checkpoints averaged (--step: the ones ending at it).
A model the format cannot hold (d_k != d_v, learned positions, pre-LN for Marian) is refused in
one line naming the config field. Needs the `export` extra (pip install -e '.[export]').
"""
import sys

from absl import app, flags

from aiayn_flax.export import exporter  # the engines' packages are imported when writing

flags.DEFINE_string("workdir", None, "A run's directory (checkpoints, vocabulary, config).")
flags.DEFINE_enum("format", None, list(exporter.WRITERS), "ctranslate2: a CTranslate2 model "
                  "folder; marian: a Hugging Face MarianMTModel folder with its tokenizer.")
flags.DEFINE_string("out", None, "The model folder to write: an earlier export there is "
                    "replaced; any other folder that is not empty is refused.")
flags.DEFINE_integer("average_last", None, "Average the last N checkpoints' parameters "
                     "(default: the run's config, as evaluate.py).")
flags.DEFINE_integer("step", None, "Export the checkpoint of this step (with --average_last=K, "
                     "the K stored checkpoints ending at it) instead of the newest.")
for _name in ("workdir", "format", "out"):
  flags.mark_flag_as_required(_name)
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    steps = exporter.export_run(FLAGS.workdir, FLAGS.format, FLAGS.out, FLAGS.average_last,
                                FLAGS.step)
  except ModuleNotFoundError as e:  # the extra is not installed
    sys.exit(f"export.py: error: {e}; install the exporters: pip install -e '.[export]' "
             "-c requirements.lock --extra-index-url https://download.pytorch.org/whl/cpu "
             "(docs/INSTALL.md)")
  except (FileNotFoundError, ValueError) as e:  # a refusal or bad input: one line
    sys.exit(f"export.py: error: {e}")
  print(f"export.py: wrote {FLAGS.out} ({FLAGS.format}; parameters of steps {steps})")


if __name__ == "__main__":
  app.run(main)
