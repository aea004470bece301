"""The two tasks of the paper on one Transformer: translation (sections 5-6.2) and English
constituency parsing (section 6.3). The model, trainer, checkpoints and decoder are shared;
a task names what differs: the text of a split and what its outputs are scored against, the
vocabulary's reserved pieces, the decoded text's post-processing (nothing vs. repairing it
into a tree) and the metric (BLEU vs. EVALB F1).

`for_config(config)` picks the task from `config.dataset.name`.
"""
import numpy as np

PARSING_DATASETS = ("penn_treebank",)


class Translation:
  name = "translation"
  metric = "bleu"

  def sources_and_references(self, config, split: str) -> tuple[list[str], list[str]]:
    from aiayn_flax.data import source_text
    return source_text.text_pairs(config, split)

  def reserved_pieces(self, config) -> list[str]:
    del config
    return []

  def decoding_constraint(self, vocab):
    """What the decoder may write: anything (see Translator's constraint_for)."""
    del vocab
    return None

  def outputs(self, sources: list[str], decoded: list[str]) -> list[str]:
    """What the user reads: the decoded text is the translation."""
    del sources
    return decoded

  def validation_metrics(self, sources, decoded, references) -> dict:
    """sacreBLEU of the (greedy) validation translations, and exact match (the toy task's)."""
    from aiayn_flax import scoring
    del sources
    exact = float(np.mean([h == r for h, r in zip(decoded, references)]))
    return {"bleu": scoring.sacrebleu_scores(decoded, references)["bleu"]["score"],
            "exact_match": exact}


class Parsing:
  name = "parsing"
  metric = "f1"

  def __init__(self, leaves: str = "XX"):
    self.leaves = leaves  # what the linearized trees write for a word (config.dataset.tree_leaves)

  def sources_and_references(self, config, split: str) -> tuple[list[str], list[str]]:
    """(sentences, gold trees on one line each)."""
    from aiayn_flax.parsing import sentences
    return (sentences.text_pairs(config.dataset, split)[0],
            sentences.gold_lines(config.dataset, split))

  def reserved_pieces(self, config) -> list[str]:
    """Each tree token is one vocabulary piece, so a tree is as many pieces as tokens:
    SentencePiece pieces carry the word-start marker U+2581, written before each token."""
    from aiayn_flax.parsing import sentences
    return ["\u2581" + token for token in sentences.tree_tokens(config.dataset)]

  def decoding_constraint(self, vocab):
    """Only well-formed trees over the input's words (parsing/constrained.py)."""
    from aiayn_flax.parsing import constrained
    pieces = [vocab.piece(i) for i in range(vocab.vocab_size)]
    return constrained.TreeTokens(pieces, self.leaves).constrain_log_probs

  def outputs(self, sources: list[str], decoded: list[str]) -> list[str]:
    """Trees over the sentences' words (XX tags), one line each; empty lines stay empty."""
    from aiayn_flax.parsing import sentences
    return [sentences.tree_line(s, d, leaves=self.leaves) for s, d in zip(sources, decoded)]

  def validation_metrics(self, sources, decoded, references) -> dict:
    """EVALB (COLLINS.prm) F1 against the gold trees, and the fraction of complete matches."""
    from aiayn_flax.parsing import evalb, sentences
    test = [sentences.tree_line(s, d, g, self.leaves)
            for s, d, g in zip(sources, decoded, references)]
    totals = evalb.score_corpus(references, test).all
    return {"f1": totals.f1, "exact_match": totals.complete_match / 100}


def for_config(config):
  """The task a config trains: parsing for a treebank, translation otherwise."""
  if config.dataset.name in PARSING_DATASETS:
    from aiayn_flax.parsing import sentences
    return Parsing(sentences.tree_leaves(config.dataset))
  return Translation()
