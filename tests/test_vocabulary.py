"""The shared SentencePiece vocabulary, trained on the real Multi30k training data."""
import collections
import os
import pathlib

import numpy as np
import pytest
import sentencepiece as spm

from aiayn_flax.data import vocabulary
from aiayn_flax.data.text_files import read_parallel_lines

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA_DIR = os.environ.get("AIAYN_DATA_DIR") or str(REPO_ROOT.parent / "shared" / "data")
MULTI30K_DIR = os.path.join(DATA_DIR, "multi30k")


def multi30k_lines(stem: str) -> list[str]:
  en, de = read_parallel_lines(
      os.path.join(MULTI30K_DIR, f"{stem}.en.gz"), os.path.join(MULTI30K_DIR, f"{stem}.de.gz"))
  return en + de


@pytest.fixture(scope="module")
def train_lines(shared_data) -> list[str]:
  return multi30k_lines("train")


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, train_lines) -> vocabulary.Vocabulary:
  model_path = str(tmp_path_factory.mktemp("vocab") / "multi30k.model")
  return vocabulary.train_vocabulary(train_lines, model_path, vocab_size=8000)


def test_vocabulary_has_the_requested_size(vocab):
  assert vocab.vocab_size == 8000
  assert vocabulary.load_vocabulary(vocab.model_path).vocab_size == 8000


def test_special_ids_are_fixed(vocab):
  special_ids = (vocabulary.PAD_ID, vocabulary.EOS_ID, vocabulary.UNK_ID, vocabulary.BOS_ID)
  assert special_ids == (0, 1, 2, 3)
  assert [vocab.piece(i) for i in range(4)] == ["<pad>", "</s>", "<unk>", "<s>"]


def test_decode_inverts_encode_on_every_test2016_line(vocab):
  lines = multi30k_lines("test_2016_flickr")
  assert len(lines) == 2000
  assert vocab.decode_batch(vocab.encode_batch(lines)) == lines
  assert all(vocab.decode(vocab.encode(line)) == line for line in lines)


def test_decode_inverts_encode_on_unseen_characters_and_odd_spacing(vocab):
  # Byte fallback and identity normalization: nothing becomes UNK, no space is lost.
  unusual = ["  leading", "trailing ", "two  spaces", "Noch mehr [Sicherheit]", "½ ´ 日本 🙂"]
  for text in unusual:
    assert vocab.decode(vocab.encode(text)) == text
    assert vocabulary.UNK_ID not in vocab.encode(text)


def test_encode_adds_no_eos_and_batches_agree(vocab):
  texts = ["A dog runs on the beach.", "Ein Hund läuft am Strand."]
  ids = vocab.encode_batch(texts)
  assert ids == [vocab.encode(text) for text in texts]
  assert all(vocabulary.EOS_ID not in row for row in ids)
  assert "".join(vocab.pieces(texts[0])).replace("▁", " ").strip() == texts[0]


def test_decode_stops_at_eos_and_skips_pad_and_bos(vocab):
  first, second = vocab.encode("A dog runs."), vocab.encode("A cat sleeps.")
  row = np.array([vocabulary.BOS_ID] + first + [vocabulary.EOS_ID] + second + [0, 0], np.int32)
  assert vocab.decode(row) == "A dog runs."
  padded = np.full((2, 16), vocabulary.PAD_ID, np.int32)
  padded[0, :len(first) + 1] = [vocabulary.BOS_ID] + first
  padded[1, :len(second) + 1] = second + [vocabulary.EOS_ID]
  assert vocab.decode_batch(padded) == ["A dog runs.", "A cat sleeps."]
  assert vocab.decode_batch([]) == []


def test_training_twice_gives_byte_identical_models(vocab, train_lines, tmp_path):
  again = vocabulary.train_vocabulary(train_lines, str(tmp_path / "again.model"), vocab_size=8000)
  assert pathlib.Path(again.model_path).read_bytes() == pathlib.Path(vocab.model_path).read_bytes()
  assert os.listdir(tmp_path) == ["again.model"]  # the temporary file was renamed, not left


def test_load_vocabulary_of_a_missing_path_names_it(tmp_path):
  missing = str(tmp_path / "nowhere" / "vocab.model")
  with pytest.raises(FileNotFoundError, match=missing):
    vocabulary.load_vocabulary(missing)


@pytest.mark.parametrize("kept", [0.5, 0.9])
def test_a_truncated_vocabulary_is_named_with_what_to_do(vocab, tmp_path, kept):
  model = pathlib.Path(vocab.model_path).read_bytes()
  truncated = tmp_path / "vocab.model"
  truncated.write_bytes(model[:int(len(model) * kept)])
  with pytest.raises(ValueError, match=f"^{truncated}: damaged, not a readable SentencePiece "
                     "model; restore it from a copy, or delete it and the tokenized/ folder"):
    vocabulary.load_vocabulary(str(truncated))


def test_load_vocabulary_refuses_other_special_ids(train_lines, tmp_path):
  model_path = tmp_path / "default_ids.model"
  with open(model_path, "wb") as model:  # sentencepiece's defaults: unk 0, bos 1, eos 2, no pad
    spm.SentencePieceTrainer.train(sentence_iterator=iter(train_lines[:2000]), model_writer=model,
                                   vocab_size=500, minloglevel=2)
  with pytest.raises(ValueError, match="special ids"):
    vocabulary.load_vocabulary(str(model_path))


def test_character_coverage_spells_the_rarest_characters_in_bytes(train_lines, tmp_path):
  lines = train_lines[:20000]
  counts = collections.Counter("".join(lines))
  rare = sorted(c for c, n in counts.items() if n == 1)
  assert rare  # Multi30k's captions hold a few characters seen once
  full, partial = (
      spm.SentencePieceProcessor(model_file=vocabulary.train_vocabulary(
          lines, str(tmp_path / f"{coverage}.model"), 2000,
          character_coverage=coverage).model_path)
      for coverage in (1.0, 0.9995))
  for character in rare:
    assert full.piece_to_id(character) != full.unk_id()  # a piece of its own
    assert partial.piece_to_id(character) == partial.unk_id()  # none: spelled in bytes
    assert all(piece.startswith("<0x") for piece in partial.encode(character, out_type=str)[1:])
  assert partial.decode(partial.encode(lines)) == lines
