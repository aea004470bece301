"""Parsing's training batches with each side padded to its own length (data/bucketing.py,
`dataset.pad_each_side`), on the treebank sample's real training pairs: the same examples in
the same order as one-sided padding, shorter sources, and the same loss on every batch."""
import jax
import numpy as np
import pytest

from aiayn_flax import tasks, train_step
from aiayn_flax.data import bucketing, pipeline, tokenized
from aiayn_flax.data.vocabulary import PAD_ID


@pytest.fixture(scope="module")
def parsing_train(shared_data, tmp_path_factory):
  from configs import parsing_sample
  config = parsing_sample.get_config()
  task = tasks.for_config(config)
  workdir = str(tmp_path_factory.mktemp("parse"))
  vocab = pipeline.vocabulary_for(config, workdir, task)
  return config, tokenized.split_ids(config, vocab, "train", task)


def both_ways(config, split, group: int = 1):
  make = lambda each: bucketing.TokenBucketedBatches(  # noqa: E731
      split.sources, split.targets, bucketing.boundaries_for(config.dataset),
      config.tokens_per_batch, 1, seed=5, group=group, pad_each_side=each,
      quantum=config.dataset.bucket_quantum)
  return make(False), make(True)


def test_the_parsing_configs_pad_each_side():
  from configs import multi30k, parsing, parsing_sample
  assert parsing.get_config().dataset.pad_each_side
  assert parsing_sample.get_config().dataset.pad_each_side
  assert not multi30k.get_config().dataset.pad_each_side  # translation: as before


def test_each_side_is_padded_to_its_own_length_with_the_same_examples(parsing_train):
  config, split = parsing_train
  one_sided, each_side = both_ways(config, split, group=4)
  assert one_sided.epoch(0) and len(one_sided.epoch(0)) == len(each_side.epoch(0))
  target_of_source_shape = {}
  source_slots = {False: 0, True: 0}
  for (boundary, indices), (same_boundary, same_indices) in zip(one_sided.epoch(0),
                                                                each_side.epoch(0)):
    assert boundary == same_boundary
    np.testing.assert_array_equal(indices, same_indices)  # same examples, same order
    old, new = one_sided.batch(boundary, indices), each_side.batch(boundary, indices)
    assert old["inputs"].shape == old["targets"].shape == (len(indices), boundary)
    for side in ("inputs", "targets"):
      width = new[side].shape[1]
      assert width <= boundary and width % config.dataset.bucket_quantum == 0
      np.testing.assert_array_equal(new[side], old[side][:, :width])  # cut padding only
      assert not (old[side][:, width:] != PAD_ID).any()
    # One target shape per source shape: the trainer stacks runs by the source's shape.
    shape = new["inputs"].shape
    assert target_of_source_shape.setdefault(shape, new["targets"].shape) == new["targets"].shape
    source_slots[False] += old["inputs"].size
    source_slots[True] += new["inputs"].size
  real = split.sources.lengths().sum()
  padding = {way: 1 - real / slots for way, slots in source_slots.items()}
  print(f"source padding: one-sided {padding[False]:.3f}, each side {padding[True]:.3f}")
  assert padding[False] > 0.5 and padding[True] < 0.42  # 0.568 and 0.382 on the sample
  assert each_side.padding_fraction() < one_sided.padding_fraction() - 0.08
  assert each_side.plan_digest() != one_sided.plan_digest()


def test_buckets_sharing_a_source_shape_get_distinct_ones():
  """Two buckets whose sources round to the same length with the same rows: the later one's
  source grows by the quantum, so that a run of one source shape has one target shape."""
  sources = np.array([7, 8, 12])  # all three round up to 8 (12 -> 16)
  targets = np.array([10, 20, 28])  # buckets 16, 24, 32
  sides = bucketing.side_lengths(sources[:2], targets[:2], [16, 24, 32], [4, 4, 4], 8)
  assert sides == [(8, 16), (16, 24), (32, 32)]
  assert bucketing.side_lengths(sources, targets, [16, 24, 32], [4, 3, 4], 8) == [
      (8, 16), (8, 24), (16, 32)]


def test_loss_with_each_side_padded_equals_one_sided_padding(parsing_train):
  """The encoder masks padded source positions: cutting them off changes no loss, on the
  sample's longest and shortest buckets' batches (a tiny model, no dropout)."""
  config, split = parsing_train
  config = config.copy_and_resolve_references()
  config.model.update(d_model=32, d_ff=64, num_heads=2, num_layers=1)
  model = train_step.make_model(config)
  params = train_step.init_params(model, 0)
  step = jax.jit(lambda batch: train_step.eval_step(params, batch, model=model,
                                                    label_smoothing=config.label_smoothing))
  one_sided, each_side = both_ways(config, split)
  chosen = {}  # one batch per bucket: every shape, the longest included
  for boundary, indices in one_sided.epoch(0):
    chosen.setdefault(boundary, indices)
  assert len(chosen) >= 8
  compared = 0
  for boundary, indices in sorted(chosen.items())[::3] + [sorted(chosen.items())[-1]]:
    old = step(one_sided.batch(boundary, indices))
    new = step(each_side.batch(boundary, indices))
    assert each_side.batch(boundary, indices)["inputs"].shape[1] < boundary or boundary <= 24
    assert float(old["tokens"]) == float(new["tokens"]) > 0
    np.testing.assert_allclose(float(new["loss_sum"]), float(old["loss_sum"]), rtol=2e-6)
    np.testing.assert_allclose(float(new["nll_sum"]), float(old["nll_sum"]), rtol=2e-6)
    compared += 1
  assert compared >= 4
