"""Translate a test set with a trained run and score it as the paper did and as sacreBLEU does.

  python evaluate.py --workdir=runs/base       # the run's test split: newstest2014 for WMT14
  python evaluate.py --workdir=runs/multi30k --testset=multi30k/test2016
  python evaluate.py --workdir=runs/base --testset=wmt14 --beam_size=4 --average_last=5
  python evaluate.py --workdir=runs/multi30k --step=3000 --average_last=3   # 2600, 2800, 3000
  python evaluate.py --workdir=DIR --src_file=my.en --ref_file=my.de
  python evaluate.py --hyp_file=out.de --ref_file=ref.de        # score only, no model
  python evaluate.py --workdir=runs/parse      # a parser: its validation split (--split=test)

Prints sacreBLEU (cased, 13a, with its signature), chrF, and the paper's tokenized BLEU
(Moses tokenization + compound splitting); on Multi30k, also the lowercased tokenized BLEU
that the Multi30k literature reports. Writes the detokenized hypotheses and a JSON file
of the scores, which names the checkpoint steps used (`checkpoint_steps`).

On a pod slice or several GPU hosts, run it on every worker, as train.py: the processes join
(jax.distributed), process 0 reads the test set and hands it to the others (only its disk needs
the data), every batch is decoded over all the devices of all of them (its rows split), and
process 0 prints the scores and writes the files (the hypotheses are the same as on one device).
"""
import json
import os
import sys

from absl import app, flags, logging

flags.DEFINE_string("workdir", None, "A run's directory (checkpoints, vocabulary, config).")
flags.DEFINE_string("testset", None, "multi30k/test2016 (…/test2017, test2018, "
                    "test2017_mscoco, validation), wmt14 (newstest2014 EN->DE), split:NAME.")
flags.DEFINE_string("split", None, "A split of the run's own dataset (same as split:NAME). "
                    "Default by the run's task, as its saved config says: a translation run "
                    "reads its config.dataset.test_split; a parsing run its "
                    "config.dataset.eval_split (validation), the test files only when asked "
                    "(--split=test), as docs/PARSING.md's protocol.")
flags.DEFINE_string("src_file", None, "Source sentences, one per line.")
flags.DEFINE_string("ref_file", None, "References, one per line.")
flags.DEFINE_string("hyp_file", None, "Existing translations to score (with --ref_file).")
flags.DEFINE_string("target_lang", None, "Target language for Moses tokenization "
                    "(default: the run's target language, else de).")
flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's config; 1 is greedy).")
flags.DEFINE_float("alpha", None, "Length penalty alpha (default: the run's config).")
flags.DEFINE_integer("average_last", None, "Average the last N checkpoints' parameters "
                     "(default: the run's config, e.g. 5 for base, 20 for big).")
flags.DEFINE_integer("step", None, "Evaluate the checkpoint of this step (with --average_last=K, "
                     "the K stored checkpoints ending at it) instead of the newest.")
flags.DEFINE_integer("batch_size", None, "Sentences per decoding batch on each device "
                     "(default: the run's config.decode_batch_size, also per device).")
flags.DEFINE_boolean("constrained", None, "A parser's decoding constrained to trees over the "
                     "input's words (default: the run's config.decode_constrained); "
                     "--noconstrained: plain beam search, then repair, as the paper.")
flags.DEFINE_boolean("multi30k_bleu", None, "Also print the Multi30k literature's lowercased, "
                     "Moses-tokenized BLEU (default: on for Multi30k test sets).")
flags.DEFINE_string("output_dir", None, "Where hypotheses and scores go "
                    "(default: WORKDIR/eval, or beside --hyp_file).")
FLAGS = flags.FLAGS


def write_outputs(output_dir: str, name: str, hypotheses, scores) -> None:
  """NAME.hyp (one translation per line) and NAME.json in output_dir, a local folder or a
  Cloud Storage URL (the default, WORKDIR/eval, is one when the workdir is)."""
  from etils import epath
  directory = epath.Path(output_dir)
  directory.mkdir(parents=True, exist_ok=True)
  if hypotheses is not None:
    (directory / f"{name}.hyp").write_text("".join(h + "\n" for h in hypotheses),
                                           encoding="utf-8")
  (directory / f"{name}.json").write_text(json.dumps(scores, indent=2, ensure_ascii=False),
                                          encoding="utf-8")
  logging.info("wrote %s.json%s in %s", name, " and .hyp" if hypotheses is not None else "",
               output_dir)


def score_existing_translation() -> None:
  from aiayn_flax import scoring
  if not FLAGS.ref_file:
    raise app.UsageError("--hyp_file needs --ref_file")
  scores = scoring.score_files(FLAGS.hyp_file, FLAGS.ref_file, FLAGS.target_lang or "de",
                               multi30k=bool(FLAGS.multi30k_bleu))
  print(scoring.format_scores(scores))
  output_dir = FLAGS.output_dir or os.path.dirname(os.path.abspath(FLAGS.hyp_file))
  write_outputs(output_dir, os.path.basename(FLAGS.hyp_file) + ".scores", None, scores)


def default_split(config, task) -> str:
  """--split, else by the run's task: a task scored its own way (a parser) reads the validation
  split (config.dataset.eval_split) unless asked for test; translation its test split."""
  if FLAGS.split:
    return FLAGS.split
  return config.dataset.eval_split if task.evaluate_split else config.dataset.test_split


