"""The model of section 3: masks, positions, cached decoding, parameter counts."""
import functools
import itertools
import jax
import jax.numpy as jnp
import ml_collections
from flax import linen as nn
import numpy as np
import pytest

from aiayn_flax import decoding, model as model_lib, translator
from aiayn_flax.attention import forms
from aiayn_flax.planning import flops
from aiayn_flax.data import vocabulary
from configs import base, big, multi30k


def small_model(**overrides):
  cfg = multi30k.get_config().model
  cfg.update({**dict(vocab_size=50, d_model=32, d_ff=64, num_heads=4, num_layers=2,
                     dtype="float32"), **overrides})
  return model_lib.Transformer(ml_collections.FrozenConfigDict(cfg))


def init(model, key, *inputs):
  """model.init as one compiled program: run op by op, its ~100 operations compile one by one
  (1.5-3 s of a test here)."""
  return jax.jit(model.init)(key, *inputs)


def compiled_apply(model, **fixed):
  """model.apply compiled (`fixed`: its keyword arguments that are not arrays), as the trainer
  and the translator run it, rather than op by op."""
  return jax.jit(functools.partial(model.apply, **fixed))


def random_tokens(rng, batch, length, vocab=50):
  return jnp.asarray(rng.integers(4, vocab, (batch, length)), jnp.int32)


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_padding_tokens_do_not_reach_real_positions(pre_layer_norm):
  """Padding is token 0, so "what sits under padding" is the PAD embedding row: replacing it
  by random values must leave every real position's logits exactly unchanged (but PAD's own
  logit, which the shared output projection computes from that row)."""
  model = small_model(pre_layer_norm=pre_layer_norm)
  rng = np.random.default_rng(0)
  inputs = np.array(random_tokens(rng, 2, 9))
  targets = np.array(random_tokens(rng, 2, 6))
  inputs[:, 6:] = 0  # source padding
  targets[1, 4:] = 0  # right padding: the causal mask already hides it from real positions
  params = nn.meta.unbox(init(model, jax.random.key(0), inputs, targets))
  table = params["params"]["shared_embedding"]["embedding"]
  apply = compiled_apply(model)
  new_row = jnp.asarray(rng.normal(0, 3, table.shape[1]), table.dtype)

  def with_row(token):  # the parameters with one embedding row replaced by new_row
    return {"params": {**params["params"], "shared_embedding": {
        "embedding": table.at[token].set(new_row)}}}

  real = targets != 0
  logits = np.asarray(apply(params, inputs, targets))[real]
  changed = np.asarray(apply(with_row(0), inputs, targets))[real]
  np.testing.assert_array_equal(logits[:, 1:], changed[:, 1:])
  # The same change reaches the real positions when those tokens are real (a control).
  unpadded = np.where(inputs == 0, 5, inputs)
  assert not np.array_equal(np.asarray(apply(params, unpadded, targets))[real][:, 1:],
                            np.asarray(apply(with_row(5), unpadded, targets))[real][:, 1:])


def test_padded_positions_are_masked_exactly():
  """Output at real positions does not depend on the padded tail's length (up to the rounding
  of matrix products of a different length)."""
  model = small_model()
  rng = np.random.default_rng(1)
  inputs = np.array(random_tokens(rng, 1, 5))
  targets = random_tokens(rng, 1, 4)
  params, apply = init(model, jax.random.key(0), inputs, targets), compiled_apply(model)
  short = apply(params, inputs, targets)
  padded = apply(params, np.pad(inputs, ((0, 0), (0, 7))), targets)
  np.testing.assert_allclose(short, padded, rtol=0, atol=1e-5)


