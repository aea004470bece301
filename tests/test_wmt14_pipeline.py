"""WMT14 through tfds, with tfds.testing.mock_data standing in for the download (offline): the
EN->DE direction picked by feature name, a vocabulary trained on a streamed sample, token-
bucketed batches within the budget, the tokenized cache; and the dry-run plan at paper scale."""
import io
import os
import pathlib
from contextlib import redirect_stdout

import numpy as np
import pytest
from etils import epath
import tensorflow as tf
import tensorflow_datasets as tfds

from aiayn_flax import devices, tasks
from aiayn_flax.planning import dry_run, flops
from aiayn_flax.data import bucketing, pipeline, ragged, source_text, tokenized, vocabulary
from aiayn_flax.data.ragged import EMPTY_ROW, RaggedIds
from configs import base, big, big_enfr

REPO = pathlib.Path(__file__).resolve().parents[1]

# Word-for-word translations with disjoint vocabularies: any word tells a sentence's language,
# so a swapped direction cannot go unnoticed.
ENGLISH = "the a house dog cat is was small big green and runs home today".split()
GERMAN = "das ein Haus Hund Katze ist war klein groß grün und läuft heim heute".split()
SPLIT_SIZES = {"train": 3000, "validation": 120, "test": 130}


def parallel_text(split: str) -> tuple[list[str], list[str]]:
  rng = np.random.default_rng(sorted(SPLIT_SIZES).index(split))
  english, german = [], []
  for _ in range(SPLIT_SIZES[split]):
    words = rng.integers(0, len(ENGLISH), rng.integers(2, 20))
    english.append(" ".join(ENGLISH[w] for w in words))
    german.append(" ".join(GERMAN[w] for w in words))
  return english, german


def fake_wmt14_split(self, split, decoders=None, read_config=None, shuffle_files=False):
  """Stands in for the builder's _as_dataset: examples shaped like wmt14_translate/de-en's."""
  del self, decoders, read_config, shuffle_files
  english, german = parallel_text(str(split))
  return tf.data.Dataset.from_tensor_slices({"de": german, "en": english})


@pytest.fixture
def mocked_wmt14():
  with tfds.testing.mock_data(as_dataset_fn=fake_wmt14_split):
    yield


def small_wmt14_config():
  config = base.get_config()
  config.dataset.update(vocab_sample_sentences=2000, max_length=128, bucket_growth=1.5)
  config.model.vocab_size = 300  # 256 byte pieces, the specials, the letters and some merges
  config.tokens_per_batch = 2048
  return config


def test_wmt14_text_pairs_are_english_to_german_in_file_order(mocked_wmt14):
  config = small_wmt14_config()
  for split in ("train", "validation", "test"):
    assert source_text.text_pairs(config, split) == parallel_text(split)
  config.dataset.target_lang = "fr"
  with pytest.raises(ValueError, match="not among them"):
    source_text.text_pairs(config, "validation")


def test_wmt14_batches_are_english_to_german_within_the_token_budget(mocked_wmt14, tmp_path):
  config = small_wmt14_config()
  vocab = pipeline.vocabulary_for(config, str(tmp_path), tasks.for_config(config))
  assert vocab.vocab_size == 300
  english, german = parallel_text("train")
  pairs = set(zip(english, german))
  batches = pipeline.batches_for_split(config, vocab, "train", batch_multiple=2, shuffle=True,
                                       task=tasks.for_config(config))
  seen = 0
  for _, batch in batches.iterate(num_epochs=1):
    assert batch["inputs"].shape == batch["targets"].shape
    assert batch["inputs"].size <= bucketing.padded_budget(config.tokens_per_batch)  # per side
    assert batch["inputs"].dtype == np.int32
    sources = vocab.decode_batch(batch["inputs"])
    targets = vocab.decode_batch(batch["targets"])
    for source, target in zip(sources, targets):
      if source:  # an empty row completes a bucket's last batch
        assert (source, target) in pairs  # EN in, DE out: fails if the sides were swapped
        seen += 1
  assert seen == len(english)  # max_length 128 keeps every pair (at most 19 words)


