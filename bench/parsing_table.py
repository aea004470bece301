"""Table 4 on the treebank sample as a scientist reports it: several seeds, every decoding choice
made on the validation files, the test files read once, baselines and significance.

  python bench/parsing_table.py --runs_dir=runs/table                    # configs/parsing_sample.py
  python bench/parsing_table.py --runs_dir=runs/table \\
      --row=sample=configs/parsing_sample.py \\
      --row="dropout2=configs/parsing_sample.py --config.model.dropout_rate=0.2"

For each configuration (--row NAME=CONFIG_FILE [--config.KEY=VALUE ...]; default
parsing_sample=configs/parsing_sample.py):
  1. train --seeds (default 0,1,2) into RUNS_DIR/NAME/seed<S> with train.py (a workdir whose
     newest checkpoint is the config's last step is reused, not retrained: runs started by hand
     count; one that stopped early resumes);
  2. on the VALIDATION files, for each decoding mode (constrained to trees over the input's
     words, and --noconstrained: plain beam search then repair, as the paper), decode every
     seed with each beam (--beams), alpha (--alphas) and number of averaged checkpoints
     (--average_last) and keep the setting of the best mean F1 over the seeds; it says where
     the config's own decoding (evaluate.py's defaults) is not the choice of its mode;
  3. on the TEST files, once per seed: the two modes with their chosen settings, and the
     paper's setting (beam 21, alpha 0.3, at most input + 300 tokens; --paper_beam,
     --paper_average_last) with the config's decoding mode, with its decoding time.
The baselines (right-branching, the vanilla PCFG, the PCFG with parent annotation and
horizontal Markovization 2, the first two steps of Klein & Manning 2003; all parse words, all
outputs carry the gold tags: aiayn_flax/parsing/baselines.py) parse the same test files. Each
Transformer row is compared with each baseline by a bootstrap over the row's seeds and the
test sentences together (1,000 resamples; on a resample, the mean F1 of the row's drawn seeds
on the drawn sentences, paired with the baseline's; aiayn_flax/parsing/bootstrap.py): the
difference, its 95% interval and a two-sided p. The sentences-only test of the earlier tables
(the seeds held fixed, one-sided p) is printed below the table and kept in table.json. Prints
the table and writes RUNS_DIR/table.json and table.md.

Decoding time: seconds of decoding the test sentences (one process, compiles included), on
whatever else the machine was doing: quote it only from a machine that was otherwise idle.
--max_sentences limits both splits (the end-to-end test's tiny run; never for a real table).
"""
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

from absl import app, flags, logging

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

flags.DEFINE_string("runs_dir", None, "Where each configuration's seeds train (NAME/seed<S>) "
                    "and where table.json / table.md go.")
flags.DEFINE_multi_string("row", ["parsing_sample=configs/parsing_sample.py"],
                          "NAME=CONFIG_FILE [--config.KEY=VALUE ...]: one configuration.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Training seeds of every configuration.")
flags.DEFINE_list("beams", ["4", "10"], "Beam sizes tried on the validation files.")
flags.DEFINE_list("alphas", ["0.6", "1.0", "1.5", "2.0"],
                  "Length penalty alphas tried on validation (past 1.0: the best alpha of the "
                  "first table, 1.0, was the largest tried).")
flags.DEFINE_list("average_last", ["5", "20"], "Numbers of averaged checkpoints tried.")
flags.DEFINE_integer("paper_beam", 21, "The paper's row: this beam, alpha 0.3, input + 300.")
flags.DEFINE_integer("paper_average_last", 0, "The paper's row: the last N checkpoints "
                     "averaged (0: the config's average_last_checkpoints; the final table of "
                     "2026-11-27 averaged 20, both configs' default then).")
flags.DEFINE_integer("max_sentences", 0, "Decode only the first N sentences of each split "
                     "(0: all). For tests only.")
flags.DEFINE_integer("resamples", 1000, "Bootstrap resamples.")
flags.DEFINE_boolean("train", True, "Train missing seeds (--notrain: only finished ones).")
flags.mark_flag_as_required("runs_dir")
FLAGS = flags.FLAGS

PAPER_ALPHA, PAPER_EXTRA_LENGTH = 0.3, 300