def test_future_target_tokens_do_not_change_earlier_outputs():
  model = small_model()
  rng = np.random.default_rng(2)
  inputs = random_tokens(rng, 2, 7)
  targets = np.array(random_tokens(rng, 2, 8))
  params, apply = init(model, jax.random.key(0), inputs, targets), compiled_apply(model)
  logits = apply(params, inputs, targets)
  for t in range(7):
    changed = targets.copy()
    changed[:, t + 1:] = rng.integers(4, 50, changed[:, t + 1:].shape)
    # decoder input at position p is target p-1: outputs 0..t+1 depend on targets 0..t only
    np.testing.assert_array_equal(logits[:, :t + 2], apply(params, inputs, changed)[:, :t + 2])


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (7, 3), (50, 10), (123, 255)])
def test_sinusoidal_positions_follow_the_paper(pos, i):
  d = 512
  table = model_lib.sinusoidal_positions(200, d)
  np.testing.assert_allclose(table[pos, 2 * i], np.sin(pos / 10000 ** (2 * i / d)), atol=1e-6)
  np.testing.assert_allclose(table[pos, 2 * i + 1], np.cos(pos / 10000 ** (2 * i / d)), atol=1e-6)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_cached_decoding_matches_full_forward(positions):
  model = small_model(positions=positions)
  rng = np.random.default_rng(3)
  inputs = np.array(random_tokens(rng, 3, 9))
  inputs[0, 5:] = 0
  targets = random_tokens(rng, 3, 7)
  params = init(model, jax.random.key(0), inputs, targets)["params"]
  full = compiled_apply(model)({"params": params}, inputs, targets)
  memory = compiled_apply(model, method=model_lib.Transformer.encode)({"params": params}, inputs)
  decoder_inputs = model_lib.shift_right(targets)
  decode = compiled_apply(model, decode=True, cache_length=7,
                          method=model_lib.Transformer.decode, mutable=["cache"])
  _, cache = decode({"params": params}, memory, inputs, decoder_inputs[:, :1])
  cache = cache["cache"]
  for t in range(7):
    logits, updated = decode({"params": params, "cache": cache}, None, inputs,
                             decoder_inputs[:, t:t + 1])
    cache = updated["cache"]
    np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5, rtol=0)


@pytest.mark.parametrize("beams", [2, 4])
def test_beam_attention_computes_the_decoding_attention(beams):
  """A beam search's self-attention step reads its cache transposed and sums broadcast
  products (`_beam_attention`, faster on CPU): the same attention as the batched dots that
  greedy search keeps, on each layout of the same keys and values, under a mask of ancestries."""
  rng = np.random.default_rng(beams)
  batch, heads, slots, d_k = 3, 4, 7 * beams, 8
  q = jnp.asarray(rng.normal(size=(batch, beams, heads, d_k)), jnp.float32)
  keys = jnp.asarray(rng.normal(size=(batch, heads, slots, d_k)), jnp.float32)
  values = jnp.asarray(rng.normal(size=(batch, heads, slots, d_k)), jnp.float32)
  mask = rng.random((batch, 1, beams, slots)) < 0.4
  mask[..., 0] = True  # every hypothesis sees at least its first position
  expected = forms.decoding_step(q, keys, jnp.swapaxes(values, 2, 3), mask, None)
  got = forms.beam(q, jnp.swapaxes(keys, 2, 3), values, mask, None)
  assert got.shape == (batch, beams, heads, d_k)
  np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed, extra_length", [(0, 5), (2, 30)])