def test_a_trained_runs_vocabulary_is_read_without_preparing_any_dataset(mocked_wmt14, tmp_path,
                                                                        monkeypatch):
  """evaluate.py and translate.py read a run's vocabulary where its WMT14 is not prepared (a
  laptop with the workdir, a host whose data_dir is another): no download, no preparing."""
  from aiayn_flax import run_dir
  config = small_wmt14_config()
  trained = pipeline.vocabulary_for(config, str(tmp_path), tasks.for_config(config))

  def no_preparing(dataset):
    raise AssertionError(f"prepared {dataset.name} to read a vocabulary")
  monkeypatch.setattr(source_text, "prepare", no_preparing)
  config.dataset.data_dir = str(tmp_path / "nothing_prepared_here")
  vocab = run_dir.load_vocabulary(str(tmp_path), config)
  assert vocab.model_path == trained.model_path and vocab.vocab_size == 300


def test_vocabulary_sample_streams_a_seeded_uniform_draw_of_both_sides(mocked_wmt14):
  config = small_wmt14_config()
  sample = pipeline.vocabulary_sample(config, tasks.for_config(config))
  english, german = parallel_text("train")
  assert len(sample) == 2000 and set(sample) <= set(english) | set(german)
  assert pipeline.vocabulary_sample(config, tasks.for_config(config)) == sample  # reproducible
  english_set = set(english)
  from_english = sum(s in english_set for s in sample)
  assert 800 < from_english < 1200  # both sides, about equally


def test_streamed_sample_is_uniform_exact_and_in_stream_order():
  numbers = [str(i) for i in range(10_000)]
  chunks = [(numbers[i:i + 300], numbers[i + 300:i + 600]) for i in range(0, 10_000, 600)]
  stream = [s for sources, targets in chunks for s in sources + targets]
  assert stream == numbers
  sample = vocabulary.streamed_sample(iter(chunks), 1000, seed=0)
  assert len(set(sample)) == 1000
  positions = [int(s) for s in sample]  # the stream is 0, 1, 2, ... in order
  assert positions == sorted(positions)
  assert 350 < sum(int(s) < 5000 for s in sample) < 650  # not biased to either half
  assert vocabulary.streamed_sample(iter(chunks), 1000, seed=1) != sample
  assert vocabulary.streamed_sample(iter(chunks), 0, seed=0) == stream  # 0: everything
  assert sorted(vocabulary.streamed_sample(iter(chunks), 20_000, seed=0)) == sorted(stream)


def test_tokenized_splits_are_cached_beside_the_vocabulary(mocked_wmt14, tmp_path, monkeypatch):
  config = small_wmt14_config()
  vocab = pipeline.vocabulary_for(config, str(tmp_path), tasks.for_config(config))
  first = pipeline.batches_for_split(config, vocab, "validation", batch_multiple=1, shuffle=False,
                                       task=tasks.for_config(config))
  cached = os.listdir(tmp_path / tokenized.TOKENIZED_DIRNAME)
  assert len(cached) == 1 and cached[0].startswith("wmt14_translate_de-en-validation-")

  def no_tokenizing(*args, **kwargs):
    raise AssertionError("tokenized again instead of reading the cache")
  monkeypatch.setattr(tokenized, "_tokenize_chunks", no_tokenizing)
  again = pipeline.batches_for_split(config, vocab, "validation", batch_multiple=1, shuffle=False,
                                       task=tasks.for_config(config))
  for (_, a), (_, b) in zip(first.iterate(num_epochs=1), again.iterate(num_epochs=1)):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
    np.testing.assert_array_equal(a["targets"], b["targets"])
  config.dataset.max_length = 24  # another key: not the same cache
  with pytest.raises(AssertionError, match="tokenized again"):
    pipeline.batches_for_split(config, vocab, "validation", batch_multiple=1, shuffle=False,
                                       task=tasks.for_config(config))


