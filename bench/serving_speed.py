"""Serving speed on the CPU, side by side in one process: our translate.py path (the
Translator), CTranslate2 float32 and int8, and transformers' generate float32, on a trained run
exported by export.py (docs/EXPORT.md).

  python bench/serving_speed.py --workdir=runs/multi30k [--testsets=multi30k/test2016,wmt14]
      [--batch_sizes=64,1] [--beams=1,4] [--max_sentences=0] [--latency_sentences=100]
      [--generate_sentences=0] [--json=FILE]

For each test set, batch size and beam, each engine translates the set once timed: sentences/s
and sacreBLEU. Before it, untimed, ours translates the whole set (it compiles each padded shape
it meets), the other engines one batch (their caches and threads). Batch 1 is latency: the
first --latency_sentences sentences one call each (each translated once untimed first),
sentences/s and the median milliseconds per sentence. --generate_sentences=N: generate (the
slowest) takes the first N sentences of each set at batch > 1 (its sacreBLEU then is
of those). The engines take their own threads (CTranslate2: --ctranslate2_threads); run it alone:
the 1-minute load average is printed and kept at the start and end of each row. Each engine
is told our length limit per batch (its longest source + EOS + 50), not per sentence: what a
user would set. Beam 4: ours with GNMT's penalty, theirs with length**0.6. The exported
folders are written from the parameters timed (WORKDIR/export by default).
"""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

flags.DEFINE_string("workdir", "runs/multi30k", "A trained run.")
flags.DEFINE_string("out", None, "Where the exported folders go (default: WORKDIR/export), "
                    "written from the parameters timed.")
flags.DEFINE_list("testsets", ["multi30k/test2016", "wmt14"], "Test sets (evaluate.py names).")
flags.DEFINE_list("batch_sizes", ["64", "1"], "Sentences per call.")
flags.DEFINE_list("beams", ["1", "4"], "Beam sizes.")
flags.DEFINE_list("engines", ["ours", "ctranslate2 f32", "ctranslate2 int8", "generate f32"],
                  "Which to time.")
flags.DEFINE_integer("max_sentences", 0, "Only the first N sentences of each set (0: all).")
flags.DEFINE_integer("latency_sentences", 100, "Sentences timed one by one at batch 1.")
flags.DEFINE_integer("generate_sentences", 0, "generate f32 at batch > 1: only the first N "
                     "sentences of each set (0: all).")
flags.DEFINE_string("json", None, "Also write the rows and the run's facts to this file.")
flags.DEFINE_integer("ctranslate2_threads", 0, "CTranslate2's intra_threads (0: one per CPU "
                     "core; its own default is 4). On the 2-core VM of docs/EXPORT.md one "
                     "thread was fastest, up to 2.7x at batch 64 and 6.7x at batch 1.")
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
  threads = FLAGS.ctranslate2_threads or os.cpu_count()
  made["ctranslate2 f32"] = lambda: engines.CTranslate2Engine(
      folders["ctranslate2"], threads=threads).translate
  made["ctranslate2 int8"] = lambda: engines.CTranslate2Engine(
      folders["ctranslate2"], compute_type="int8", threads=threads).translate
  made["generate f32"] = lambda: engines.MarianEngine(folders["marian"]).translate
  built = {name: made[name]() for name in FLAGS.engines}
  return {name: (translate if name == "ours" else
                 (lambda translate: lambda s, beam, batch_size: translate(
                     s, beam_size=beam, batch_size=batch_size, exact_limits=False))(translate))
          for name, translate in built.items()}


def timed_row(translate, sources, references, beam, batch_size, warm_all):
  """(sentences/s, seconds per sentence (median at batch 1), sacreBLEU or None)."""
  from aiayn_flax import scoring
  if batch_size == 1:
    subset = sources[:FLAGS.latency_sentences]
    for sentence in subset:  # untimed: ours compiles each padded length it meets
      translate([sentence], beam, 1)
    seconds = []
    for sentence in subset:
      start = time.perf_counter()
      translate([sentence], beam, 1)
      seconds.append(time.perf_counter() - start)
    return len(subset) / sum(seconds), statistics.median(seconds), None
  translate(sources if warm_all else sources[:batch_size], beam, batch_size)  # untimed
  start = time.perf_counter()
  hyps = translate(sources, beam, batch_size)
  elapsed = time.perf_counter() - start
  bleu = scoring.sacrebleu_scores(hyps, references)["bleu"]["score"]
  return len(sources) / elapsed, elapsed / len(sources), bleu


def main(argv):
  del argv
  from aiayn_flax import run_dir, tasks
  from aiayn_flax.export import exporter
  config, model, params, steps = exporter.load_run(FLAGS.workdir, step=FLAGS.step)
  out = FLAGS.out or os.path.join(FLAGS.workdir, "export")
  folders = {f: os.path.join(out, f) for f in exporter.WRITERS}
  for output_format, folder in folders.items():  # always written: never an older run's
    exporter.write_export(FLAGS.workdir, config, params, steps, output_format, folder)
  vocab = run_dir.load_vocabulary(FLAGS.workdir, config)
  engines = engines_of(config, model, params, vocab, folders)
  report = {"workdir": FLAGS.workdir, "checkpoint_steps": steps, "cpu_cores": os.cpu_count(),
            "ctranslate2_threads": FLAGS.ctranslate2_threads or os.cpu_count(),
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "latency_sentences": FLAGS.latency_sentences,
            "generate_sentences": FLAGS.generate_sentences, "rows": []}
  print(f"parameters of steps {steps}; {os.cpu_count()} CPU cores")
  print("| test set | batch | beam | engine | sentences | sentences/s | ms/sentence | sacreBLEU "
        "| load |")
  print("|---|---|---|---|---|---|---|---|---|")
  for testset in FLAGS.testsets:
    sources, references = run_dir.testset_pairs(testset, config, tasks.for_config(config))
    if FLAGS.max_sentences:
      sources, references = sources[:FLAGS.max_sentences], references[:FLAGS.max_sentences]
    for batch_size in map(int, FLAGS.batch_sizes):
      for beam in map(int, FLAGS.beams):
        for name, translate in engines.items():
          n = len(sources)
          if name == "generate f32" and FLAGS.generate_sentences and batch_size > 1:
            n = min(n, FLAGS.generate_sentences)
          load_before = os.getloadavg()[0]
          rate, latency, bleu = timed_row(translate, sources[:n], references[:n], beam,
                                          batch_size, warm_all=name == "ours")
          load = (load_before, os.getloadavg()[0])
          row = {"testset": testset, "batch_size": batch_size, "beam": beam, "engine": name,
                 "sentences": min(FLAGS.latency_sentences, n) if batch_size == 1 else n,
                 "sentences_per_s": round(rate, 2), "ms_per_sentence": round(1000 * latency, 2),
                 "sacrebleu": None if bleu is None else round(bleu, 2),
                 "load_1min": [round(x, 2) for x in load]}
          report["rows"].append(row)
          print(f"| {testset} | {batch_size} | {beam} | {name} | {row['sentences']} | "
                f"{rate:.1f} | {1000 * latency:.1f} | {'' if bleu is None else f'{bleu:.2f}'} | "
                f"{load[0]:.1f}-{load[1]:.1f} |", flush=True)
          if FLAGS.json:  # kept row by row: a long run stopped early keeps what it measured
            with open(FLAGS.json, "w", encoding="utf-8") as f:
              json.dump(report, f, indent=2)


if __name__ == "__main__":
  app.run(main)
