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
  return config, tokenized.split_ids(config, vocab, "train", task), vocab


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
  config, split, _ = parsing_train
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
  config, split, _ = parsing_train
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


@pytest.fixture(scope="module")
def gold_and_mixed(parsing_train):
  """Gold and mixed-in pairs of real trees: the sample's validation pairs stand for the gold
  ones, its training pairs for the (larger) silver ones."""
  config, split, vocab = parsing_train
  from aiayn_flax.data import ragged
  gold = tokenized.split_ids(config, vocab, "validation", tasks.for_config(config))
  return config, len(gold.sources), len(split.sources), (
      ragged.concatenate([gold.sources, split.sources]),
      ragged.concatenate([gold.targets, split.targets]))


def test_the_mix_proportions_appear_in_the_batches(gold_and_mixed):
  config, gold, mixed, (sources, targets) = gold_and_mixed
  mix = bucketing.Mix(primary=gold, ratio=2.0, epochs=3)
  batches = bucketing.TokenBucketedBatches(sources, targets,
                                           bucketing.boundaries_for(config.dataset),
                                           config.tokens_per_batch, 1, seed=2, group=4,
                                           pad_each_side=True, mix=mix)
  per_epoch = round(2.0 * gold)
  seen_mixed = []
  for epoch in range(4):
    indices = np.concatenate([i for _, i in batches.epoch(epoch)])
    indices = indices[indices != bucketing.EMPTY_ROW]
    assert sorted(indices[indices < gold].tolist()) == list(range(gold))  # gold once each
    drawn = indices[indices >= gold]
    assert len(set(drawn.tolist())) == len(drawn)
    if epoch < 3:
      assert len(drawn) == per_epoch  # the ratio: two mixed-in trees per gold tree
      assert abs(len(drawn) / len(indices) - 2 / 3) < 0.002
      seen_mixed += drawn.tolist()
    else:
      assert len(drawn) == 0  # after mix_epochs: gold alone
  assert len(set(seen_mixed)) == len(seen_mixed) < mixed  # none drawn twice yet
  # And in the batches themselves: the rows are the examples' ids.
  boundary, first = batches.epoch(0)[0]
  rows = batches.batch(boundary, first)["targets"]
  for row, index in zip(rows, first):
    if index != bucketing.EMPTY_ROW:
      np.testing.assert_array_equal(row[:len(targets[index])], targets[index])


def test_mixed_examples_are_each_drawn_once_before_any_twice():
  mix = bucketing.Mix(primary=3, ratio=1.0)  # 3 of the 5 mixed examples per epoch
  draws = np.concatenate([mix.members(8, seed=0, epoch=e)[3:] for e in range(5)]) - 3
  assert sorted(draws[:5].tolist()) == sorted(draws[5:10].tolist()) == list(range(5))
  np.testing.assert_array_equal(mix.members(8, 0, 0)[:3], [0, 1, 2])
  np.testing.assert_array_equal(mix.members(8, 0, 1), mix.members(8, 0, 1))  # reproducible
  assert len(bucketing.Mix(primary=3, ratio=9.0).members(8, 0, 0)) == 8  # at most all of them
  assert len(bucketing.Mix(primary=3, ratio=1.0, epochs=2).members(8, 0, 2)) == 3


def test_a_resumed_mix_sees_the_same_batches(gold_and_mixed):
  config, gold, _, (sources, targets) = gold_and_mixed
  make = lambda: bucketing.TokenBucketedBatches(  # noqa: E731
      sources, targets, bucketing.boundaries_for(config.dataset), config.tokens_per_batch, 1,
      seed=4, pad_each_side=True, mix=bucketing.Mix(gold, 0.5, 2))
  whole = [batch for _, (_, batch) in zip(range(80), make().iterate())]
  stream = make().iterate()
  for _ in range(30):  # epochs of 21, 20, then 16 batches
    position, _ = next(stream)
  assert 1 <= position.epoch < 2  # the cut falls in the last mixed epoch, gold alone after
  resumed = [batch for _, (_, batch) in zip(range(50), make().iterate(position))]
  for expected, got in zip(whole[30:], resumed, strict=True):
    for side in ("inputs", "targets"):
      np.testing.assert_array_equal(expected[side], got[side])
  assert make().plan_digest() != bucketing.TokenBucketedBatches(
      sources, targets, bucketing.boundaries_for(config.dataset), config.tokens_per_batch, 1,
      seed=4, pad_each_side=True, mix=bucketing.Mix(gold, 0.25, 2)).plan_digest()