def test_the_token_cache_is_read_memory_mapped_with_the_ids_written(tmp_path):
  rng = np.random.default_rng(0)
  sides = [ragged.from_parts([rng.integers(3, 37_000, 700, dtype=np.uint16)],
                             [np.full(100, 7, np.int64)], np.uint16) for _ in range(2)]
  path = tmp_path / "cache.npz"
  tokenized._write_tokenized(epath.Path(path), "key", tokenized.TokenizedSplit(*sides, 3, 4))
  read = tokenized._read_tokenized(epath.Path(path), "key")
  for written, mapped in zip(sides, (read.sources, read.targets)):
    assert isinstance(mapped.flat, np.memmap) and isinstance(mapped.offsets, np.memmap)
    np.testing.assert_array_equal(mapped.flat, written.flat)
    np.testing.assert_array_equal(mapped.offsets, written.offsets)
  assert (read.skipped_empty, read.skipped_long) == (3, 4)
  assert tokenized._read_tokenized(epath.Path(path), "another key") is None
  empty = ragged.from_parts([], [], np.uint16)  # a split with no pair left: nothing to map
  tokenized._write_tokenized(epath.Path(path), "key", tokenized.TokenizedSplit(empty, empty))
  assert len(tokenized._read_tokenized(epath.Path(path), "key").sources) == 0