def test_translator_search_matches_the_plain_algorithm(seed, extra_length):
  """The translator's beam search keeps each sentence's encoder keys/values once and its
  self-attention keys/values in place (one slot per beam, reordering only the slot table), and
  its cache starts at 16 positions and grows (with extra_length 30, to 38). It must find what
  the plain algorithm finds: every hypothesis a separate row with its own full-length copy of
  everything, rows gathered from their parents at every step (`decoding.gather_beams`). So
  must its greedy search. The end-of-sentence row of the embedding is doubled, so that
  hypotheses end at different steps and the length penalty (alpha 2) changes what is found:
  an untrained model never ends one before its maximum length, where every alpha agrees."""
  model, beams = small_model(), 4
  rng = np.random.default_rng(seed)
  inputs = np.array(random_tokens(rng, 3, 8))
  inputs[1, 5:] = 0
  inputs[2, 2:] = 0
  params = init(model, jax.random.key(seed), inputs, random_tokens(rng, 3, 5))["params"]
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x.at[vocabulary.EOS_ID].multiply(2)
      if "embedding" in jax.tree_util.keystr(path) else x, params)
  max_decode_len = inputs.shape[1] + extra_length
  max_lengths = jnp.sum(inputs != 0, axis=1) + extra_length

  memory = compiled_apply(model, method=model_lib.Transformer.encode)({"params": params}, inputs)
  bos = jnp.full((3, 1), model_lib.BOS_ID, jnp.int32)
  _, cache = compiled_apply(model, decode=True, cache_length=max_decode_len,
                            method=model_lib.Transformer.decode, mutable=["cache"])(
                                {"params": params}, memory, inputs, bos)

  def every_row_its_own_sentence(ids, cache):  # rows are hypotheses, one beam each
    logits, updated = model.apply(
        {"params": params, "cache": cache["model"]}, None, cache["inputs"], ids, decode=True,
        cache_length=max_decode_len, method=model_lib.Transformer.decode, mutable=["cache"])
    return logits[:, 0], {"model": updated["cache"], "inputs": cache["inputs"]}

  plain_cache = {"model": cache["cache"], "inputs": jnp.asarray(inputs)}
  found = {}
  for alpha in (0.0, 2.0):
    expected, _ = decoding.beam_search(every_row_its_own_sentence, plain_cache, max_lengths,
                                       max_decode_len, model_lib.BOS_ID, vocabulary.EOS_ID,
                                       beams, alpha)
    decode = translator.make_decode_fn(model, beams, alpha, extra_length)
    np.testing.assert_array_equal(decode(params, inputs), expected[:, 0])
    found[alpha] = np.asarray(expected[:, 0])
  if extra_length == 30:  # the length penalty chose other hypotheses
    assert not np.array_equal(found[0.0], found[2.0])
  assert len({tuple(np.asarray(row)) for row in expected[:, 0]}) == 3  # not a degenerate case
  greedy = decoding.greedy_decode(every_row_its_own_sentence, plain_cache, max_lengths,
                                  max_decode_len, model_lib.BOS_ID, vocabulary.EOS_ID)
  np.testing.assert_array_equal(translator.make_decode_fn(model, 1, 0.6, extra_length)(
      params, inputs), greedy)
  if extra_length == 30:  # decoding went past the first stage of the cache
    assert np.sum(np.asarray(greedy) != 0, axis=1).max() > 16
    assert np.sum(np.asarray(expected[:, 0]) != 0, axis=1).max() > 16


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize("devices", [1, 2])
def test_compacted_decoding_finds_what_the_whole_batch_finds(beams, devices):
  """Once a quarter of the batch is left, the translator goes on with those sentences alone
  (gathered from a cache already grown to full length, and the encoder's output gathered
  for them): every output must be the whole batch's, and the compaction must have happened
  (sentences end at different steps; here their max lengths differ). With the rows split
  over 2 devices, each half keeps 2 of its own sentences, and waits until no more are left
  in either (here the second half's sentences end last)."""
  model = small_model()
  rng = np.random.default_rng(3)
  lengths = [1, 2, 3, 3, 4, 5, 7, 8, 2, 6, 1, 8, 3, 5, 2, 4]  # 16 sentences: 4 go on alone
  if devices == 2:  # the longer sources all in the second half: its sentences end last
    lengths.sort()
  inputs = np.array(random_tokens(rng, 16, 8))
  for row, length in enumerate(lengths):
    inputs[row, length:] = 0
  params = init(model, jax.random.key(3), inputs, random_tokens(rng, 16, 5))["params"]
  assert translator.compacted_rows(16, devices) == 4
  whole = translator.make_decode_fn(model, beams, 0.6, 20, compact=False)(params, inputs)
  compacted_fn = translator.make_decode_fn(model, beams, 0.6, 20, devices=devices)
  np.testing.assert_array_equal(compacted_fn(params, inputs), whole)
  output_lengths = np.sum(np.asarray(whole) != 0, axis=1)
  assert np.sum(output_lengths < output_lengths.max()) > 12  # most ended before the last
  # The compacted program runs a loop over 4 sentences' rows (16 * beams -> 4 * beams).
  hlo = compacted_fn.lower(params, inputs).as_text()
  assert f"tensor<{4 * beams}x1xi32>" in hlo


