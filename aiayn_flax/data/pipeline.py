"""From a config's `dataset` block to text pairs, the shared vocabulary and tokenized batches."""
import dataclasses
import os

import numpy as np
from absl import logging

from aiayn_flax.data import bucketing, toy, vocabulary

VOCAB_FILENAME = "vocab.model"


def text_pairs(config, split: str) -> tuple[list[str], list[str]]:
  """(source lines, target lines) of a split, in file order, nothing dropped."""
  dataset = config.dataset
  name = dataset.name
  if name == "toy_reverse":
    sizes = {"train": dataset.toy_train_examples}
    seed = {"train": 0, "validation": 1, "test": 2}.get(split)
    if seed is None:
      raise ValueError(f"config.dataset: toy_reverse has splits train/validation/test, not {split!r}")
    return toy.reversal_pairs(sizes.get(split, dataset.toy_eval_examples),
                              config.model.vocab_size, dataset.toy_min_symbols,
                              dataset.max_length - 1, seed)
  if name == "multi30k":
    from aiayn_flax.data import multi30k
    return multi30k.read_split_pairs(split)
  if name == "parallel_text":
    from aiayn_flax.data import text_files
    if split not in dataset.files:
      raise ValueError(f"config.dataset.files has no {split!r} entry (has {sorted(dataset.files)})")
    return text_files.read_parallel_lines(*dataset.files[split])
  return _tfds_pairs(dataset, split)


def _tfds_pairs(dataset, split):
  """Pairs from a tfds builder such as wmt14_translate/de-en (read in the EN->DE direction by
  picking features by language, whatever the builder's supervised keys say)."""
  import tensorflow_datasets as tfds
  ds = tfds.load(dataset.name, split=split, data_dir=dataset.data_dir or None,
                 shuffle_files=False)
  sources, targets = [], []
  for example in tfds.as_numpy(ds):
    sources.append(example[dataset.source_lang].decode("utf-8"))
    targets.append(example[dataset.target_lang].decode("utf-8"))
  return sources, targets


def vocabulary_for(config, workdir: str):
  """The run's shared vocabulary: loaded from the workdir, or trained on the training split."""
  if config.dataset.name == "toy_reverse":
    return toy.SymbolVocabulary(config.model.vocab_size)
  path = os.path.join(workdir, VOCAB_FILENAME)
  if os.path.exists(path):
    vocab = vocabulary.load_vocabulary(path)
  else:
    sources, targets = text_pairs(config, config.dataset.train_split)
    sample = config.dataset.vocab_sample_sentences
    sentences = sources + targets
    if sample and len(sentences) > sample:
      rng = np.random.default_rng(config.seed)
      sentences = [sentences[i] for i in sorted(rng.choice(len(sentences), sample, replace=False))]
    logging.info("Training a %d-piece %s vocabulary on %d sentences", config.model.vocab_size,
                 config.dataset.vocab_model_type, len(sentences))
    os.makedirs(workdir, exist_ok=True)
    vocab = vocabulary.train_vocabulary(sentences, path, config.model.vocab_size,
                                        config.dataset.vocab_model_type)
  if vocab.vocab_size != config.model.vocab_size:
    raise ValueError(f"{path} has {vocab.vocab_size} pieces but config.model.vocab_size is "
                     f"{config.model.vocab_size}; use a fresh workdir or set the config to match")
  return vocab


@dataclasses.dataclass
class TokenizedSplit:
  sources: list[np.ndarray]  # token ids ending in EOS
  targets: list[np.ndarray]
  skipped_empty: int = 0
  skipped_long: int = 0


def tokenize_for_training(sources: list[str], targets: list[str], vocab,
                          max_length: int) -> TokenizedSplit:
  """Token ids + EOS; drops (and counts) empty pairs and pairs longer than max_length."""
  eos = np.array([vocabulary.EOS_ID], dtype=np.int32)
  source_ids, target_ids = vocab.encode_batch(sources), vocab.encode_batch(targets)
  split = TokenizedSplit([], [])
  for s, t in zip(source_ids, target_ids):
    if not s or not t:
      split.skipped_empty += 1
    elif max(len(s), len(t)) + 1 > max_length:
      split.skipped_long += 1
    else:
      split.sources.append(np.concatenate([np.asarray(s, dtype=np.int32), eos]))
      split.targets.append(np.concatenate([np.asarray(t, dtype=np.int32), eos]))
  return split


def batches_for_split(config, vocab, split: str, batch_multiple: int, shuffle: bool):
  """TokenBucketedBatches over a split, with the filtering logged."""
  sources, targets = text_pairs(config, split)
  tokenized = tokenize_for_training(sources, targets, vocab, config.dataset.max_length)
  logging.info("%s/%s: %d pairs kept, %d empty skipped, %d longer than %d tokens skipped",
               config.dataset.name, split, len(tokenized.sources), tokenized.skipped_empty,
               tokenized.skipped_long, config.dataset.max_length)
  boundaries = bucketing.bucket_boundaries(config.dataset.bucket_min_length,
                                           config.dataset.max_length, config.dataset.bucket_growth,
                                           config.dataset.bucket_quantum)
  return bucketing.TokenBucketedBatches(tokenized.sources, tokenized.targets, boundaries,
                                        config.tokens_per_batch, batch_multiple, config.seed,
                                        shuffle=shuffle)
