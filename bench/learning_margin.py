"""The learning tests' margins over several seeds: what tests/test_learning.py asserts, measured.

  nice -n 19 python bench/learning_margin.py                  # seeds 0-4, both tasks
  python bench/learning_margin.py --seeds=0,1 --tasks=toy

For each seed (config.seed: parameter initialisation, dropout and batch order), trains the
test's run in a temporary folder and prints the quantity each learning test bounds, the
test's bound and the margin:
  toy       configs/toy.py: validation exact match (test_toy_task_is_learned), and the share of
            output pieces whose summed cross-attention peaks on the mirrored source piece
            (test_the_toy_model_attends_to_the_mirrored_source)
  multi30k  test_learning's small Multi30k run: validation NLL / the unigram model's NLL
            (test_paper_regularisation_learns_multi30k_well_beyond_a_unigram_model)
  parsing   test_parsing_training's tiny parser: its greedy F1 minus the right-branching
            tree's on the same short training sentences (test_short_training_on_the_sample_...)
A bound is safe when its worst seed still clears it with room to spare; the thresholds in
tests/test_learning.py quote the sweep they were set from.
"""
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from absl import app, flags  # noqa: E402

import test_learning  # noqa: E402  (the tests' configs and bounds, so both stay one thing)
import test_parsing_training  # noqa: E402

flags.DEFINE_list("seeds", ["0", "1", "2", "3", "4"], "config.seed values to train.")
flags.DEFINE_list("tasks", ["toy", "multi30k", "parsing"], "Which learning tests to sweep.")
FLAGS = flags.FLAGS


def toy_row(seed: int) -> str:
  from configs import toy
  config = toy.get_config()
  config.seed = seed
  with tempfile.TemporaryDirectory() as workdir:
    exact, mirrored = test_learning.toy_learning_measures(config, workdir)
  return (f"toy seed {seed}: exact match {exact:.3f} (test: >= {test_learning.TOY_MIN_EXACT_MATCH},"
          f" margin {exact - test_learning.TOY_MIN_EXACT_MATCH:+.3f}); mirrored cross-attention "
          f"{mirrored:.2f} (test: >= {test_learning.TOY_MIN_MIRRORED_SHARE}, margin "
          f"{mirrored - test_learning.TOY_MIN_MIRRORED_SHARE:+.2f})")


def multi30k_row(seed: int) -> str:
  config = test_learning.small_multi30k_config()
  config.seed = seed
  with tempfile.TemporaryDirectory() as workdir:
    ratio = test_learning.multi30k_nll_ratio(config, workdir)
  return (f"multi30k seed {seed}: valid NLL / unigram NLL {ratio:.3f} (test: < "
          f"{test_learning.MULTI30K_MAX_NLL_RATIO}, margin "
          f"{test_learning.MULTI30K_MAX_NLL_RATIO - ratio:+.3f})")


def parsing_row(seed: int) -> str:
  with tempfile.TemporaryDirectory() as workdir:
    f1, right_f1 = test_parsing_training.parsing_learning_measures(
        test_parsing_training.parsing_learning_overrides(seed), workdir)
  gain, bound = f1 - right_f1, test_parsing_training.PARSING_MIN_F1_GAIN
  return (f"parsing seed {seed}: F1 {f1:.2f}, right-branching {right_f1:.2f}, gain {gain:.2f} "
          f"(test: > {bound}, margin {gain - bound:+.2f})")


def main(argv):
  del argv
  rows = {"toy": toy_row, "multi30k": multi30k_row, "parsing": parsing_row}
  for task in FLAGS.tasks:
    for seed in FLAGS.seeds:
      print(rows[task](int(seed)), flush=True)


if __name__ == "__main__":
  app.run(main)