@pytest.mark.parametrize("max_decode_len, stages", [
    (20, (20,)), (32, (16, 32)), (66, (16, 32, 66)), (127, (16, 32, 127)),
    (178, (16, 32, 64, 178))])
def test_the_decoding_cache_doubles_from_16_and_ends_at_the_buffer_length(max_decode_len, stages):
  assert translator.cache_stage_lengths(max_decode_len) == stages


def test_embedding_is_shared_and_tied():
  model = small_model()
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.ones((1, 3), jnp.int32),
                          jnp.ones((1, 3), jnp.int32))
  embeddings = [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
                if "embedding" in jax.tree_util.keystr(path)]
  assert len(embeddings) == 1  # one matrix: encoder input, decoder input, output projection
  # Tied: no other parameter has a row or column per vocabulary entry, so the pre-softmax
  # projection can only be the embedding's (an own output matrix or bias would).
  by_vocabulary = [jax.tree_util.keystr(path) for path, leaf in
                   jax.tree_util.tree_flatten_with_path(params)[0]
                   if model.config.vocab_size in leaf.shape]
  assert by_vocabulary == [jax.tree_util.keystr(embeddings[0])], by_vocabulary


def paper_model(name: str):
  """The model config of a Table 3 row ("base", "big", or a row such as "C2")."""
  return big.get_config().model if name == "big" else base.get_config(
      "" if name == "base" else name).model


@pytest.mark.parametrize("name", base.PAPER_PARAMS_MILLIONS)
def test_parameter_count_is_the_papers(name):
  """flops.parameter_count counts the initialised model's shapes (eval_shape), so a new
  option needs no formula; here against the paper's Table 3 column, to within 7% (every row
  that has a count: D's and E's leave it blank)."""
  paper = base.PAPER_PARAMS_MILLIONS[name]
  assert abs(flops.parameter_count(paper_model(name)) / 1e6 - paper) <= 0.07 * paper


def _dropout(x, rate, key):
  return model_lib.Dropout(rate).apply({}, x, deterministic=False, rngs={"dropout": key})


def test_dropout_keeps_each_element_independently_with_probability_one_minus_rate():
  x = jnp.ones((1000, 1000), jnp.float32)
  out = np.asarray(_dropout(x, 0.1, jax.random.key(0)))
  kept = out != 0
  assert set(np.unique(out)) == {0.0, np.float32(1 / 0.9)}  # kept values are rescaled exactly
  # 1e6 Bernoulli(0.9) draws: the standard deviation of the mean is 3e-4.
  assert abs(kept.mean() - 0.9) < 1.5e-3
  # Neighbours (along rows and columns) and a second key's mask are independent: both kept
  # with probability 0.81.
  assert abs((kept[:, 1:] & kept[:, :-1]).mean() - 0.81) < 2e-3
  assert abs((kept[1:] & kept[:-1]).mean() - 0.81) < 2e-3
  other = np.asarray(_dropout(x, 0.1, jax.random.key(1))) != 0
  assert abs((kept & other).mean() - 0.81) < 2e-3
  # Same key, same mask; deterministic mode is the identity.
  np.testing.assert_array_equal(out, _dropout(x, 0.1, jax.random.key(0)))
  np.testing.assert_array_equal(
      model_lib.Dropout(0.1).apply({}, x, deterministic=True), x)