def test_a_host_builds_exactly_its_rows_of_every_batch():
  rng = np.random.default_rng(1)
  lengths = rng.integers(1, 30, 400)
  ids = [ragged.from_parts([rng.integers(3, 99, int(lengths.sum()), dtype=np.uint16)],
                           [lengths], np.uint16) for _ in range(2)]
  stream = bucketing.TokenBucketedBatches(*ids, [8, 16, 32], 256, batch_multiple=4, seed=3)
  whole = list(stream.iterate(num_epochs=1))
  for host in range(2):  # host 1 of 2 holds rows [n/2, n) of each n-row batch
    rows_of = lambda n: np.arange(host * n // 2, (host + 1) * n // 2)  # noqa: E731
    for (position, full), (own_position, own) in zip(whole, stream.iterate(num_epochs=1,
                                                                           rows_of=rows_of)):
      assert position == own_position
      rows = rows_of(len(full["inputs"]))
      np.testing.assert_array_equal(own["inputs"], full["inputs"][rows])
      np.testing.assert_array_equal(own["targets"], full["targets"][rows])


def test_ragged_ids_read_like_a_list_of_arrays():
  ragged = RaggedIds(np.arange(10, dtype=np.uint16), np.array([0, 3, 3, 7, 10]))
  as_list = [np.arange(0, 3), np.arange(3, 3), np.arange(3, 7), np.arange(7, 10)]
  assert len(ragged) == 4
  for got, expected in zip(ragged, as_list):
    np.testing.assert_array_equal(got, expected)
  np.testing.assert_array_equal(ragged[-1], as_list[-1])
  assert [list(s) for s in ragged[1:3]] == [[], [3, 4, 5, 6]]
  np.testing.assert_array_equal(ragged.lengths(), [3, 0, 4, 3])
  with pytest.raises(IndexError):
    ragged[4]
  np.testing.assert_array_equal(ragged.padded_rows(np.array([2, EMPTY_ROW, 1, 0]), 5, pad_id=99),
                                [[3, 4, 5, 6, 99], [99] * 5, [99] * 5, [0, 1, 2, 99, 99]])
  with pytest.raises(ValueError, match="a sequence of 4 tokens does not fit rows of 3"):
    ragged.padded_rows(np.array([2]), 3, pad_id=0)


def test_big_enfr_is_big_with_the_papers_enfr_changes():
  config, reference = big_enfr.get_config(), big.get_config()
  assert config.dataset.name == "wmt14_translate/fr-en"
  assert (config.dataset.source_lang, config.dataset.target_lang) == ("en", "fr")
  assert config.model.vocab_size == 32000 and config.model.dropout_rate == 0.1
  assert config.model.d_model == reference.model.d_model == 1024
  assert config.num_train_steps == reference.num_train_steps == 300_000


def plan_for(config, device: str, count: int) -> dict:
  config.device, config.num_devices = device, count
  return dry_run.plan(config)


def test_dry_run_plans_base_on_8_v100_within_memory_and_the_token_budget():
  config = base.get_config()
  plan = plan_for(config, "v100", 8)
  assert plan["devices"] == "8 x v100" and plan["mesh"] == "data:8"
  assert plan["padded_tokens_per_batch"] == 31250  # 1.25 x 25,000 real tokens
  assert (plan["accumulation_steps"] * 8 * plan["micro_batch_tokens"]
          >= plan["padded_tokens_per_batch"])
  assert plan["micro_batch_tokens"] <= plan["max_micro_batch_tokens"]
  assert plan["fits_in_memory"] == "yes"
  assert plan["optimizer_state_bytes"] == 2 * 4 * plan["parameters"]  # Adam: two f32 moments
  assert plan["parameter_bytes"] == 4 * plan["parameters"]
  assert (plan["state_bytes_per_device"] + plan["activation_bytes_per_device"]
          <= plan["usable_memory_bytes"])
  # FLOPs and time follow flops.train_flops and the device's peak at the assumed MFU.
  rows, length = map(int, plan["flops_batch_shape"].split("x"))
  assert plan["flops_per_step"] == flops.train_flops(config.model, rows, length, length)
  assert rows * length <= plan["padded_tokens_per_batch"]
  peak = devices.kind("v100").peak_flops(config.model.dtype)
  assert plan["step_time_s"] > 0
  assert plan["mfu"] == 0.4 and plan["mfu_source"].startswith("assumed")  # none measured there
  assert plan["step_time_s"] == pytest.approx(plan["flops_per_step"] / (8 * peak * plan["mfu"]))
  assert plan["training_time_h"] == pytest.approx(plan["step_time_s"] * 100_000 / 3600)


@pytest.mark.parametrize("device,count", [("h100", 1), ("p100", 1), ("v100", 8), ("tpu_v3", 8)])
def test_dry_run_of_big_plans_the_papers_model_and_batch(device, count):
  plan = plan_for(big.get_config(), device, count)
  assert plan["parameters"] == pytest.approx(213e6, rel=0.02)  # Table 3: 213M
  assert plan["padded_tokens_per_optimizer_step"] == pytest.approx(31_250, rel=0.10)


def test_dry_run_accumulates_when_a_micro_batch_does_not_fit():
  config = big.get_config()
  plan = plan_for(config, "p100", 1)
  assert plan["accumulation_steps"] > 1
  assert (plan["accumulation_steps"] * plan["micro_batch_tokens"]
          >= bucketing.padded_budget(config.tokens_per_batch))
  assert plan["micro_batch_tokens"] <= plan["max_micro_batch_tokens"]
  assert plan["gradient_bytes"] == 2 * 4 * plan["parameters"]  # the accumulator too
  # an estimate, the trainer's first try: it compiles and chooses at start (no flag to pass)
  assert plan["accumulation_chosen_by"].startswith("train.py at start")
  config.micro_batch_tokens_per_device = 1000  # what the trainer will do, when set
  plan = plan_for(config, "p100", 1)
  assert plan["accumulation_steps"] == 32 and plan["micro_batch_tokens"] == 977  # 31,250 / 32


def test_dry_run_splits_the_state_over_the_model_axis():
  config = big.get_config()
  whole = plan_for(config, "a100", 8)
  config.mesh = "data:4,model:2"
  split = plan_for(config, "a100", 8)
  assert split["state_bytes_per_device"] == pytest.approx(whole["state_bytes_per_device"] / 2, 1e-6)
  assert split["activation_bytes_per_token"] < whole["activation_bytes_per_token"]


def test_scale_md_holds_the_table_the_dry_run_prints():
  out = io.StringIO()
  with redirect_stdout(out):
    dry_run.main(["--table"])
  table = out.getvalue().strip()
  assert table.count("\n") == 1 + 2 * (len(dry_run.TABLE_HARDWARE) + 1)
  assert "| base | 8 x P100 (paper, measured) | 8 | float32 |" in table
  assert table in (REPO / "docs" / "SCALE.md").read_text()


def test_prepare_data_prepares_a_tfds_dataset_and_says_where(mocked_wmt14, tmp_path):
  config = small_wmt14_config()
  config.dataset.data_dir = str(tmp_path)  # (tfds' mock reads its own metadata folder instead)
  assert source_text.prepare(config.dataset).startswith("wmt14_translate/de-en: prepared in /")
  config.dataset.name = "multi30k"
  assert source_text.prepare(config.dataset) == "multi30k: read from its files, nothing to prepare"
