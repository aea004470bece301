"""Subword regularization (dataset.subword_sampling_alpha): sampled segmentations each epoch,
exact and reproducible, in the shapes of the plain ones; off, today's batches bit for bit.

On 2,000 Multi30k pairs (a user's own parallel text: configs/parallel_text.py) with a
500-piece unigram vocabulary, through the trainer's own entry (pipeline.batches_for_split).
"""
import hashlib
import itertools
import logging as std_logging

import numpy as np
import pytest

from aiayn_flax import tasks
from aiayn_flax.data import bucketing, pipeline, subword_sampling, text_files
from configs import parallel_text

# Computed with main's code at a65a994 (before subword sampling existed), by this file's
# batches_digest: the first 40 batches of epochs 0 and 1, and the plan digest.
TODAYS_BATCHES = "c2e1d58fbb1cb076e3109da2b31afeffacd8055ab9b14612c4cc7be0b5c4ede2"
TODAYS_PLAN = "8b3de6fdbaf4d35b8157eb06afa68864ad82d303535ecbcd95337e3df84127f0"


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory):
  """(config, vocabulary, task) of a tiny run on 2,000 Multi30k training pairs."""
  folder = tmp_path_factory.mktemp("corpus")
  for stem, name, count in (("train", "train", 2000), ("val", "dev", 40)):
    for language in ("en", "de"):
      lines = text_files.read_lines(str(shared_data / "multi30k" / f"{stem}.{language}.gz"))
      (folder / f"{name}.{language}").write_text("".join(f"{line}\n" for line in lines[:count]),
                                                 "utf-8")
  config = parallel_text.get_config(",".join(
      str(folder / f"{name}.{language}") for name in ("train", "dev") for language in ("en", "de")))
  config.model.vocab_size = 500
  config.dataset.update(vocab_model_type="unigram", max_length=48, bucket_min_length=24,
                        bucket_growth=2.0)
  config.tokens_per_batch = 512
  task = tasks.for_config(config)
  vocab = pipeline.vocabulary_for(config, str(folder / "run"), task)
  return config, vocab, task


def batches(corpus, alpha=0.0, **fields):
  config, vocab, task = corpus
  config = config.copy_and_resolve_references()
  if alpha:
    config.dataset.subword_sampling_alpha = alpha
  config.dataset.update(fields)
  return pipeline.batches_for_split(config, vocab, "train", 1, shuffle=True, task=task)


def batches_digest(stream, epochs=(0, 1), count=40) -> str:
  digest = hashlib.sha256()
  for epoch in epochs:
    for _, batch in itertools.islice(stream.iterate(bucketing.BatchPosition(epoch)), count):
      for key in sorted(batch):
        digest.update(f"{key}{batch[key].shape}{batch[key].dtype}".encode())
        digest.update(np.ascontiguousarray(batch[key]).tobytes())
  return digest.hexdigest()


def test_sampling_off_gives_todays_batches_and_plan_bit_for_bit(corpus):
  plain = batches(corpus)
  assert plain.sampling is None
  assert (batches_digest(plain), plain.plan_digest()) == (TODAYS_BATCHES, TODAYS_PLAN)


@pytest.fixture(scope="module")
def sampled(corpus):
  """Alpha 0.2 (sampled among the whole lattice), both sides, and its epochs 0 and 1."""
  stream = batches(corpus, 0.2)
  return stream, [stream.pairs(epoch) for epoch in (0, 1)]


