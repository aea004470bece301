"""Translating lists of sentences with a trained model: the bridge between the model's cached
decoding, the model-agnostic search in `decoding/`, and the vocabulary.

Sentences are decoded in batches sorted by source length and put back in input order,
data-parallel over every device of every process (a pod slice, several GPU hosts): the
parameters are placed once, whole on each device, and each batch's rows are split over the
devices, the batch padded with empty rows to a multiple of them (rows are decoded
independently: the translations are those of one device). Every process takes part in every
batch, and every process gets all the translations. No sentence is dropped: an empty line
translates to an empty line, and sources are padded to a few fixed lengths (multiples of
`LENGTH_QUANTUM`) so a test set compiles only a few shapes.
"""
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import traverse_util
from jax.experimental import multihost_utils

from aiayn_flax import decoding, devices as devices_lib, model as model_lib, programs, sharding
from aiayn_flax.data import vocabulary

LENGTH_QUANTUM = 16


def make_decode_fn(model: model_lib.Transformer, beam_size: int, alpha: float,
                   extra_length: int, num_results: int | None = None,
                   constraint_for: Callable[[jax.Array, jax.Array], decoding.ConstrainLogProbs]
                   | None = None, devices: int = 1, compact: bool = True,
                   platform: str | None = None):
  """jit-compiled (params, inputs [B, S]) -> tokens [B, S + extra_length], best hypothesis;
  with `num_results` = n: (tokens [B, n, S + extra_length], scores [B, n]), the n best of a
  beam search (of width beam_size; width 1 is greedy search, and scores it).
  `constraint_for(inputs, max_lengths)` rewrites the log-probs the search reads (a parser's
  trees over the input's words, parsing/constrained.py); None: the model's. `compact`: once a
  quarter of the batch is left (`compacted_rows`, a multiple of the `devices` that split the
  rows), those sentences go on alone (decoding.Compaction): the same outputs, fewer rows.
  `platform`: that of the devices it will run on, where the caller knows them (the Translator:
  its mesh's); on "cpu" the trace takes the CPU's forms alone (devices_lib.traced_for). None:
  every platform's form is traced, as a deviceless compile for a TPU or GPU needs."""

  def decode(params, inputs):
    # inputs: [B, S] source ids ending in EOS, PAD after; B may include all-PAD rows.
    max_decode_len = inputs.shape[1] + extra_length
    source_lengths = jnp.sum(inputs != model_lib.PAD_ID, axis=1)  # [B]
    # Section 6.1: at most input length + 50; the batch's empty filler rows end at once.
    max_lengths = jnp.where(source_lengths > 0, source_lengths + extra_length, 1)
    # The cache starts short and grows (each step's attention reads all of it).
    stages = decoding.CacheStages(cache_stage_lengths(max_decode_len),
                                  model_lib.grow_decode_cache)
    step_cache, fixed_cache = start_decoding(model, params, inputs, beam_size, stages.lengths[0])
    tokens_to_logits_of = functools.partial(decoding_step, model, params)

    def tokens_to_logits_for(sentences):  # the step of those sentences alone
      return tokens_to_logits_of(*jax.tree.map(
          lambda x: decoding.take_sentences(x, sentences, inputs.shape[0]),
          (inputs, fixed_cache)))

    tokens_to_logits = tokens_to_logits_of(inputs, fixed_cache)
    rows = compacted_rows(inputs.shape[0], devices) if compact else 0
    compaction = (decoding.Compaction(rows, tokens_to_logits_for, groups=devices)
                  if rows and constraint_for is None else None)
    constrain_log_probs = constraint_for(inputs, max_lengths) if constraint_for else None
    if beam_size == 1 and num_results is None:
      return decoding.greedy_decode(tokens_to_logits, step_cache, max_lengths, max_decode_len,
                                    model_lib.BOS_ID, vocabulary.EOS_ID, cache_stages=stages,
                                    constrain_log_probs=constrain_log_probs,
                                    compaction=compaction)
    sequences, scores = decoding.beam_search(
        tokens_to_logits, step_cache, max_lengths, max_decode_len, model_lib.BOS_ID,
        vocabulary.EOS_ID, beam_size, alpha, reorder_cache=model_lib.reorder_decode_cache,
        num_results=num_results or 1, cache_stages=stages,
        constrain_log_probs=constrain_log_probs, compaction=compaction)
    return sequences[:, 0] if num_results is None else (sequences, scores)

  return jax.jit(decode if platform is None else devices_lib.traced_for(platform, decode))


