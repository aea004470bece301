"""Subword regularization (dataset.subword_sampling_alpha): sampled segmentations each epoch,
exact and reproducible, in the shapes of the plain ones; off, today's batches bit for bit.

On 2,000 Multi30k pairs (a user's own parallel text: configs/parallel_text.py) with a
500-piece unigram vocabulary, through the trainer's own entry (pipeline.batches_for_split). The
vocabulary is counted here (`counted_vocabulary`), not trained: sentencepiece's trainer may
choose other pieces in another version, which would change the digests below without a bug.
"""
import collections
import hashlib
import itertools
import math
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from sentencepiece import sentencepiece_model_pb2

from aiayn_flax import tasks
from aiayn_flax.runtime import stops
from conftest import REPO
from aiayn_flax.data import bucketing, pipeline, subword_sampling, text_files
from configs import parallel_text

# Computed with main's code at a65a994 (before subword sampling existed), by this file's
# batches_digest over the `corpus` fixture (its counted vocabulary): the first 40 batches of
# epochs 0 and 1, and the plan digest.
TODAYS_BATCHES = "54ef4738a3194ea1146a5bea0985a4c40aef4952845e613162e3d2ebe1fa5231"
TODAYS_PLAN = "a16de3d462a31a591f54840ea4d26ed7b70fbb8a39a6a0bc108d75b50c6c76ab"


@pytest.fixture(scope="module")
def corpus_files(shared_data, tmp_path_factory) -> str:
  """configs/parallel_text.py's argument: 2,000 Multi30k training pairs, 40 validation ones."""
  folder = tmp_path_factory.mktemp("corpus")
  for stem, name, count in (("train", "train", 2000), ("val", "dev", 40)):
    for language in ("en", "de"):
      lines = text_files.read_lines(str(shared_data / "multi30k" / f"{stem}.{language}.gz"))
      (folder / f"{name}.{language}").write_text("".join(f"{line}\n" for line in lines[:count]),
                                                 "utf-8")
  return ",".join(str(folder / f"{name}.{language}") for name in ("train", "dev")
                  for language in ("en", "de"))


def counted_vocabulary(sentences: list[str], size: int) -> bytes:
  """A unigram SentencePiece model of `size` pieces built by counting, a pure function of the
  sentences: the special ids and the 256 byte pieces of vocabulary.train_vocabulary's, every
  character, then the word beginnings and insides (up to 8 characters, "▁" + the word's) that
  cover the most characters, each piece weighed by log(its count / all pieces' counts)."""
  words = collections.Counter(word for line in sentences for word in line.split())
  spans, characters = collections.Counter(), collections.Counter()
  for word, count in words.items():
    text = "\u2581" + word
    for i, character in enumerate(text):
      characters[character] += count
      for j in range(i + 2, min(i + 8, len(text)) + 1):
        spans[text[i:j]] += count
  proto = sentencepiece_model_pb2.ModelProto()
  specials = [("<pad>", proto.SentencePiece.CONTROL), ("</s>", proto.SentencePiece.CONTROL),
              ("<unk>", proto.SentencePiece.UNKNOWN), ("<s>", proto.SentencePiece.CONTROL)]
  room = size - len(specials) - 256 - len(characters)
  covering = sorted(spans, key=lambda span: (-spans[span] * len(span), span))[:room]
  counts = {**characters, **{span: spans[span] for span in covering}}
  total = sum(counts.values())
  trainer = proto.trainer_spec
  trainer.model_type, trainer.vocab_size = trainer.UNIGRAM, size
  trainer.split_by_whitespace = trainer.byte_fallback = True
  trainer.pad_id, trainer.eos_id, trainer.unk_id, trainer.bos_id = 0, 1, 2, 3
  proto.normalizer_spec.name = "identity"  # as train_vocabulary's: text kept as it is
  proto.normalizer_spec.add_dummy_prefix = proto.normalizer_spec.escape_whitespaces = True
  proto.normalizer_spec.remove_extra_whitespaces = False
  for piece, kind in specials:
    proto.pieces.add(piece=piece, score=0.0, type=kind)
  for byte in range(256):
    proto.pieces.add(piece=f"<0x{byte:02X}>", score=0.0, type=proto.SentencePiece.BYTE)
  for piece in sorted(counts, key=lambda s: (-counts[s], s)):
    proto.pieces.add(piece=piece, score=math.log(counts[piece] / total))
  return proto.SerializeToString()


@pytest.fixture(scope="module")
def corpus(corpus_files, tmp_path_factory):
  """(config, vocabulary, task) of a tiny run on the 2,000 pairs, with a vocabulary counted on
  their training side (written where the run keeps its vocabulary: read, not trained)."""
  config = parallel_text.get_config(corpus_files)
  config.model.vocab_size = 500
  config.dataset.update(vocab_model_type="unigram", max_length=48, bucket_min_length=24,
                        bucket_growth=2.0)
  config.tokens_per_batch = 512
  task = tasks.for_config(config)
  workdir = tmp_path_factory.mktemp("run")
  training = [line for path in corpus_files.split(",")[:2] for line in text_files.read_lines(path)]
  (workdir / pipeline.VOCAB_FILENAME).write_bytes(counted_vocabulary(training, 500))
  vocab = pipeline.vocabulary_for(config, str(workdir), task)
  return config, vocab, task


def batches(corpus, alpha=0.0, seed=None, **fields):
  config, vocab, task = corpus
  config = config.copy_and_resolve_references()
  config.seed = config.seed if seed is None else seed
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