def test_silver_trees_reach_training_through_the_parsing_task(parsing_train, tmp_path):
  """configs/parsing_silver.py's mix: the task's "silver" split is the silver files' trees that
  pass the thresholds, and the training batches mix them in; the token cache follows the
  files' content and the thresholds."""
  import json
  from aiayn_flax.parsing import linearize, sentences
  from configs import parsing_silver
  config, split, vocab = parsing_train
  config = parsing_silver.get_config()
  gold_trees = sentences.split_trees(config.dataset, "validation")
  silver_file = tmp_path / "news.silver.jsonl"
  silver_file.write_text("".join(json.dumps(
      {"line": i, "words": tree.leaves(), "tree": linearize.evalb_line(tree), "by": "teacher",
       "log_prob_per_word": -5.0, "agreement": float(i % 100)}) + "\n"
      for i, tree in enumerate(gold_trees)))
  config.dataset.silver_files = str(silver_file)
  config.dataset.silver_min_agreement = 50.0
  task = tasks.for_config(config)
  (silver_sources, silver_targets), = task.text_pair_chunks(config, "silver")
  kept = [tree for i, tree in enumerate(gold_trees) if i % 100 >= 50]
  assert silver_sources == [" ".join(tree.leaves()) for tree in kept]
  assert silver_targets == [" ".join(linearize.linearize(tree, "words")) for tree in kept]
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / pipeline.VOCAB_FILENAME).write_bytes(open(vocab.model_path, "rb").read())
  vocab = pipeline.vocabulary_for(config, str(workdir), task)
  batches = pipeline.batches_for_split(config, vocab, "train", 1, True, task)
  assert batches.mix.primary == len(split.sources)
  assert len(batches.sources) == len(split.sources) + len(kept)  # none too long here
  assert batches.mix.ratio == config.dataset.mix_ratio and batches.mix.epochs > 0
  keys = {tokenized._cache_path_and_key(config, vocab, "silver", task)[1]}
  config.dataset.silver_min_agreement = 60.0
  keys.add(tokenized._cache_path_and_key(config, vocab, "silver", task)[1])
  silver_file.write_text(silver_file.read_text().replace('"agreement": 99.0', '"agreement": 9.0'))
  keys.add(tokenized._cache_path_and_key(config, vocab, "silver", task)[1])
  assert len(keys) == 3
  config.dataset.silver_files = str(tmp_path / "missing.silver.jsonl")
  with pytest.raises(FileNotFoundError, match="missing.silver.jsonl: no silver trees there"):
    list(task.text_pair_chunks(config, "silver"))


def test_long_pairs_are_counted_per_side(parsing_train):
  """configs/parsing_sample.py skips pairs of more than 256 pieces: on the sample, 9 training
  trees, each too long on the target side (a tree is about twice its sentence), one of them
  on the source side too."""
  config, split, _ = parsing_train
  assert split.skipped_long == 9 and split.long_targets == 9 and split.long_sources == 1
  assert split.long_sides() == " (1 too long on the source side, 9 on the target side)"
  assert len(split.sources) + split.skipped_long + split.skipped_empty == 3396


def test_a_run_saved_before_these_fields_resumes_as_it_was_trained():
  """A parsing run saved before issue 45's fields resumes with them at the values it trained
  with; the config file's new padding is the one difference, which the resumption names."""
  import copy
  from aiayn_flax.training import resume
  from configs import multi30k, parsing_sample
  for get_config in (parsing_sample.get_config, multi30k.get_config):
    current = resume.config_dict(get_config())
    saved = copy.deepcopy(current)
    for field in ("pad_each_side", "mix_split", "mix_ratio", "mix_epochs", "silver_files",
                  "silver_min_agreement", "silver_min_log_prob_per_word"):
      del saved["dataset"][field]
    expected = (["dataset.pad_each_side: False -> True"] if current["dataset"]["pad_each_side"]
                else [])
    assert resume.resume_conflicts(saved, current) == expected


def test_a_run_of_stacked_batches_holds_one_shape_on_both_sides():
  """With each side padded to its own length, batches of one source shape may differ in their
  targets' shape: the trainer's runs (stacked for several steps per call) must split there."""
  import numpy as np

  from aiayn_flax.training import trainer

  def batch(source_length, target_length):
    return {"inputs": np.zeros((4, source_length), np.int32),
            "targets": np.zeros((4, target_length), np.int32)}
  stream = iter(enumerate([batch(16, 24), batch(16, 24), batch(16, 32), batch(16, 32)]))
  runs = trainer.RunsOfOneShape(stream)
  assert [position for position, _ in runs.take(4)] == [0, 1]
  assert [position for position, _ in runs.take(2)] == [2, 3]  # (the trainer's stream is endless)