def parse_row(spec: str) -> tuple[str, str, list[str]]:
  """NAME=CONFIG_FILE [--config.K=V ...] -> (name, config file, overrides)."""
  name, _, rest = spec.partition("=")
  words = shlex.split(rest)
  if not name or not words or not words[0].endswith(".py"):
    raise app.UsageError(f"--row={spec!r}: expected NAME=CONFIG_FILE [--config.KEY=VALUE ...]")
  if any(not w.startswith("--config.") for w in words[1:]):
    raise app.UsageError(f"--row={spec!r}: overrides are --config.KEY=VALUE")
  return name, words[0], words[1:]


def finished(workdir: str) -> bool:
  """Whether the workdir holds a run whose newest checkpoint is its config's last step."""
  from aiayn_flax.runtime import checkpoints
  from aiayn_flax import run_dir
  if not os.path.isdir(checkpoints.checkpoint_dir(workdir)):
    return False
  try:
    config = run_dir.load_config(workdir)
  except FileNotFoundError:
    return False
  steps = checkpoints.last_steps(workdir, 1)
  return bool(steps) and steps[-1] >= config.num_train_steps


def train_seed(config_file: str, overrides: list[str], seed: int, workdir: str) -> dict:
  """Trains (or resumes) one seed with train.py; its log beside the workdir."""
  command = [sys.executable, os.path.join(REPO, "train.py"), f"--config={config_file}",
             *overrides, f"--config.seed={seed}", f"--workdir={workdir}"]
  log = workdir.rstrip("/") + ".log"
  os.makedirs(os.path.dirname(log), exist_ok=True)
  print(f"training: {shlex.join(command)} > {log}", flush=True)
  start = time.time()
  with open(log, "a", encoding="utf-8") as out:
    result = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
  if result.returncode != 0:
    raise RuntimeError(f"training failed (exit {result.returncode}); see {log}")
  return {"trained_seconds": time.time() - start, "log": log}


class SeedRun:
  """A trained seed's model, vocabulary and the decoding of a split's sentences."""

  def __init__(self, workdir: str):
    from aiayn_flax import run_dir
    self.workdir = workdir
    self.config = run_dir.load_config(workdir)
    self.vocab = run_dir.load_vocabulary(workdir, self.config)
    self._params = {}
    self._splits = {}

  def params(self, average_last: int):
    from aiayn_flax import run_dir
    if average_last not in self._params:
      self._params = {average_last: run_dir.load_model_and_params(
          self.workdir, self.config, average_last)}
    return self._params[average_last]

  def parse(self, split: str, beam: int, alpha: float, average_last: int, constrained: bool,
            extra_length: int | None = None) -> dict:
    """Test lines of the split's sentences (trees with the gold tags), EVALB counts, time."""
    from aiayn_flax import tasks
    from aiayn_flax.parsing import bootstrap, evalb, evaluation
    config = self.config.copy_and_resolve_references()
    config.decode_constrained = constrained
    task = tasks.for_config(config)
    if split not in self._splits:  # read once: every setting decodes the same sentences
      self._splits[split] = split_text(config, split)
    sources, gold = self._splits[split]
    model, params, steps = self.params(average_last)
    test, seconds = evaluation.parse_sentences(
        task, model, params, self.vocab, sources, gold, beam, alpha,
        config.decode_extra_length if extra_length is None else extra_length,
        config.decode_batch_size)
    totals = evalb.score_corpus(gold, test).all
    return {"lines": test, "counts": bootstrap.sentence_counts(gold, test).tolist(),
            "scores": totals_dict(totals), "decode_seconds": seconds,
            "checkpoint_steps": [int(s) for s in steps]}


def training_pairs(run: "SeedRun") -> dict:
  """Training pairs the run kept, and those it skipped as longer than dataset.max_length pieces,
  per side (a pair may be long on both); the PCFG baselines read every training tree."""
  from aiayn_flax import tasks
  from aiayn_flax.data import tokenized
  config, task = run.config, tasks.for_config(run.config)
  ids = tokenized.split_ids(config, run.vocab, config.dataset.train_split, task)
  if ids.long_sources is None:  # the run's cache was written before the sides were counted
    ids = tokenized.tokenize_split(config, run.vocab, config.dataset.train_split, task)
  trees = len(task.sources_and_references(config, config.dataset.train_split)[0])
  return {"trees": trees, "kept": len(ids.sources), "skipped_long": ids.skipped_long,
          "long_sources": ids.long_sources, "long_targets": ids.long_targets,
          "skipped_empty": ids.skipped_empty, "max_length": config.dataset.max_length}


