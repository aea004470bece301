"""The run's vocabulary as the SentencePiece model both engines' tokenizers load.

A translation run has one (WORKDIR/vocab.model, ids 0-3 fixed: PAD, EOS, UNK, BOS). The toy
reversal task has none: its ids are its symbols ("7 12 5" is [7, 12, 5]), so the export writes
them as a word-level SentencePiece model whose pieces ("▁7") have those very ids, and a user of
either engine tokenizes and detokenizes the toy's text as ours does.
"""
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from aiayn_flax import run_dir
from aiayn_flax.data import vocabulary

SPECIAL_PIECES = {vocabulary.PAD_ID: "<pad>", vocabulary.EOS_ID: "</s>",
                  vocabulary.UNK_ID: "<unk>", vocabulary.BOS_ID: "<s>"}


def symbols_model(vocab_size: int) -> bytes:
  """A word-level SentencePiece model: ids 0-3 the specials, id i >= 4 the word "i"."""
  model = sentencepiece_model_pb2.ModelProto()
  kinds = sentencepiece_model_pb2.ModelProto.SentencePiece
  for piece_id in range(vocab_size):
    piece = model.pieces.add()
    piece.score = 0.0
    if piece_id in SPECIAL_PIECES:
      piece.piece = SPECIAL_PIECES[piece_id]
      piece.type = kinds.UNKNOWN if piece_id == vocabulary.UNK_ID else kinds.CONTROL
    else:
      piece.piece = f"\u2581{piece_id}"
  trainer = model.trainer_spec
  trainer.model_type = sentencepiece_model_pb2.TrainerSpec.WORD
  trainer.vocab_size = vocab_size
  trainer.pad_id, trainer.eos_id = vocabulary.PAD_ID, vocabulary.EOS_ID
  trainer.unk_id, trainer.bos_id = vocabulary.UNK_ID, vocabulary.BOS_ID
  trainer.unk_surface = ""  # the toy's decoding drops <unk> (SentencePiece would write " ⁇ ")
  model.normalizer_spec.name = "identity"
  model.normalizer_spec.add_dummy_prefix = True
  return model.SerializeToString()


def sentencepiece_model(workdir: str, config) -> bytes:
  """The serialized SentencePiece model of the run in `workdir`, as evaluate.py reads the
  run's vocabulary (run_dir.load_vocabulary: present, of model.vocab_size pieces, our ids)."""
  vocab = run_dir.load_vocabulary(workdir, config)
  if config.dataset.name == "toy_reverse":
    return symbols_model(vocab.vocab_size)
  return vocab.model_proto


def pieces(proto: bytes) -> list[str]:
  """Every piece, in id order: the engines' vocabulary files."""
  processor = spm.SentencePieceProcessor(model_proto=proto)
  return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
