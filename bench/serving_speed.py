"""Serving speed on the CPU, side by side in one process: our translate.py path (the
Translator), CTranslate2 float32 and int8, and transformers' generate float32, on a trained run
exported by export.py (docs/EXPORT.md).

  python bench/serving_speed.py --workdir=runs/multi30k [--testsets=multi30k/test2016,wmt14]
      [--batch_sizes=64,1] [--beams=1,4] [--max_sentences=0] [--latency_sentences=100]

For each test set, batch size and beam, each engine translates the set once untimed (our
compiles, their caches), then once timed: sentences/s and sacreBLEU. Batch 1 is latency: the
first --latency_sentences sentences one call each, sentences/s and the median milliseconds per
sentence. The engines take their own threads (all the cores); run it alone on the machine.
Each engine is told our length limit per batch (its longest source + EOS + 50), not per
sentence: what a user would set. Beam 4: ours with GNMT's penalty, theirs with length**0.6.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

flags.DEFINE_string("workdir", "runs/multi30k", "A trained run.")
flags.DEFINE_string("out", None, "The exported folders (default: WORKDIR/export; written when "
                    "missing).")
flags.DEFINE_list("testsets", ["multi30k/test2016", "wmt14"], "Test sets (evaluate.py names).")
flags.DEFINE_list("batch_sizes", ["64", "1"], "Sentences per call.")
flags.DEFINE_list("beams", ["1", "4"], "Beam sizes.")
flags.DEFINE_list("engines", ["ours", "ctranslate2 f32", "ctranslate2 int8", "generate f32"],
                  "Which to time.")
flags.DEFINE_integer("max_sentences", 0, "Only the first N sentences of each set (0: all).")
flags.DEFINE_integer("latency_sentences", 100, "Sentences timed one by one at batch 1.")
flags.DEFINE_integer("step", None, "The checkpoints ending at this step (default: the newest; "
                     "pin it while the run still trains).")
FLAGS = flags.FLAGS


def engines_of(config, model, params, vocab, folders):
  """name -> translate(sentences, beam, batch_size) for each engine asked for."""
  from aiayn_flax.export import engines
  from aiayn_flax.translator import Translator
  translators = {}

  def ours(sentences, beam, batch_size):
    key = (beam, batch_size)
    if key not in translators:
      translators[key] = Translator(model, params, vocab, beam_size=beam,
                                    alpha=config.length_penalty_alpha,
                                    extra_length=config.decode_extra_length,
                                    batch_size=batch_size)
    return translators[key].translate(sentences)

  made = {"ours": lambda: ours}
  made["ctranslate2 f32"] = lambda: engines.CTranslate2Engine(folders["ctranslate2"]).translate
  made["ctranslate2 int8"] = lambda: engines.CTranslate2Engine(
      folders["ctranslate2"], compute_type="int8").translate
  made["generate f32"] = lambda: engines.MarianEngine(folders["marian"]).translate
  built = {name: made[name]() for name in FLAGS.engines}
  return {name: (translate if name == "ours" else
                 (lambda translate: lambda s, beam, batch_size: translate(
                     s, beam_size=beam, batch_size=batch_size, exact_limits=False))(translate))
          for name, translate in built.items()}


def main(argv):
  del argv
  from aiayn_flax import run_dir, scoring, tasks
  from aiayn_flax.export import exporter
  config = run_dir.load_config(FLAGS.workdir)
  out = FLAGS.out or os.path.join(FLAGS.workdir, "export")
  folders = {f: os.path.join(out, f) for f in exporter.WRITERS}
  for output_format, folder in folders.items():
    if not os.path.exists(os.path.join(folder, exporter.RECORD)):
      exporter.export_run(FLAGS.workdir, output_format, folder, step=FLAGS.step)
  model, params, steps = run_dir.load_model_and_params(FLAGS.workdir, config,
                                                       config.average_last_checkpoints,
                                                       FLAGS.step)
  vocab = run_dir.load_vocabulary(FLAGS.workdir, config)
  engines = engines_of(config, model, params, vocab, folders)
  print(f"parameters of steps {steps}; {os.cpu_count()} CPU cores")
  print("| test set | batch | beam | engine | sentences/s | ms/sentence | sacreBLEU |")
  print("|---|---|---|---|---|---|---|")
  for testset in FLAGS.testsets:
    sources, references = run_dir.testset_pairs(testset, config, tasks.for_config(config))
    if FLAGS.max_sentences:
      sources, references = sources[:FLAGS.max_sentences], references[:FLAGS.max_sentences]
    for batch_size in map(int, FLAGS.batch_sizes):
      for beam in map(int, FLAGS.beams):
        for name, translate in engines.items():
          if batch_size == 1:
            subset = sources[:FLAGS.latency_sentences]
            for sentence in subset:  # untimed: compiles each padded length ours meets
              translate([sentence], beam, 1)
            seconds = []
            for sentence in subset:
              start = time.perf_counter()
              translate([sentence], beam, 1)
              seconds.append(time.perf_counter() - start)
            rate, latency, bleu = len(subset) / sum(seconds), statistics.median(seconds), ""
          else:
            translate(sources, beam, batch_size)  # untimed: compiles
            start = time.perf_counter()
            hyps = translate(sources, beam, batch_size)
            elapsed = time.perf_counter() - start
            rate, latency = len(sources) / elapsed, elapsed / len(sources)
            bleu = f"{scoring.sacrebleu_scores(hyps, references)['bleu']['score']:.2f}"
          print(f"| {testset} ({len(sources)}) | {batch_size} | {beam} | {name} | {rate:.1f} | "
                f"{1000 * latency:.1f} | {bleu} |", flush=True)


if __name__ == "__main__":
  app.run(main)