def split_text(config, split: str) -> tuple[list[str], list[str]]:
  from aiayn_flax import tasks
  sources, gold = tasks.for_config(config).sources_and_references(config, split)
  if FLAGS.max_sentences:
    sources, gold = sources[:FLAGS.max_sentences], gold[:FLAGS.max_sentences]
  return sources, gold


def totals_dict(totals) -> dict:
  return {"f1": totals.f1, "recall": totals.recall, "precision": totals.precision,
          "complete_match": totals.complete_match, "valid": totals.valid,
          "skipped": totals.skipped, "errors": totals.errors}


def choose_on_validation(runs: list[SeedRun], constrained: bool, beams: list[int],
                         alphas: list[float], average_lasts: list[int]) -> tuple[dict, list]:
  """The (beam, alpha, average_last) of the best mean validation F1 over the seeds."""
  tried = []
  for average_last in average_lasts:
    for beam in beams:
      for alpha in alphas:
        f1s = [run.parse("validation", beam, alpha, average_last, constrained)["scores"]["f1"]
               for run in runs]
        tried.append({"beam": beam, "alpha": alpha, "average_last": average_last,
                      "constrained": constrained, "validation_f1": f1s,
                      "mean": statistics.mean(f1s)})
        print(f"validation, {'constrained' if constrained else 'repaired'}: beam {beam} alpha "
              f"{alpha} last {average_last}: F1 {', '.join(f'{f:.2f}' for f in f1s)}", flush=True)
  best = max(tried, key=lambda t: t["mean"])
  return {k: best[k] for k in ("beam", "alpha", "average_last")}, tried


def config_decoding(config) -> dict:
  """The decoding a config gives evaluate.py by default, in choose_on_validation's keys: the
  final table's constrained choice for the config's row, which tests/test_parsing_config_defaults.py
  checks against the recorded table."""
  return {"beam": config.beam_size, "alpha": config.length_penalty_alpha,
          "average_last": config.average_last_checkpoints}


def compare_with_config(name: str, config, choice: dict) -> bool:
  """Whether validation chose the config's own decoding (evaluate.py's defaults then give the
  row); prints what differs where it did not."""
  defaults = config_decoding(config)
  if defaults == choice:
    return True
  print(f"{name}: validation chose {choice}, the config decodes with {defaults}: evaluate.py's "
        "defaults do not give this row (pass the choice, or update the config)", flush=True)
  return False


def baseline_rows(gold_config) -> dict:
  """Test lines, counts and scores of the three baselines (every output with the gold tags)."""
  from aiayn_flax.parsing import baselines, bootstrap, evalb, linearize, sentences
  train = sentences.split_trees(gold_config.dataset, gold_config.dataset.train_split)
  gold_trees = list(sentences.split_trees(gold_config.dataset, "test"))
  if FLAGS.max_sentences:
    gold_trees = gold_trees[:FLAGS.max_sentences]
  gold = [linearize.evalb_line(t) for t in gold_trees]
  systems = {"right-branching": (baselines.right_branching_lines(train, gold_trees), 0)}
  for grammar in (baselines.VANILLA, baselines.PARENT_ANNOTATED_H2):
    start = time.time()
    parses = baselines.pcfg_lines(train, gold_trees, grammar)
    systems[grammar.name] = (parses.lines, parses.without_parse)
    print(f"{grammar.name}: {time.time() - start:.0f} s, {parses.backed_off} sentences parsed by "
          f"the back-off grammar, {parses.without_parse} without a parse (right-branching "
          "instead)", flush=True)
  return {name: {"lines": lines, "without_parse": failures,
                 "counts": bootstrap.sentence_counts(gold, lines).tolist(),
                 "scores": totals_dict(evalb.score_corpus(gold, lines).all)}
          for name, (lines, failures) in systems.items()}


def summary(values: list[float]) -> dict:
  return {"mean": statistics.mean(values),
          "sd": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}