def test_the_same_seed_and_epoch_give_the_same_segmentations_on_any_thread(corpus, sampled):
  config, vocab, _ = corpus
  stream, epochs = sampled
  again = batches(corpus, 0.2)  # another stream: its own threads, epoch 1 asked for first
  for side in (0, 1):
    assert subword_sampling.ids_digest(again.pairs(1)[side]) == subword_sampling.ids_digest(
        epochs[1][side])
    assert list(map(list, epochs[0][side])) != list(map(list, epochs[1][side]))
  setting = stream.sampling.setting
  plain = stream.sources[:300]
  one_thread, three_threads = (subword_sampling.sample_side(
      vocab, plain, setting, config.seed, 1, 0, threads=threads) for threads in (1, 3))
  assert list(map(list, one_thread)) == list(map(list, three_threads)) == list(
      map(list, stream.sampling.pairs(1)[0][:300]))  # (as sampled: some too long to train on)
  # The same text in other pieces, longer (alpha 0.2: about 1.3x on Multi30k, docs/TRAIN.md).
  assert [vocab.decode(ids) for ids in one_thread] == [vocab.decode(ids) for ids in plain]
  assert 1.1 < one_thread.lengths().sum() / plain.lengths().sum() < 1.6
  other_seed = subword_sampling.sample_side(vocab, plain, setting, config.seed + 1, 1, 0)
  assert list(map(list, other_seed)) != list(map(list, one_thread))


def test_sampled_epochs_keep_the_plain_shapes_and_see_every_pair_once(corpus, sampled):
  stream, epochs = sampled
  plain = batches(corpus)
  shapes = {(len(indices), boundary) for boundary, indices in plain.epoch(0)}
  for epoch, (sources, targets, lengths) in enumerate(epochs):
    batch_list = stream.epoch(epoch)
    seen = np.concatenate([indices for _, indices in batch_list])
    assert sorted(seen[seen >= 0].tolist()) == list(range(len(stream.sources)))
    assert {(len(indices), boundary) for boundary, indices in batch_list} <= shapes
    for boundary, indices in batch_list[:5]:
      assert stream.batch(boundary, indices, epoch)["inputs"].shape == (len(indices), boundary)
    # A sampled pair longer than max_length (48) is taken plain in that epoch, the rest sampled.
    raw = stream.sampling.pairs(epoch)
    too_long = np.maximum(raw[0].lengths(), raw[1].lengths()) > 48
    assert too_long.any() and lengths.max() <= 48
    for i in np.flatnonzero(too_long)[:5].tolist() + [int(np.argmin(too_long))]:
      expected = (stream.sources, stream.targets) if too_long[i] else raw
      assert [list(sources[i]), list(targets[i])] == [list(side[i]) for side in expected]


def test_a_fresh_stream_resumes_a_sampled_epoch_where_the_other_stopped(corpus, sampled):
  stream, _ = sampled
  start = bucketing.BatchPosition(1, len(stream.epoch(1)) - 3)  # 3 batches before epoch 2
  continued = itertools.islice(stream.iterate(bucketing.BatchPosition(1)), start.index, None)
  resumed = batches(corpus, 0.2).iterate(start)
  for (position, batch), (resumed_position, resumed_batch) in itertools.islice(
      zip(continued, resumed), 6):
    assert position == resumed_position
    for key in batch:
      np.testing.assert_array_equal(batch[key], resumed_batch[key])


def test_the_plan_digest_names_the_setting_and_validation_is_never_sampled(corpus, sampled):
  config, vocab, task = corpus
  stream, _ = sampled
  digests = {batches(corpus).plan_digest(), stream.plan_digest(),
             batches(corpus, 0.5).plan_digest(), batches(corpus, 0.2, subword_sampling_nbest=64)
             .plan_digest(), batches(corpus, 0.2, subword_sampling_sides="source").plan_digest()}
  assert len(digests) == 5
  source_only = batches(corpus, 0.2, subword_sampling_sides="source")
  sources, targets, _ = source_only.pairs(0)
  assert subword_sampling.ids_digest(targets) == subword_sampling.ids_digest(stream.targets)
  assert subword_sampling.ids_digest(sources) != subword_sampling.ids_digest(stream.sources)
  config = config.copy_and_resolve_references()
  config.dataset.subword_sampling_alpha = 0.2
  validation = pipeline.batches_for_split(config, vocab, "validation", 1, shuffle=False,
                                          task=task)
  assert validation.sampling is None
