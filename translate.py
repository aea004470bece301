"""Translate sentences with a trained run: one output line per input line.

  echo "A man is riding a bike." | python translate.py --workdir=runs/multi30k
  python translate.py --workdir=runs/multi30k --input=in.en --output=out.de --beam_size=4

Reads stdin (interactive or piped) unless --input is given; an empty input line gives an
empty output line, so line counts always match.
"""
import os
import sys

from absl import app, flags

flags.DEFINE_string("workdir", None, "A run's directory (checkpoints, vocabulary, config).")
flags.DEFINE_string("input", None, "Input file (default: standard input).")
flags.DEFINE_string("output", None, "Output file (default: standard output).")
flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's config; 1 is greedy).")
flags.DEFINE_float("alpha", None, "Length penalty alpha (default: the run's config).")
flags.DEFINE_integer("average_last", 1, "Average the last N checkpoints' parameters.")
flags.DEFINE_integer("batch_size", None, "Sentences per decoding batch.")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def read_input() -> list[str]:
  from aiayn_flax.data import text_files
  return text_files.read_lines(FLAGS.input) if FLAGS.input else None


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  try:
    from aiayn_flax import run_dir
    from aiayn_flax.translator import Translator
    config = run_dir.load_config(FLAGS.workdir)
    model, params, _ = run_dir.load_model_and_params(FLAGS.workdir, config, FLAGS.average_last)
    vocab = run_dir.load_vocabulary(FLAGS.workdir, config)
    translator = Translator(
        model, params, vocab, beam_size=FLAGS.beam_size or config.beam_size,
        alpha=config.length_penalty_alpha if FLAGS.alpha is None else FLAGS.alpha,
        extra_length=config.decode_extra_length,
        batch_size=FLAGS.batch_size or config.decode_batch_size,
        max_positions=config.model.max_positions if config.model.positions == "learned" else None)
    lines = read_input()
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f"translate.py: error: {e}")
  out = open(FLAGS.output, "w", encoding="utf-8") if FLAGS.output else sys.stdout
  if lines is not None:
    out.writelines(t + "\n" for t in translator.translate(lines))
  elif sys.stdin.isatty():  # interactive: translate each line as it is typed
    for line in sys.stdin:
      out.write(translator.translate([line.rstrip("\n")])[0] + "\n")
      out.flush()
  else:
    out.writelines(t + "\n" for t in translator.translate(sys.stdin.read().splitlines()))
  if out is not sys.stdout:
    out.close()


if __name__ == "__main__":
  app.run(main)