def start_decoding(model, params, inputs, beam_size: int, cache_length: int):
  """Encodes `inputs` [B, S] and creates the decoding cache for beam_size rows per sentence
  (one per hypothesis, laid out by the model for that many beams) with room for
  cache_length positions: (the part a step updates, the cross-attention's fixed keys/values,
  which stay out of the loop state)."""
  memory = model.apply({"params": params}, inputs, method=model_lib.Transformer.encode)
  bos = jnp.full((inputs.shape[0] * beam_size, 1), model_lib.BOS_ID, jnp.int32)
  _, variables = model.apply({"params": params}, memory, inputs, bos, decode=True,
                             cache_length=cache_length, method=model_lib.Transformer.decode,
                             mutable=["cache"])
  return _split_cache(variables["cache"])


def decoding_step(model, params, inputs, fixed_cache):
  """The model's decoding step for these sentences: (ids [N, 1], step cache) -> (logits
  [N, V], the updated step cache)."""
  def tokens_to_logits(ids, step_cache):
    cache = traverse_util.unflatten_dict({**traverse_util.flatten_dict(step_cache),
                                          **fixed_cache})
    logits, updated = model.apply(
        {"params": params, "cache": cache}, None, inputs, ids, decode=True,
        method=model_lib.Transformer.decode, mutable=["cache"])
    return logits[:, 0], _split_cache(updated["cache"])[0]
  return tokens_to_logits


