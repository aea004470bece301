"""The toy task of the tests and the quick checks: reverse a sequence of symbols
(aiayn_flax/data/toy.py). A translation whose metric is exact match, scored on its whole
evaluation set."""
from aiayn_flax.tasks.translation import Translation


class ToyReversal(Translation):
  name = "toy_reverse"

  def validation_sentences(self, config) -> int:
    """All of the evaluation set unless the config names a number."""
    return config.eval_decode_sentences or config.dataset.get("toy_eval_examples", 0)
