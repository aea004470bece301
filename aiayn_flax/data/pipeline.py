"""A run's data, stage by stage, from a config's `dataset` block to the device:

  1. source text   source_text.py  sentence pairs of a split: tfds (streamed in chunks),
                                   Multi30k, text files, the toy task
  2. vocabulary    vocabulary.py   one SentencePiece model for both languages, trained on a
                                   bounded uniform sample of the training text (WORKDIR/vocab.model)
  3. token ids     tokenized.py    each split tokenized once and cached (WORKDIR/tokenized/)
  4. batches       bucketing.py    token-bucketed batches in an order that is a pure function
                                   of (seed, epoch, position), so that resume is exact; with
                                   subword sampling (subword_sampling.py), each training
                                   epoch's segmentations sampled anew, a function of (seed, epoch)
  5. device        prefetch.py     the trainer assembles the next batches on a background thread

With several processes (a pod slice, GPU hosts), stages 1-3 write their files once: process 0
prepares the tfds data, trains the vocabulary and tokenizes while the others wait, then they read
what it wrote (process_zero.first). Stage 4 is the same on every process: each builds the same
global batches (a pure function of seed and position) and hands over its own rows.

This module joins stages 1-4 for a config: `vocabulary_for` (1 -> 2) and `batches_for_split`
(1 -> 3 -> 4); the trainer takes it from there. Each is handed the run's task
(aiayn_flax/tasks/), which gives the text of stage 1, the pieces the vocabulary keeps whole and
the fields that change the token ids: the data layer knows no task.
"""
import functools

import jax
from absl import logging
from etils import epath

from aiayn_flax.runtime import paths, process_zero
from aiayn_flax.data import bucketing, ragged, subword_sampling, tokenized, toy, vocabulary

VOCAB_FILENAME = "vocab.model"


def vocabulary_for(config, workdir: str, task):
  """The run's shared vocabulary: loaded from the workdir, or trained on the training split.
  With several processes, process 0 prepares the data and trains it while the others wait,
  then they read it (process_zero.first): one process writes WORKDIR/vocab.model. A workdir's
  vocabulary is read without preparing any dataset (evaluate.py and translate.py on a trained
  run need none, and may run where the run's data_dir is not prepared). `task` None: read
  only (run_dir.load_vocabulary), an error where there is nothing to read."""
  if config.dataset.name == "toy_reverse":
    return toy.SymbolVocabulary(config.model.vocab_size)
  path = str(paths.workdir_path(workdir) / VOCAB_FILENAME)

  def make():
    if epath.Path(path).exists():
      return read()
    if task is None:
      raise FileNotFoundError(f"{path}: no vocabulary to read, and none is trained without a task")
    task.prepare_data(config)
    sentences = vocabulary_sample(config, task)
    logging.info("Training a %d-piece %s vocabulary on %d sentences", config.model.vocab_size,
                 config.dataset.vocab_model_type, len(sentences))
    built = vocabulary.train_vocabulary(
        sentences, path, config.model.vocab_size, config.dataset.vocab_model_type,
        character_coverage=config.dataset.vocab_character_coverage,
        user_defined_symbols=task.reserved_pieces(config))
    logging.info("vocabulary: built by process %d of %d: %s", jax.process_index(),
                 jax.process_count(), path)
    return built

  def read():
    logging.info("vocabulary: read %s on process %d of %d", path, jax.process_index(),
                 jax.process_count())
    return vocabulary.load_vocabulary(path)

  vocab = process_zero.first("vocabulary", make, read)
  if vocab.vocab_size != config.model.vocab_size:
    raise ValueError(f"{path} has {vocab.vocab_size} pieces but config.model.vocab_size is "
                     f"{config.model.vocab_size}; use a fresh workdir or set the config to match")
  return vocab


def vocabulary_sample(config, task) -> list[str]:
  """Training sentences (both sides) for the vocabulary: all of them, or
  `vocab_sample_sentences` of them drawn uniformly at random in one streaming pass over the
  training text (`vocabulary.streamed_sample`), seeded by config.seed."""
  chunks = task.text_pair_chunks(config, config.dataset.train_split)
  return vocabulary.streamed_sample(chunks, config.dataset.vocab_sample_sentences, config.seed)


def batches_for_split(config, vocab, split: str, batch_multiple: int, shuffle: bool, task,
                      group: int = 1):
  """TokenBucketedBatches over a split, with the filtering logged; token ids come from the
  workdir's cache after the first run (`tokenized.split_ids`). `group`: see
  `bucketing.epoch_batches`."""
  split_ids = _logged_split_ids(config, vocab, split, task)
  sources, targets, mix = split_ids.sources, split_ids.targets, None
  dataset = config.dataset
  if split == dataset.train_split and dataset.mix_split:
    # A second split mixed into training at dataset.mix_ratio (parsing: silver trees).
    mixed = _logged_split_ids(config, vocab, dataset.mix_split, task)
    sources = ragged.concatenate([sources, mixed.sources])
    targets = ragged.concatenate([targets, mixed.targets])
    mix = bucketing.Mix(len(split_ids.sources), dataset.mix_ratio, dataset.mix_epochs)
    logging.info("%s mixed into %s: %d of its %d pairs per epoch%s", dataset.mix_split, split,
                 len(mix.members(len(sources), config.seed, 0)) - mix.primary,
                 len(mixed.sources), f", for {mix.epochs} epochs" if mix.epochs else "")
  sampling, setting = None, subword_sampling.setting_for(dataset)
  if setting and split == dataset.train_split:  # (validation keeps the plain segmentation)
    sampling = functools.partial(subword_sampling.SampledEpochs, vocab, sources, targets,
                                 dataset, config.seed)
    logging.info("%s: subword segmentations sampled each epoch: %s", split, setting)
  return bucketing.TokenBucketedBatches(sources, targets, bucketing.boundaries_for(dataset),
                                        config.tokens_per_batch, batch_multiple, config.seed,
                                        shuffle=shuffle, group=group,
                                        pad_each_side=dataset.pad_each_side,
                                        quantum=dataset.bucket_quantum, mix=mix,
                                        sampling=sampling)


def _logged_split_ids(config, vocab, split: str, task) -> tokenized.TokenizedSplit:
  split_ids = tokenized.split_ids(config, vocab, split, task)
  logging.info("%s/%s: %d pairs kept, %d empty skipped, %d longer than %d tokens skipped%s",
               config.dataset.name, split, len(split_ids.sources), split_ids.skipped_empty,
               split_ids.skipped_long, config.dataset.max_length, split_ids.long_sides())
  return split_ids