def transformer_row(name: str, label: str, per_seed: list[dict], seeds: list[int],
                    choice: dict, baselines_: dict, resamples: int) -> dict:
  import numpy as np
  from aiayn_flax.parsing import bootstrap
  row = {"name": f"{name}: {label}", "seeds": seeds, "decoding": choice,
         "decode_seconds": [p["decode_seconds"] for p in per_seed]}
  for key in ("f1", "recall", "precision", "complete_match"):
    row[key] = summary([p["scores"][key] for p in per_seed])
  for key in ("valid", "skipped", "errors"):
    row[key] = [p["scores"][key] for p in per_seed]
  counts = [np.array(p["counts"]) for p in per_seed]
  row["against"] = {}
  for baseline, result in baselines_.items():
    both = bootstrap.seeds_and_sentences_bootstrap(counts, np.array(result["counts"]), resamples)
    held = bootstrap.paired_bootstrap(counts, np.array(result["counts"]), resamples)
    row["against"][baseline] = {
        "difference": both.difference, "p_value": both.p_value, "interval": list(both.interval),
        "test": "two-sided, resampling the seeds and the test sentences",
        "sentences_only": {"p_value_one_sided": held.p_value, "interval": list(held.interval),
                           "test": "one-sided, resampling the test sentences, seeds held"}}
  return row


def markdown(rows: list[dict], baselines_: dict, sentences_: int) -> str:
  names = list(baselines_)
  lines = [f"Test files: {sentences_} sentences. F1, recall, precision, complete match: mean ± sd "
           "over the seeds. Against a baseline: F1 difference [95% interval], two-sided p, by "
           "a bootstrap over the seeds and the test sentences together (each resample draws "
           "the row's seeds and the sentences, both with replacement).", "",
           "| system | seeds | F1 | recall | precision | complete match | valid / skipped / "
           "errors | decoding s | " + " | ".join(f"vs {n}" for n in names) + " |",
           "|---|---|---:|---:|---:|---:|---|---:|" + "---|" * len(names)]
  for name, result in baselines_.items():
    s = result["scores"]
    unparsed = (f" ({result['without_parse']} without a parse)" if result["without_parse"]
                else "")
    lines.append(f"| {name} | - | {s['f1']:.2f} | {s['recall']:.2f} | {s['precision']:.2f} | "
                 f"{s['complete_match']:.2f} | {s['valid']} / {s['skipped']} / {s['errors']}"
                 f"{unparsed} | - |" + " - |" * len(names))
  for row in rows:
    cells = [f"{row[k]['mean']:.2f} ± {row[k]['sd']:.2f}"
             for k in ("f1", "recall", "precision", "complete_match")]
    counts = " ; ".join(f"{v} / {s} / {e}" for v, s, e in
                        zip(row["valid"], row["skipped"], row["errors"]))
    versus = [f"{a['difference']:+.2f} [{a['interval'][0]:+.2f}, {a['interval'][1]:+.2f}], "
              f"p={a['p_value']:.3f}" for a in row["against"].values()]
    seconds = statistics.mean(row["decode_seconds"])
    lines.append(f"| {row['name']} | {','.join(map(str, row['seeds']))} | " + " | ".join(cells)
                 + f" | {counts} | {seconds:.0f} | " + " | ".join(versus) + " |")
  lines += ["", "The test of the earlier tables, over the sentences alone (each row's seeds held "
            "fixed), one-sided p:"]
  for row in rows:
    held = {baseline: a["sentences_only"] for baseline, a in row["against"].items()}
    lines.append(f"- {row['name']}: " + "; ".join(
        f"vs {baseline} [{h['interval'][0]:+.2f}, {h['interval'][1]:+.2f}], "
        f"p={h['p_value_one_sided']:.3f}" for baseline, h in held.items()))
  return "\n".join(lines)