def compacted_rows(rows: int, devices: int = 1) -> int:
  """The sentences a decoding batch of `rows` goes on with once no more are left (0: none, the
  batch is too small to gain): a quarter of it, a multiple of the devices that split the rows.
  A quarter left the fewest row-steps on test2016 at 64 rows (82% of them decoding a sentence
  not yet ended, against 78% with a half and 63% without)."""
  quarter = -(-(rows // 4) // devices) * devices
  return quarter if 0 < quarter < rows else 0


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


def batch_rows(count: int, length: int, batch_size: int, max_tokens: int = 0) -> int:
  """Rows of a decoding batch of `count` sentences padded to `length`: the next power of two
  (a handful of compiled shapes, and a line typed alone is not padded to a full batch), at most
  batch_size, and at most max_tokens // length when a token budget is set."""
  limit = max(1, min(batch_size, max_tokens // length)) if max_tokens else batch_size
  return min(1 << max(count - 1, 0).bit_length(), limit)


class Translator:
  """Translates lists of sentences; one compiled function per padded batch shape.

  Batches hold at most `batch_size` sentences and, with `max_tokens`, at most that many padded
  source tokens. `num_results` = n makes `translate_nbest` available (the n best of the beam,
  with their scores) instead of `translate`. `constraint_for`: see make_decode_fn (a
  task's `decoding_constraint`). `mesh`: the devices that decode, all on its `data` axis
  (default: every device of every process, sharding.data_parallel_mesh). `compact=False`: every
  batch decoded whole to its end (see make_decode_fn; the same outputs, for benchmarks).
  """

  def __init__(self, model, params, vocab, *, beam_size: int = 1, alpha: float = 0.6,
               extra_length: int = 50, batch_size: int = 64, max_positions: int | None = None,
               max_tokens: int = 0, num_results: int | None = None,
               constraint_for=None, mesh=None, compact: bool = True):
    if num_results is not None and not 1 <= num_results <= beam_size:
      raise ValueError(f"--nbest={num_results}: must lie in [1, beam size {beam_size}]")
    self.mesh = sharding.data_parallel_mesh() if mesh is None else mesh
    self.params, self.vocab = params, vocab  # params: placed on the mesh once (the setter)
    self.batch_size, self.max_tokens = batch_size, max_tokens
    self.max_positions = max_positions
    self.num_results = num_results
    self._decode = programs.DecodingWithFallback(model, functools.partial(
        make_decode_fn, beam_size=beam_size, alpha=alpha, extra_length=extra_length,
        num_results=num_results, constraint_for=constraint_for,
        devices=sharding.data_parallel_size(self.mesh), compact=compact,
        platform=self.mesh.devices.flat[0].platform))
    self.extra_length = extra_length

  @property
  def params(self):
    return self._params

  @params.setter
  def params(self, params):
    self._params = None if params is None else replicated_on(self.mesh, params)

  def translate(self, sentences: list[str], progress_every: int = 0) -> list[str]:
    """Translations in input order, one per sentence (empty in, empty out)."""
    if self.num_results is not None:
      return [nbest[0][0] if nbest else "" for nbest in self.translate_nbest(sentences)]
    return self._translate(sentences, progress_every, lambda row, tokens: self.vocab.decode(
        tokens[row]), "")

  def translate_nbest(self, sentences: list[str]) -> list[list[tuple[str, float]]]:
    """For each sentence, its `num_results` best translations with their beam scores
    (log-probability / GNMT length penalty), best first; [] for an empty sentence."""
    if self.num_results is None:
      raise ValueError("translate_nbest needs a Translator made with num_results")

    def nbest(row, decoded):
      tokens, scores = decoded
      return [(self.vocab.decode(tokens[row, i]), float(scores[row, i]))
              for i in range(tokens.shape[1]) if np.isfinite(scores[row, i])]
    # (Results shared between processes come back as JSON lists: tuples again.)
    return [[tuple(result) for result in results]
            for results in self._translate(sentences, 0, nbest, [])]

  def batch_shapes(self, sentences: list[str]) -> set[tuple[int, int]]:
    """The padded input shapes (rows, length) that translating `sentences` decodes."""
    return {inputs.shape for _, inputs in self._batches(*self._sorted_source_ids(sentences))}

  def _sorted_source_ids(self, sentences):
    """(indices of the non-empty sentences, shortest first; every sentence's source ids)."""
    encoded = self.vocab.encode_batch([s.strip() for s in sentences])
    source_ids = [ids + [vocabulary.EOS_ID] if ids else [] for ids in encoded]
    if self.max_positions:
      too_long = sum(len(s) + self.extra_length > self.max_positions for s in source_ids)
      if too_long:
        raise ValueError(f"{too_long} sentences are too long for the model's {self.max_positions} "
                         "learned positions (input + decode_extra_length)")
    order = sorted((i for i, ids in enumerate(source_ids) if ids), key=lambda i: len(source_ids[i]))
    return order, source_ids

  def _translate(self, sentences, progress_every, result_of_row, empty_result):
    order, source_ids = self._sorted_source_ids(sentences)
    # Every process builds the same batches from the same list and places its devices' rows;
    # each batch is decoded by all the devices together and read whole by every process.
    rows_sharding = sharding.batch_sharding(self.mesh)
    total, done, start_time = len(order), 0, time.time()
    outputs = [empty_result] * len(sentences)
    for chunk, inputs in self._batches(order, source_ids):
      inputs = jax.make_array_from_callback(inputs.shape, rows_sharding,
                                            lambda index, inputs=inputs: inputs[index])
      decoded = whole_on_every_process(self._decode(self.params, inputs))
      for row, i in enumerate(chunk):
        outputs[i] = result_of_row(row, decoded)
      done += len(chunk)
      if progress_every and (done // progress_every > (done - len(chunk)) // progress_every
                             or done == total):
        elapsed = time.time() - start_time
        logging.info("decoded %d/%d sentences (%.1f sentences/s on %d device(s), ETA %.0fs)",
                     done, total, done / elapsed, self.mesh.size,
                     (total - done) * elapsed / done)
    return outputs

  def _batches(self, order: list[int], source_ids: list[list[int]]) -> list:
    """(sentence indices, inputs [rows, padded length]) of each decoding batch, in order."""
    batches, done = [], 0
    while done < len(order):
      # Sources are sorted by length, so a chunk's last is its longest: the rows a token
      # budget allows at that length also fit the (possibly shorter) chunk they cut.
      chunk = order[done:done + self.batch_size]
      rows = batch_rows(len(chunk), padded_source_length(len(source_ids[chunk[-1]])),
                        self.batch_size, self.max_tokens)
      chunk = chunk[:rows]
      # Empty rows up to a multiple of the data devices: each device decodes as many rows.
      devices = sharding.data_parallel_size(self.mesh)
      inputs = np.zeros((-(-rows // devices) * devices,
                         padded_source_length(len(source_ids[chunk[-1]]))), np.int32)
      for row, i in enumerate(chunk):
        inputs[row, :len(source_ids[i])] = source_ids[i]
      batches.append((chunk, inputs))
      done += len(chunk)
    return batches


def replicated_on(mesh, params):
  """The parameters whole on every device of the mesh, placed once for every batch to read (a
  jitted call given host arrays copies them to the devices at every call: 850 MB for big).
  Replicated rather than as training shards them: the paper's models fit one device (big's
  parameters are 0.85 GB in f32), and parameters split over `data` (FSDP) or `model` would be
  gathered or reduced over the devices at every one of a decoding's ~100 steps. Arrays spread
  over other hosts' devices (training on several hosts) are gathered first."""
  if any(isinstance(leaf, jax.Array) and not leaf.is_fully_addressable
         for leaf in jax.tree.leaves(params)):
    params = multihost_utils.process_allgather(params, tiled=True)
  everywhere = sharding.replicated(mesh)
  if jax.process_count() == 1:
    return jax.device_put(params, everywhere)
  return jax.tree.map(lambda x: jax.make_array_from_callback(
      np.shape(x), everywhere, lambda index: np.asarray(x)[index]), params)


def whole_on_every_process(decoded):
  """Numpy copies of a decoding's outputs (rows split over the mesh), whole on every process."""
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, decoded)
  return jax.tree.map(np.asarray, multihost_utils.process_allgather(decoded, tiled=True))


def padded_source_length(length: int) -> int:
  """The length a source of `length` tokens is padded to: a multiple of LENGTH_QUANTUM, so
  that a test set compiles few shapes."""
  return -(-length // LENGTH_QUANTUM) * LENGTH_QUANTUM