class _TwoDropouts(nn.Module):
  """Two dropout layers, the first called twice, on the same input."""
  @nn.compact
  def __call__(self, x):
    first = model_lib.Dropout(0.5)
    return (first(x, deterministic=False), first(x, deterministic=False),
            model_lib.Dropout(0.5)(x, deterministic=False))


def test_each_dropout_layer_and_call_draws_its_own_mask_from_one_key():
  """The masks' seeds come from one key's bits mixed with each module's path and call count
  (model._dropout_seed): different layers and calls, different masks; the same key, the same."""
  x = jnp.ones((64, 64))
  masks = [np.asarray(m) != 0
           for m in _TwoDropouts().apply({}, x, rngs={"dropout": jax.random.key(0)})]
  assert not (masks[0] == masks[1]).all() and not (masks[0] == masks[2]).all()
  for a, b in itertools.combinations(masks, 2):  # independent: agreeing on about half
    assert 0.45 < (a == b).mean() < 0.55
  again = _TwoDropouts().apply({}, x, rngs={"dropout": jax.random.key(0)})
  for mask, other in zip(masks, again):
    np.testing.assert_array_equal(mask, np.asarray(other) != 0)
  other_key = _TwoDropouts().apply({}, x, rngs={"dropout": jax.random.key(1)})
  assert not (masks[0] == (np.asarray(other_key[0]) != 0)).all()


def test_source_token_dropout_turns_real_tokens_into_unk_at_its_rate_and_only_in_training():
  tokens = np.full((400, 500), 7, np.int32)
  tokens[:, 400] = vocabulary.EOS_ID
  tokens[:, 401:] = vocabulary.PAD_ID
  dropout = model_lib.SourceTokenDropout(0.2)
  out = np.asarray(dropout.apply({}, jnp.asarray(tokens), deterministic=False,
                                 rngs={"dropout": jax.random.key(0)}))
  np.testing.assert_array_equal(out[:, 400:], tokens[:, 400:])  # EOS and padding stay
  assert set(np.unique(out[:, :400])) == {vocabulary.UNK_ID, 7}
  # 160,000 Bernoulli(0.2) draws: the standard deviation of the mean is 1e-3.
  assert abs((out[:, :400] == vocabulary.UNK_ID).mean() - 0.2) < 5e-3
  np.testing.assert_array_equal(
      dropout.apply({}, jnp.asarray(tokens), deterministic=True), tokens)


def test_the_encoder_reads_the_tokens_left_after_source_token_dropout():
  """With every real token dropped, the training forward pass is that of an all-<unk> input;
  at rate 0 it is that of the input."""
  cfg = base.model_config(vocab_size=32, d_model=16, d_ff=32, num_heads=2, num_layers=1,
                          dropout_rate=0.0, dtype="float32")
  inputs = jnp.array([[5, 6, 7, vocabulary.EOS_ID, 0]], jnp.int32)
  unknown = jnp.array([[vocabulary.UNK_ID] * 3 + [vocabulary.EOS_ID, 0]], jnp.int32)
  targets = jnp.array([[8, 9, vocabulary.EOS_ID]], jnp.int32)

  def logits(rate, source):
    cfg.source_token_dropout_rate = rate
    model = model_lib.Transformer(ml_collections.FrozenConfigDict(cfg))
    params = init(model, jax.random.key(0), inputs, targets)
    return compiled_apply(model, train=True)(params, source, targets,
                                             rngs={"dropout": jax.random.key(1)})

  # (the largest rate below 1: a token is kept with probability 2^-32)
  np.testing.assert_array_equal(logits(1 - 2 ** -33, inputs), logits(0.0, unknown))
  assert not np.array_equal(logits(0.0, inputs), logits(0.0, unknown))
