"""English constituency parsing (section 6.3): sentences in, linearized trees out
(aiayn_flax/parsing/), decoding constrained to trees over the input's words, EVALB F1."""

SILVER_SPLIT = "silver"


def silver_settings(dataset, leaves: str) -> tuple[list[str], str, float | None, float | None]:
  """(silver files, leaves, min agreement, min log-probability per word) of a config's dataset
  block (a threshold of 0 or below -50 per word: none)."""
  paths = [p.strip() for p in dataset.get("silver_files", "").split(",") if p.strip()]
  if not paths:
    raise ValueError(f"config.dataset.mix_split={SILVER_SPLIT!r} needs config.dataset."
                     "silver_files: the .silver.jsonl files of python -m aiayn_flax.parsing.silver")
  min_agreement = dataset.get("silver_min_agreement", 0.0)
  min_log_prob = dataset.get("silver_min_log_prob_per_word", -100.0)
  return (paths, leaves, min_agreement if min_agreement > 0 else None,
          min_log_prob if min_log_prob >= -50 else None)


class Parsing:
  name = "parsing"
  metric = "f1"

  def __init__(self, leaves: str = "XX", constrained: bool = True):
    self.leaves = leaves  # what the linearized trees write for a word (config.dataset.tree_leaves)
    self.constrained = constrained  # config.decode_constrained

  @classmethod
  def for_config(cls, config):
    from aiayn_flax.parsing import sentences
    return cls(sentences.tree_leaves(config.dataset), config.decode_constrained)

  def text_pair_chunks(self, config, split: str):
    """A split of the treebank, or "silver": the silver trees of config.dataset.silver_files
    that pass its thresholds (parsing/silver.py), which config.dataset.mix_split mixes in."""
    from aiayn_flax.parsing import sentences
    if split == SILVER_SPLIT:
      from aiayn_flax.parsing import silver
      yield silver.training_pairs(*silver_settings(config.dataset, self.leaves))
      return
    yield sentences.text_pairs(config.dataset, split)

  def sources_and_references(self, config, split: str) -> tuple[list[str], list[str]]:
    """(sentences, gold trees on one line each)."""
    from aiayn_flax.parsing import sentences
    return (sentences.text_pairs(config.dataset, split)[0],
            sentences.gold_lines(config.dataset, split))

  def prepare_data(self, config) -> str:
    """Nothing: the treebank is read (or downloaded) where it is first needed."""
    return f"{config.dataset.name}: read from the treebank's files, nothing to prepare"

  def reserved_pieces(self, config) -> list[str]:
    """Each tree token is one vocabulary piece, so a tree is as many pieces as tokens:
    SentencePiece pieces carry the word-start marker U+2581, written before each token."""
    from aiayn_flax.parsing import sentences
    return ["\u2581" + token for token in sentences.tree_tokens(config.dataset)]

  def cache_key_fields(self, config) -> dict:
    """The trees' leaves (XX or words) and the treebank read change the target ids."""
    from aiayn_flax.parsing import sentences
    fields = {"tree_leaves": sentences.tree_leaves(config.dataset),
              "treebank_dir": config.dataset.get("treebank_dir", "")}
    if config.dataset.get("mix_split") == SILVER_SPLIT:  # the silver trees and the thresholds
      from aiayn_flax.parsing import silver
      paths, _, min_agreement, min_log_prob = silver_settings(config.dataset, self.leaves)
      fields["silver"] = {"files": silver.file_digests(paths), "min_agreement": min_agreement,
                          "min_log_prob_per_word": min_log_prob}
    return fields

  def decoding_constraint(self, vocab):
    """Only well-formed trees over the input's words (parsing/constrained.py); None (plain
    search, the output repaired afterwards, as the paper) when not `constrained`."""
    if not self.constrained:
      return None
    from aiayn_flax.parsing import constrained
    pieces = [vocab.piece(i) for i in range(vocab.vocab_size)]
    return constrained.TreeTokens(pieces, self.leaves).constrain_log_probs

  def stand_in_decoding_constraint(self, vocab_size: int):
    """The constraint on stand-in pieces: the program depends on the vocabulary's size only."""
    from aiayn_flax.parsing import constrained
    return self.decoding_constraint(constrained.StandInVocabulary(vocab_size))

  def outputs(self, sources: list[str], decoded: list[str]) -> list[str]:
    """Trees over the sentences' words (XX tags), one line each; empty lines stay empty."""
    from aiayn_flax.parsing import sentences
    return [sentences.tree_line(s, d, leaves=self.leaves) for s, d in zip(sources, decoded)]

  def validation_sentences(self, config) -> int:
    """Validation sentences greedy-parsed for the F1 at each evaluation (0: none)."""
    return config.eval_decode_sentences

  def validation_metrics(self, sources, decoded, references) -> dict:
    """EVALB (COLLINS.prm) F1 against the gold trees, and the fraction of complete matches."""
    from aiayn_flax.parsing import evalb, sentences
    test = [sentences.tree_line(s, d, g, self.leaves)
            for s, d, g in zip(sources, decoded, references)]
    totals = evalb.score_corpus(references, test).all
    return {"f1": totals.f1, "exact_match": totals.complete_match / 100}

  def evaluate_split(self, workdir: str, config, split: str, beam_size: int, alpha: float,
                     average_last: int, batch_size: int, output_dir: str | None = None,
                     step: int | None = None):
    """evaluate.py for a parsing run: trees, WORKDIR/eval/<split>.gold and .tst, EVALB F1 (the
    checkpoints ending at `step`, or the newest)."""
    from aiayn_flax.parsing import evaluation
    return evaluation.parse_and_score(self, workdir, config, split, beam_size, alpha,
                                      average_last, batch_size, output_dir, step)