def dropped_note(name: str, pairs: dict) -> str:
  return (f"{name}: trained on {pairs['kept']} of the {pairs['trees']} training trees; "
          f"{pairs['skipped_long']} skipped as longer than {pairs['max_length']} pieces "
          f"({pairs['long_sources']} on the source side, {pairs['long_targets']} on the target "
          f"side), {pairs['skipped_empty']} empty. The PCFGs read all {pairs['trees']}.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from aiayn_flax.runtime.tensorflow_setup import keep_tensorflow_off_accelerators
  keep_tensorflow_off_accelerators()
  seeds = [int(s) for s in FLAGS.seeds]
  report = {"command": shlex.join(["python", "bench/parsing_table.py", *sys.argv[1:]]),
            "configurations": {}, "rows": []}
  gold_config = None
  for spec in FLAGS.row:
    name, config_file, overrides = parse_row(spec)
    workdirs = [os.path.join(FLAGS.runs_dir, name, f"seed{seed}") for seed in seeds]
    training = {}
    for seed, workdir in zip(seeds, workdirs):
      if finished(workdir):
        training[seed] = {"reused": True}
      elif FLAGS.train:
        training[seed] = train_seed(config_file, overrides, seed, workdir)
    done = [(s, w) for s, w in zip(seeds, workdirs) if finished(w)]
    if not done:
      print(f"{name}: no finished seed; skipped", flush=True)
      continue
    runs = [SeedRun(w) for _, w in done]
    if gold_config is None:  # one persistent compilation cache for every decoding program
      from aiayn_flax.runtime import compilation_cache
      compilation_cache.enable(runs[0].config, runs[0].workdir)
    gold_config = gold_config or runs[0].config
    entry = {"config": config_file, "overrides": overrides, "training": training,
             "seeds": [s for s, _ in done], "workdirs": [w for _, w in done], "validation": {},
             "training_pairs": training_pairs(runs[0])}
    test = {}
    for constrained in (True, False):
      mode = "constrained" if constrained else "repaired"
      choice, tried = choose_on_validation(runs, constrained, [int(b) for b in FLAGS.beams],
                                           [float(a) for a in FLAGS.alphas],
                                           [int(n) for n in FLAGS.average_last])
      entry["validation"][mode] = {"chosen": choice, "tried": tried}
      if constrained == runs[0].config.decode_constrained:
        entry["validation"][mode]["config_decodes_so"] = compare_with_config(
            name, runs[0].config, choice)
      test[mode] = (choice | {"constrained": constrained},
                    [run.parse("test", choice["beam"], choice["alpha"], choice["average_last"],
                               constrained) for run in runs])
    paper = {"beam": FLAGS.paper_beam, "alpha": PAPER_ALPHA, "extra_length": PAPER_EXTRA_LENGTH,
             "average_last": (FLAGS.paper_average_last
                              or runs[0].config.average_last_checkpoints),
             "constrained": runs[0].config.decode_constrained}
    test["paper"] = (paper, [run.parse("test", paper["beam"], paper["alpha"],
                                       paper["average_last"], paper["constrained"],
                                       PAPER_EXTRA_LENGTH) for run in runs])
    entry["test"] = {mode: {"decoding": choice, "per_seed": per_seed}
                     for mode, (choice, per_seed) in test.items()}
    report["configurations"][name] = entry

  if gold_config is None:
    sys.exit("parsing_table.py: error: no configuration has a finished seed")
  baselines_ = baseline_rows(gold_config)
  report["baselines"] = baselines_
  labels = {"constrained": "constrained, chosen on validation",
            "repaired": "plain beam search then repair (the paper's way), chosen on validation",
            "paper": f"beam {FLAGS.paper_beam}, alpha 0.3, input + 300"}
  for name, entry in report["configurations"].items():
    for mode, result in entry["test"].items():
      report["rows"].append(transformer_row(name, labels[mode], result["per_seed"],
                                            entry["seeds"], result["decoding"], baselines_,
                                            FLAGS.resamples))
  sentences_ = len(next(iter(baselines_.values()))["lines"])
  table = markdown(report["rows"], baselines_, sentences_) + "\n\n" + "\n".join(
      dropped_note(name, entry["training_pairs"])
      for name, entry in report["configurations"].items())
  print(table)
  os.makedirs(FLAGS.runs_dir, exist_ok=True)
  with open(os.path.join(FLAGS.runs_dir, "table.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(FLAGS.runs_dir, "table.md"), "w", encoding="utf-8") as f:
    f.write(f"{report['command']}\n\n{table}\n")
  logging.info("wrote %s/table.json and table.md", FLAGS.runs_dir)


if __name__ == "__main__":
  from aiayn_flax.runtime import garbage_collection
  garbage_collection.collect_less_often()  # as train.py (it decodes and parses in-process)
  app.run(main)
