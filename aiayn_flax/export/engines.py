"""Translating with an exported model folder through its engine, as a user would: CTranslate2's
Translator fed SentencePiece pieces, transformers' tokenizer and `generate`.

Our search limits each sentence to its source pieces + EOS + decode_extra_length tokens (EOS
included; section 6.1), EOS forbidden at the first step. Both engines take one limit per
call: with `exact_limits` the sentences go in groups of one source length, so that every
sentence has our limit and greedy search is the same search; without, each batch takes its
longest sentence's limit (what a user would set: the serving benchmark).
  * CTranslate2 (src/decoding.cc): max_decoding_length steps, the last one ending the
    hypothesis whatever it chose, so our limit minus one; min_decoding_length=1 disables EOS
    at step 0.
  * generate: max_new_tokens our limit, forced_eos_token_id ends the last step with EOS,
    min_new_tokens=1 (generation_config.json, written by the export).
Beam search is not the same search in either: their length penalty divides by length**alpha
(CTranslate2's length_penalty, generate's), ours by GNMT's ((5 + length) / 6)**alpha.
"""
import itertools
import json
import os

import sentencepiece as spm

from aiayn_flax.export import exporter, to_marian

DEFAULT_EXTRA_LENGTH = 50


def _extra_length(model_dir: str) -> int:
  record = os.path.join(model_dir, exporter.RECORD)
  if not os.path.exists(record):
    return DEFAULT_EXTRA_LENGTH
  with open(record, encoding="utf-8") as f:
    return json.load(f).get("decode_extra_length", DEFAULT_EXTRA_LENGTH)


def _groups(lengths: list[int], batch_size: int, exact_limits: bool) -> list[list[int]]:
  """Indices of the non-empty inputs in batches of at most batch_size, shortest first: of one
  length each with exact_limits."""
  order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: lengths[i])
  runs = ([list(g) for _, g in itertools.groupby(order, key=lambda i: lengths[i])]
          if exact_limits else [order])
  return [run[start:start + batch_size] for run in runs for start in range(0, len(run),
                                                                            batch_size)]


class CTranslate2Engine:
  """A CTranslate2 model folder (export.py --format=ctranslate2) on the CPU."""

  def __init__(self, model_dir: str, compute_type: str = "float32", threads: int = 0):
    import ctranslate2
    self.translator = ctranslate2.Translator(model_dir, device="cpu", compute_type=compute_type,
                                             intra_threads=threads)
    self.pieces = spm.SentencePieceProcessor(
        model_file=os.path.join(model_dir, "sentencepiece.model"))
    self.extra_length = _extra_length(model_dir)

  def translate(self, sentences: list[str], beam_size: int = 1, batch_size: int = 64,
                alpha: float = 0.6, exact_limits: bool = True) -> list[str]:
    pieces = self.pieces.encode([s.strip() for s in sentences], out_type=str)
    outputs = [""] * len(sentences)
    for batch in _groups([len(p) for p in pieces], batch_size, exact_limits):
      longest = max(len(pieces[i]) for i in batch) + 1  # + the EOS the engine appends
      results = self.translator.translate_batch(
          [pieces[i] for i in batch], beam_size=beam_size, length_penalty=alpha,
          max_batch_size=batch_size, max_decoding_length=longest + self.extra_length - 1,
          min_decoding_length=1)
      for i, result in zip(batch, results):
        outputs[i] = self.pieces.decode(result.hypotheses[0])
    return outputs


class MarianEngine:
  """A Marian model folder (export.py --format=marian) through transformers, on the CPU."""

  def __init__(self, model_dir: str, patch_epsilon: bool = True):
    from transformers import AutoTokenizer, MarianMTModel
    self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
    self.model = MarianMTModel.from_pretrained(model_dir).eval()
    if patch_epsilon:
      to_marian.set_layer_norm_epsilon(self.model)
    self.extra_length = _extra_length(model_dir)

  def translate(self, sentences: list[str], beam_size: int = 1, batch_size: int = 64,
                alpha: float = 0.6, exact_limits: bool = True) -> list[str]:
    texts = [s.strip() for s in sentences]
    lengths = [len(ids) - 1 if text else 0  # ids end in the EOS the tokenizer appends
               for text, ids in zip(texts, self.tokenizer(texts)["input_ids"])]
    outputs = [""] * len(sentences)
    for batch in _groups(lengths, batch_size, exact_limits):
      inputs = self.tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True)
      generated = self.model.generate(
          **inputs, num_beams=beam_size, length_penalty=alpha if beam_size > 1 else 1.0,
          max_new_tokens=max(lengths[i] for i in batch) + 1 + self.extra_length)
      for i, text in zip(batch, self.tokenizer.batch_decode(generated,
                                                             skip_special_tokens=True)):
        outputs[i] = text
    return outputs
