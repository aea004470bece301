"""Translating lists of sentences with a trained model: the bridge between the model's cached
decoding, the model-agnostic search in `decoding.py`, and the vocabulary.

Sentences are decoded in batches sorted by source length and put back in input order. No
sentence is dropped: an empty line translates to an empty line, and sources are padded to a
few fixed lengths (multiples of `LENGTH_QUANTUM`) so a test set compiles only a few shapes.
"""
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import traverse_util

from aiayn_flax import decoding, model as model_lib
from aiayn_flax.data import vocabulary

LENGTH_QUANTUM = 16


def make_decode_fn(model: model_lib.Transformer, beam_size: int, alpha: float,
                   extra_length: int):
  """jit-compiled (params, inputs [B, S]) -> tokens [B, S + extra_length], best hypothesis."""

  @jax.jit
  def decode(params, inputs):
    # inputs: [B, S] source ids ending in EOS, PAD after; B may include all-PAD rows.
    max_decode_len = inputs.shape[1] + extra_length
    source_lengths = jnp.sum(inputs != model_lib.PAD_ID, axis=1)  # [B]
    # Section 6.1: at most input length + 50; the batch's empty filler rows end at once.
    max_lengths = jnp.where(source_lengths > 0, source_lengths + extra_length, 1)
    memory = model.apply({"params": params}, inputs, method=model_lib.Transformer.encode)
    # One row per hypothesis: the model lays its cache out for beam_size beams per sentence.
    # The cache starts short and grows (each step's attention reads all of it).
    stages = decoding.CacheStages(cache_stage_lengths(max_decode_len),
                                  model_lib.grow_decode_cache)
    bos = jnp.full((inputs.shape[0] * beam_size, 1), model_lib.BOS_ID, jnp.int32)
    _, variables = model.apply({"params": params}, memory, inputs, bos, decode=True,
                               cache_length=stages.lengths[0],
                               method=model_lib.Transformer.decode, mutable=["cache"])
    # The encoder output's keys/values are fixed while decoding: they stay out of the loop
    # state.
    step_cache, fixed_cache = _split_cache(variables["cache"])

    def tokens_to_logits(ids, step_cache):
      # ids: [N, 1] -> logits [N, V]
      cache = traverse_util.unflatten_dict({**traverse_util.flatten_dict(step_cache),
                                            **fixed_cache})
      logits, updated = model.apply(
          {"params": params, "cache": cache}, None, inputs, ids, decode=True,
          method=model_lib.Transformer.decode, mutable=["cache"])
      return logits[:, 0], _split_cache(updated["cache"])[0]

    if beam_size == 1:
      return decoding.greedy_decode(tokens_to_logits, step_cache, max_lengths, max_decode_len,
                                    model_lib.BOS_ID, vocabulary.EOS_ID, cache_stages=stages)
    sequences, _ = decoding.beam_search(tokens_to_logits, step_cache, max_lengths, max_decode_len,
                                        model_lib.BOS_ID, vocabulary.EOS_ID, beam_size, alpha,
                                        reorder_cache=model_lib.reorder_decode_cache,
                                        num_results=1, cache_stages=stages)
    return sequences[:, 0]

  return decode


def cache_stage_lengths(max_decode_len: int, first: int = 16) -> tuple[int, ...]:
  """Cache lengths for decoding up to max_decode_len tokens: 16, 32, 64, ... while at most half
  of max_decode_len, then max_decode_len (16, 32, 66 for a 16-token source + 50)."""
  lengths = []
  while 2 * (length := first << len(lengths)) <= max_decode_len:
    lengths.append(length)
  return (*lengths, max_decode_len)


def _split_cache(cache):
  """The decoder's cache -> (the part a decoding step updates, as a nested dict; the
  cross-attention's fixed `memory_key_value` entries, as a flat dict)."""
  flat = traverse_util.flatten_dict(cache)
  fixed = {path: value for path, value in flat.items() if path[-1] == "memory_key_value"}
  updated = {path: value for path, value in flat.items() if path not in fixed}
  return traverse_util.unflatten_dict(updated), fixed


class Translator:
  """Translates lists of sentences; one compiled function per padded source length."""

  def __init__(self, model, params, vocab, *, beam_size: int = 1, alpha: float = 0.6,
               extra_length: int = 50, batch_size: int = 64, max_positions: int | None = None):
    self.params, self.vocab = params, vocab
    self.batch_size = batch_size
    self.max_positions = max_positions
    self._decode = make_decode_fn(model, beam_size, alpha, extra_length)
    self.extra_length = extra_length

  def translate(self, sentences: list[str], progress_every: int = 0) -> list[str]:
    """Translations in input order, one per sentence (empty in, empty out)."""
    encoded = self.vocab.encode_batch([s.strip() for s in sentences])
    source_ids = [ids + [vocabulary.EOS_ID] if ids else [] for ids in encoded]
    if self.max_positions:
      too_long = sum(len(s) + self.extra_length > self.max_positions for s in source_ids)
      if too_long:
        raise ValueError(f"{too_long} sentences are too long for the model's {self.max_positions} "
                         "learned positions (input + decode_extra_length)")
    order = sorted((i for i, ids in enumerate(source_ids) if ids), key=lambda i: len(source_ids[i]))
    outputs = [""] * len(sentences)
    start_time, done = time.time(), 0
    for start in range(0, len(order), self.batch_size):
      chunk = order[start:start + self.batch_size]
      longest = len(source_ids[chunk[-1]])
      length = -(-longest // LENGTH_QUANTUM) * LENGTH_QUANTUM
      inputs = np.zeros((self.batch_size, length), np.int32)  # fixed batch: one compile per length
      for row, i in enumerate(chunk):
        inputs[row, :len(source_ids[i])] = source_ids[i]
      tokens = np.asarray(self._decode(self.params, inputs))
      for row, i in enumerate(chunk):
        outputs[i] = self.vocab.decode(tokens[row])
      done += len(chunk)
      if progress_every and (done // progress_every > (done - len(chunk)) // progress_every
                             or done == len(order)):
        elapsed = time.time() - start_time
        logging.info("decoded %d/%d sentences (%.1f sentences/s, ETA %.0fs)", done, len(order),
                     done / elapsed, (len(order) - done) * elapsed / done)
    return outputs