def test_the_same_seed_and_epoch_give_the_same_segmentations_and_the_same_text(
    corpus, sampled, monkeypatch):
  config, vocab, _ = corpus
  stream, epochs = sampled
  again = batches(corpus, 0.2)  # built again; epoch 1 drawn in 5 chunks, on 1 thread and on 3
  monkeypatch.setattr(subword_sampling, "_UNITS_PER_DRAW", 4096)
  for side in (0, 1):
    digests = []
    for threads, stream_drawn in ((1, stream), (3, again)):
      monkeypatch.setattr(subword_sampling, "DRAWING_THREADS", threads)
      digests.append(subword_sampling.ids_digest(stream_drawn.sampling.sample(1, side)))
    assert digests[0] == digests[1]
  monkeypatch.undo()
  for side in (0, 1):  # (the default chunks: epoch 1 as the stream drew it)
    assert subword_sampling.ids_digest(again.pairs(1)[side]) == subword_sampling.ids_digest(
        epochs[1][side])
    assert list(map(list, epochs[0][side])) != list(map(list, epochs[1][side]))
  other_seed = batches(corpus, 0.2, seed=config.seed + 1).sampling.sample(1, 0)
  assert subword_sampling.ids_digest(other_seed) != subword_sampling.ids_digest(
      stream.sampling.sample(1, 0))
  sources = stream.sampling.sample(1, 0)
  # The same text in other pieces, longer (alpha 0.2: 1.28x the plain source pieces with this
  # vocabulary, EOS counted, in epochs 0-2 alike).
  assert [vocab.decode(ids) for ids in sources] == [vocab.decode(ids) for ids in stream.sources]
  assert 1.15 < sources.lengths().sum() / stream.sources.lengths().sum() < 1.5
  assert [len(ids) for ids in sources] != [len(ids) for ids in stream.sources]


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
    raw = [stream.sampling.sample(epoch, side) for side in (0, 1)]
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
  two_best = batches(corpus, 0.2, subword_sampling_nbest=2)
  digests = {batches(corpus).plan_digest(), stream.plan_digest(),
             batches(corpus, 0.5).plan_digest(), two_best.plan_digest(),
             batches(corpus, 0.2, subword_sampling_sides="source").plan_digest()}
  assert len(digests) == 5
  # Among each word's 2 likeliest segmentations: the same text, fewer pieces than the lattice's.
  drawn = two_best.sampling.sample(0, 0)
  assert [vocab.decode(ids) for ids in drawn] == [vocab.decode(ids) for ids in stream.sources]
  assert (stream.sources.lengths().sum() < drawn.lengths().sum()
          < stream.sampling.sample(0, 0).lengths().sum())
  source_only = batches(corpus, 0.2, subword_sampling_sides="source")
  sources, targets, _ = source_only.pairs(0)
  assert subword_sampling.ids_digest(targets) == subword_sampling.ids_digest(stream.targets)
  assert subword_sampling.ids_digest(sources) != subword_sampling.ids_digest(stream.sources)
  config = config.copy_and_resolve_references()
  config.dataset.subword_sampling_alpha = 0.2
  validation = pipeline.batches_for_split(config, vocab, "validation", 1, shuffle=False,
                                          task=task)
  assert validation.sampling is None


# A tiny model on the 2,000 pairs: an epoch is about 16 steps of 4,096 tokens, so that a run killed
# at step 12 resumes from step 8 into epoch 0 and crosses into epoch 1 (sampled anew) at 16.
TINY_SAMPLED = [
    "--config.device=cpu", "--config.model.vocab_size=500", "--config.model.d_model=32",
    "--config.model.d_ff=64", "--config.model.num_heads=2", "--config.model.num_layers=1",
    "--config.dataset.vocab_model_type=unigram", "--config.dataset.max_length=48",
    "--config.dataset.bucket_min_length=24", "--config.dataset.bucket_growth=2.0",
    "--config.tokens_per_batch=4096", "--config.num_train_steps=20",
    "--config.checkpoint_every_steps=8", "--config.eval_every_steps=0",
    "--config.log_every_steps=4", "--config.checkpoint_asynchronously=false",
    "--config.dataset.subword_sampling_alpha=0.2"]
SAMPLED_EPOCH = re.compile(r"epoch (\d+): subword segmentations sampled .* digest (\w+)")


def train(corpus_files, workdir, signal_at=""):
  """train.py on the 2,000 pairs; the runs of a test share one compilation cache (beside their
  workdirs), so that only the first compiles."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop(stops.TEST_SIGNAL_VARIABLE, None)
  if signal_at:
    env[stops.TEST_SIGNAL_VARIABLE] = signal_at
  return subprocess.run(
      [sys.executable, "train.py", f"--workdir={workdir}",
       f"--config=configs/parallel_text.py:{corpus_files}", *TINY_SAMPLED,
       f"--config.compilation_cache_dir={workdir.parent / 'xla_cache'}"], cwd=REPO,
      capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow  # three train.py runs
def test_sigkill_then_resume_gives_the_uninterrupted_sampled_run(corpus_files, tmp_path):
  whole = train(corpus_files, tmp_path / "whole")
  assert whole.returncode == 0, whole.stderr[-3000:]
  killed = train(corpus_files, tmp_path / "killed", signal_at="SIGKILL:12")
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  resumed = train(corpus_files, tmp_path / "killed")
  assert resumed.returncode == 0 and "Resumed from step 8 of" in resumed.stderr, (
      resumed.stderr[-3000:])
  digest = re.compile(r"^params_digest: (\w+)$", re.M)
  assert digest.findall(resumed.stdout) == digest.findall(whole.stdout) != []
  # Epoch 1 was sampled by the resumed process alone, as the uninterrupted run sampled it.
  epochs = dict(SAMPLED_EPOCH.findall(whole.stderr))
  assert sorted(epochs) == ["0", "1"] and epochs["0"] != epochs["1"]
  assert dict(SAMPLED_EPOCH.findall(resumed.stderr)) == epochs
