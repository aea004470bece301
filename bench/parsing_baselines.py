"""The parsing baselines (aiayn_flax/parsing/baselines.py), scored by our EVALB (COLLINS.prm)
on a split of the treebank, beside evaluate.py's F1 on the same trees:

- right-branching;
- the vanilla PCFG (horizontal Markovization 1, no parent annotation), over the words;
- the PCFG with parent annotation and horizontal Markovization 2 (the first two steps of Klein
  & Manning 2003, not their further splits; the vanilla grammar parses what it cannot), over
  the words;
- (--pcfg=...,tags) the vanilla PCFG over the gold tags: it is given what the others infer, an
  upper reference only, not a peer.

Every system parses words and its output carries the gold part-of-speech tags (baselines.py
says why). Development reads the validation split (the default); the test split is read by
bench/parsing_table.py's final table only. --max_words limits the sentences scored.

  python bench/parsing_baselines.py [--split=validation] [--transformer_tst=W/eval/validation.tst]
"""
import time

from absl import app, flags

from aiayn_flax.parsing import baselines, evalb, linearize, sentences

flags.DEFINE_string("split", "validation", "Split of the treebank to score.")
flags.DEFINE_integer("max_words", 0, "Score only sentences of at most this many words (0: all).")
flags.DEFINE_list("pcfg", ["vanilla", "parent_h2"],
                  "PCFGs to run: vanilla, parent_h2 (both over words), tags (vanilla over "
                  "gold tags, a reference).")
flags.DEFINE_string("transformer_tst", None, "evaluate.py's WORKDIR/eval/<split>.tst, to score "
                    "on the same subset.")
FLAGS = flags.FLAGS

PCFGS = {"vanilla": (baselines.VANILLA, "words"),
         "parent_h2": (baselines.PARENT_ANNOTATED_H2, "words"),
         "tags": (baselines.VANILLA, "tags")}


def main(argv):
  del argv
  import ml_collections
  dataset = ml_collections.ConfigDict(dict(treebank_dir="", train_split="train"))
  train = sentences.split_trees(dataset, "train")
  gold_trees = sentences.split_trees(dataset, FLAGS.split)
  chosen = [i for i, t in enumerate(gold_trees)
            if not FLAGS.max_words or len(t.leaves()) <= FLAGS.max_words]
  trees = [gold_trees[i] for i in chosen]
  gold_lines = [linearize.evalb_line(t) for t in trees]
  report = {"right-branching": evalb.score_corpus(
      gold_lines, baselines.right_branching_lines(train, trees))}
  notes = []
  for name in FLAGS.pcfg:
    grammar, over = PCFGS[name]
    start = time.time()
    def progress(count, name=name):
      if count % 25 == 0:
        print(f"{name}: {count}/{len(chosen)} sentences, {time.time() - start:.0f} s")
    parses = baselines.pcfg_lines(train, trees, grammar, over, progress)
    label = f"{grammar.name} over {'gold tags' if over == 'tags' else 'words'}"
    report[label] = evalb.score_corpus(gold_lines, parses.lines)
    notes.append(f"{label}: {time.time() - start:.0f} s, {parses.backed_off} sentences parsed by "
                 f"the back-off grammar, {parses.without_parse} without a parse "
                 "(right-branching tree instead)")

  if FLAGS.transformer_tst:
    with open(FLAGS.transformer_tst, encoding="utf-8") as f:
      tst = f.read().splitlines()
    report["Transformer (evaluate.py)"] = evalb.score_corpus(gold_lines, [tst[i] for i in chosen])

  print(f"{FLAGS.split}: {len(chosen)} of {len(gold_trees)} sentences (at most "
        f"{FLAGS.max_words or 'any'} words)")
  print("\n".join(notes))
  for name, scores in report.items():
    print(f"{name:42s} {scores.all.summary()}")


if __name__ == "__main__":
  app.run(main)