def translate_and_score() -> None:
  import jax
  from aiayn_flax.runtime import paths, process_zero, provenance
  from aiayn_flax import run_dir, scoring, sharding, tasks
  from aiayn_flax.data import text_files
  from aiayn_flax.runtime import compilation_cache
  from aiayn_flax.translator import Translator
  from aiayn_flax.runtime import host_agreement
  # Every host reads the run's config: one that cannot (a workdir it does not see) stops all.
  config = host_agreement.on_every_host("the run's config",
                                        lambda: run_dir.load_config(FLAGS.workdir))
  compilation_cache.enable(config, FLAGS.workdir)  # reuse what train.py compiled
  if FLAGS.constrained is not None:
    config.decode_constrained = FLAGS.constrained
  task = tasks.for_config(config)
  if task.evaluate_split:  # a task scored its own way (a parser: trees and EVALB F1)
    if FLAGS.testset or FLAGS.src_file or FLAGS.ref_file:
      raise app.UsageError(f"a {task.name} run is scored on a split of its dataset: --split=NAME")
    task.evaluate_split(
        FLAGS.workdir, config, default_split(config, task),
        FLAGS.beam_size or config.beam_size,
        config.length_penalty_alpha if FLAGS.alpha is None else FLAGS.alpha,
        FLAGS.average_last or config.average_last_checkpoints,
        sharding.over_decoding_devices(FLAGS.batch_size or config.decode_batch_size),
        FLAGS.output_dir, FLAGS.step)
    return
  if FLAGS.src_file or FLAGS.ref_file:
    if not (FLAGS.src_file and FLAGS.ref_file):
      raise app.UsageError("--src_file and --ref_file go together")
    sources, references = process_zero.read_once(  # process 0 reads: hosts' disks differ
        "--src_file/--ref_file",
        lambda: text_files.read_parallel_lines(FLAGS.src_file, FLAGS.ref_file))
    name = os.path.basename(FLAGS.src_file)
    is_multi30k = False
  else:
    # Default: the run's test split (newstest2014 for WMT14 EN-DE, test2016 for Multi30k).
    testset = FLAGS.testset or f"split:{default_split(config, task)}"
    sources, references = process_zero.read_once(
        f"test set {testset}", lambda: run_dir.testset_pairs(testset, config, task))
    name = testset.replace("/", "_").replace(":", "_")
    is_multi30k = testset.startswith("multi30k/") or (
        testset.startswith("split:") and config.dataset.name == "multi30k")

  beam_size = FLAGS.beam_size or config.beam_size
  alpha = config.length_penalty_alpha if FLAGS.alpha is None else FLAGS.alpha
  average_last = FLAGS.average_last or config.average_last_checkpoints
  model, params, steps = run_dir.load_model_and_params(FLAGS.workdir, config, average_last,
                                                       FLAGS.step)
  vocab = run_dir.load_vocabulary(FLAGS.workdir, config)
  logging.info("translating %d sentences: beam %d, alpha %.2f, parameters of steps %s",
               len(sources), beam_size, alpha, steps)
  translator = Translator(model, params, vocab, beam_size=beam_size, alpha=alpha,
                          extra_length=config.decode_extra_length,
                          batch_size=sharding.over_decoding_devices(
                              FLAGS.batch_size or config.decode_batch_size),
                          max_positions=(config.model.max_positions
                                         if config.model.positions == "learned" else None))
  hypotheses = translator.translate(sources, progress_every=500)
  target_lang = FLAGS.target_lang or config.dataset.get("target_lang", "de")
  multi30k_bleu = is_multi30k if FLAGS.multi30k_bleu is None else FLAGS.multi30k_bleu
  scores = scoring.score_translations(hypotheses, references, target_lang, multi30k_bleu)
  scores |= {"checkpoint_steps": steps, "beam_size": beam_size, "alpha": alpha,
             "versions": provenance.software_versions()}
  if jax.process_index() > 0:
    return  # every process has every translation; process 0 alone writes them
  print(scoring.format_scores(scores))
  suffix = f"beam{beam_size}_avg{len(steps)}_step{steps[-1]}"
  output_dir = FLAGS.output_dir or str(paths.workdir_path(FLAGS.workdir) / "eval")
  write_outputs(output_dir, f"{name}.{suffix}", hypotheses, scores)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from aiayn_flax.runtime.tensorflow_setup import keep_tensorflow_off_accelerators
  keep_tensorflow_off_accelerators()  # before any tf.data work: TF must not take GPU memory
  if not (FLAGS.hyp_file or FLAGS.workdir):
    raise app.UsageError("give --workdir (to translate and score) or --hyp_file and --ref_file")
  try:
    if FLAGS.hyp_file:
      score_existing_translation()
    else:
      from aiayn_flax.runtime import cluster
      cluster.initialize_distributed()  # launched on every worker: join the others first
      translate_and_score()
  except (FileNotFoundError, ValueError) as e:  # bad input: one line that says what to do
    sys.exit(f"evaluate.py: error: {e}")
  except OSError as e:  # the outputs could not be written (a full disk, a read-only folder)
    from aiayn_flax.runtime import storage_errors
    failure = storage_errors.write_failure(
        e, FLAGS.output_dir or FLAGS.workdir or FLAGS.hyp_file,
        "the run's checkpoints are only read, never changed (or pass --output_dir=DIR)")
    if failure is None:
      raise
    sys.exit(f"evaluate.py: error: {failure}")


if __name__ == "__main__":
  from aiayn_flax.runtime import garbage_collection, huge_pages
  garbage_collection.collect_less_often()  # before JAX's imports (fewer collections)
  huge_pages.log_once_flags_are_parsed()  # malloc on huge pages? (set from outside: no restart)
  app.run(main)
