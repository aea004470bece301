"""Decoding speed of a trained run: sentences/s and target tokens/s, greedy and beam 4.

  python bench/decode_speed.py --workdir=runs/multi30k [--batch_sizes=64] [--max_sentences=0]

For each test set (Multi30k test2016, and newstest2014's English source when the data folder
has it) and each batch size, translates the whole set once to compile, then times a second
pass. Prints one line per (test set, batch size, beam) and the beam-4 / greedy time ratio.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from aiayn_flax import run_dir  # noqa: E402
from aiayn_flax.translator import Translator  # noqa: E402

flags.DEFINE_string("workdir", "runs/multi30k", "A trained run.")
flags.DEFINE_list("batch_sizes", ["64"], "Decoding batch sizes to time.")
flags.DEFINE_list("testsets", ["multi30k/test2016", "wmt14"], "Test sets (evaluate.py names).")
flags.DEFINE_integer("max_sentences", 0, "Use only the first N sentences of each set (0: all).")
FLAGS = flags.FLAGS


def timed_translation(translator, sentences) -> tuple[float, list[str]]:
  translator.translate(sentences)  # compile every shape first
  start = time.perf_counter()
  outputs = translator.translate(sentences)
  return time.perf_counter() - start, outputs


def main(argv):
  del argv
  config = run_dir.load_config(FLAGS.workdir)
  model, params, steps = run_dir.load_model_and_params(FLAGS.workdir, config, 1)
  vocab = run_dir.load_vocabulary(FLAGS.workdir, config)
  print(f"workdir: {FLAGS.workdir} (step {steps[-1]})")
  for testset in FLAGS.testsets:
    try:
      sources, _ = run_dir.testset_pairs(testset, config)
    except Exception as e:  # noqa: BLE001 - e.g. newstest2014 offline without the data folder
      print(f"{testset}: skipped ({e})")
      continue
    sources = sources[:FLAGS.max_sentences or None]
    for batch_size in map(int, FLAGS.batch_sizes):
      seconds = {}
      for beam_size in (1, 4):
        translator = Translator(model, params, vocab, beam_size=beam_size,
                                alpha=config.length_penalty_alpha,
                                extra_length=config.decode_extra_length, batch_size=batch_size)
        seconds[beam_size], outputs = timed_translation(translator, sources)
        tokens = sum(len(ids) + 1 for ids in vocab.encode_batch(outputs))  # + EOS
        print(f"{testset} batch={batch_size} beam={beam_size}: {len(sources)} sentences in "
              f"{seconds[beam_size]:.1f}s = {len(sources) / seconds[beam_size]:.1f} sentences/s, "
              f"{tokens / seconds[beam_size]:.0f} target tokens/s")
      print(f"{testset} batch={batch_size}: beam 4 / greedy time = {seconds[4] / seconds[1]:.2f}")


if __name__ == "__main__":
  app.run(main)
