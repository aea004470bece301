"""Translation (sections 5-6.2): text pairs from the data layer's sources (tfds, Multi30k, text
files), decoded text as it is, BLEU."""
import numpy as np


class Translation:
  name = "translation"
  metric = "bleu"
  evaluate_split = None  # evaluate.py's own BLEU evaluation

  @classmethod
  def for_config(cls, config):
    del config
    return cls()

  def text_pair_chunks(self, config, split: str):
    from aiayn_flax.data import source_text
    return source_text.text_pair_chunks(config, split)

  def sources_and_references(self, config, split: str) -> tuple[list[str], list[str]]:
    from aiayn_flax.data import source_text
    return source_text.text_pairs(config, split)

  def prepare_data(self, config) -> str:
    """Downloads and prepares a tfds dataset (source_text.prepare); says what it did."""
    from aiayn_flax.data import source_text
    return source_text.prepare(config.dataset)

  def reserved_pieces(self, config) -> list[str]:
    del config
    return []

  def cache_key_fields(self, config) -> dict:
    """The token ids depend on the text alone (the pipeline keys the dataset, split, languages,
    files and vocabulary itself)."""
    del config
    return {}

  def decoding_constraint(self, vocab):
    """What the decoder may write: anything (see Translator's constraint_for)."""
    del vocab
    return None

  def stand_in_decoding_constraint(self, vocab_size: int):
    del vocab_size
    return None

  def outputs(self, sources: list[str], decoded: list[str]) -> list[str]:
    """What the user reads: the decoded text is the translation."""
    del sources
    return decoded

  def validation_sentences(self, config) -> int:
    """Validation sentences greedy-decoded at each evaluation (0: none)."""
    return config.eval_decode_sentences

  def validation_metrics(self, sources, decoded, references) -> dict:
    """sacreBLEU of the (greedy) validation translations, and exact match."""
    from aiayn_flax import scoring
    del sources
    exact = float(np.mean([h == r for h, r in zip(decoded, references)]))
    return {"bleu": scoring.sacrebleu_scores(decoded, references)["bleu"]["score"],
            "exact_match": exact}
