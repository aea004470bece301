"""evaluate.py for a parsing run: parse a split of the treebank with the run's decoding recipe,
write the two files EVALB reads, and score them with our EVALB (COLLINS.prm).

WORKDIR/eval/<split>.gold and <split>.tst hold one tree per line, aligned, every sentence of
the split (none dropped; a decoded sequence is repaired into a tree, linearize.repair). The
model predicts no part-of-speech tags (as Vinyals et al. 2015): the .tst trees carry the
gold tags, so that EVALB removes the same punctuation from both sides and scores brackets
only. (Its tagging accuracy is then 100% by construction, and meaningless.) On several
processes each decodes its share, and process 0 alone prints and writes.
"""
import time

from absl import logging
from etils import epath
import jax

from aiayn_flax.runtime import paths, process_zero
from aiayn_flax import run_dir
from aiayn_flax.parsing import evalb, sentences
from aiayn_flax.translator import Translator


def parse_sentences(task, model, params, vocab, sources, gold, beam_size: int, alpha: float,
                    extra_length: int, batch_size: int, progress_every: int = 0):
  """(test lines, decoding seconds): each sentence decoded with the task's constraint (or
  none) and made a tree over its words with the gold tags, aligned with `gold`."""
  translator = Translator(model, params, vocab, beam_size=beam_size, alpha=alpha,
                          extra_length=extra_length, batch_size=batch_size,
                          constraint_for=task.decoding_constraint(vocab))
  start = time.time()
  decoded = translator.translate(sources, progress_every=progress_every)
  seconds = time.time() - start
  return [sentences.tree_line(s, d, g, task.leaves)
          for s, d, g in zip(sources, decoded, gold)], seconds


def parse_and_score(task, workdir: str, config, split: str, beam_size: int, alpha: float,
                    average_last: int, batch_size: int, output_dir: str | None = None,
                    step: int | None = None):
  """Parses `split` as `task` (the run's tasks.Parsing, handed in: this module imports no task)
  decodes, writes <split>.gold / <split>.tst under output_dir (WORKDIR/eval), prints the EVALB
  line and returns the scores. `step`: the checkpoint of that step (with the average_last - 1
  before it) rather than the newest."""
  sources, gold = process_zero.read_once(  # process 0 reads: hosts' disks may differ
      f"treebank {split}", lambda: task.sources_and_references(config, split))
  model, params, steps = run_dir.load_model_and_params(workdir, config, average_last, step)
  vocab = run_dir.load_vocabulary(workdir, config)
  logging.info("parsing %d sentences of %s: beam %d, alpha %.2f, parameters of steps %s",
               len(sources), split, beam_size, alpha, steps)
  test, seconds = parse_sentences(task, model, params, vocab, sources, gold, beam_size, alpha,
                                  config.decode_extra_length, batch_size, progress_every=50)
  scores = evalb.score_corpus(gold, test)
  if jax.process_index() > 0:
    return scores  # every process has every tree (the translator gathers them); 0 writes
  directory = epath.Path(output_dir or paths.workdir_path(workdir) / "eval")
  directory.mkdir(parents=True, exist_ok=True)
  (directory / f"{split}.gold").write_text("".join(line + "\n" for line in gold))
  (directory / f"{split}.tst").write_text("".join(line + "\n" for line in test))
  print(f"{scores.all.summary()}; the {split} split, {len(sources)} sentences, "
        f"beam {beam_size}, alpha {alpha}, steps {steps}, decoded in {seconds:.0f} s")
  print(f"len<={evalb.COLLINS.cutoff_length}: {scores.up_to_cutoff.summary()}")
  print(f"wrote {directory / (split + '.gold')} and {split}.tst (EVALB: evalb -p COLLINS.prm "
        "GOLD TST)")
  return scores
