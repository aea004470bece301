"""Draw a trained run's attention for one sentence, like the paper's figures 3-5.

  python visualize_attention.py --workdir=runs/multi30k --sentence="Two dogs play in the snow."
  python visualize_attention.py --workdir=DIR --sentence="..." --kind=cross --layer=0 --head=2
  python visualize_attention.py --workdir=DIR --sentence="..." --target="Zwei Hunde ..." --out=maps

The decoder is fed the model's greedy translation unless --target is given. Writes one PNG per
kind (encoder self-attention, decoder self-attention, encoder-decoder attention) of the chosen
layer, with every head in a grid or one head, and prints their paths.
"""
import os
import sys

from absl import app, flags, logging

flags.DEFINE_string("workdir", None, "A run's directory (checkpoints, vocabulary, config).")
flags.DEFINE_string("sentence", None, "The source sentence.")
flags.DEFINE_string("target", None, "Feed this translation to the decoder instead of the "
                    "model's greedy one.")
flags.DEFINE_integer("layer", -1, "Layer, counted from 0; negative counts from the last.")
flags.DEFINE_string("head", "all", "A head's index, or 'all' for every head in a grid.")
flags.DEFINE_enum("kind", "all", ["encoder", "decoder", "cross", "all"],
                  "Which attention: encoder self-, decoder self-, encoder-decoder, or all three.")
flags.DEFINE_integer("average_last", 1, "Average the last N checkpoints' parameters.")
flags.DEFINE_string("out", None, "Output folder (default: WORKDIR/attention).")
flags.DEFINE_integer("dpi", 100, "Pixels per inch of the PNGs.")
flags.mark_flags_as_required(["workdir", "sentence"])
FLAGS = flags.FLAGS


def parse_head(text: str) -> int | None:
  if text == "all":
    return None
  try:
    return int(text)
  except ValueError:
    raise ValueError(f"--head={text}: expected a head's index or 'all'") from None


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from aiayn_flax.runtime.tensorflow_setup import keep_tensorflow_off_accelerators
  keep_tensorflow_off_accelerators()  # before any tf.data work: TF must not take GPU memory
  try:
    from aiayn_flax import attention_maps, run_dir
    head = parse_head(FLAGS.head)
    config = run_dir.load_config(FLAGS.workdir)
    model, params, steps = run_dir.load_model_and_params(FLAGS.workdir, config, FLAGS.average_last)
    vocab = run_dir.load_vocabulary(FLAGS.workdir, config)
    maps = attention_maps.attention_maps(model, params, vocab, FLAGS.sentence, FLAGS.target,
                                         extra_length=config.decode_extra_length)
    logging.info("parameters of steps %s; decoder fed: %s", steps, maps.target)
    kinds = attention_maps.KINDS if FLAGS.kind == "all" else (FLAGS.kind,)
    paths = attention_maps.draw_attention_files(
        maps, FLAGS.out or os.path.join(FLAGS.workdir, "attention"), kinds, FLAGS.layer, head,
        dpi=FLAGS.dpi)
  except (FileNotFoundError, ValueError) as e:  # bad input: one line that says what to do
    sys.exit(f"visualize_attention.py: error: {e}")
  print("\n".join(paths))


if __name__ == "__main__":
  from aiayn_flax.runtime import garbage_collection
  garbage_collection.collect_less_often()  # before JAX's imports (fewer collections)
  app.run(main)
