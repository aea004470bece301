"""The model of section 3: masks, positions, cached decoding, parameter counts."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import traverse_util

from aiayn_flax import decoding, flops, model as model_lib, translator
from configs import base, big, multi30k


def small_model(**overrides):
  cfg = multi30k.get_config().model
  cfg.update(vocab_size=50, d_model=32, d_ff=64, num_heads=4, num_layers=2, **overrides)
  return model_lib.Transformer(ml_collections.FrozenConfigDict(cfg))


def random_tokens(rng, batch, length, vocab=50):
  return jnp.asarray(rng.integers(4, vocab, (batch, length)), jnp.int32)


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_changing_padded_source_tokens_leaves_output_unchanged(pre_layer_norm):
  model = small_model(pre_layer_norm=pre_layer_norm)
  rng = np.random.default_rng(0)
  inputs = np.array(random_tokens(rng, 2, 9))
  targets = random_tokens(rng, 2, 6)
  params = model.init(jax.random.key(0), inputs, targets)
  inputs[:, 6:] = 0  # padding
  logits = model.apply(params, inputs, targets)
  changed = inputs.copy()
  changed[:, 6:] = 17  # a padded position's content must not matter...
  changed_mask_kept = model.apply(params, changed, targets)
  assert not np.array_equal(logits, changed_mask_kept)  # ...once it is no longer padding
  # Changing which token sits under padding: rebuild with PAD, then compare exactly.
  other = inputs.copy()
  other[:, 7] = 0
  np.testing.assert_array_equal(logits, model.apply(params, other, targets))


def test_padded_positions_are_masked_exactly():
  """Output at real positions does not depend on the padded tail's length (up to the rounding
  of matrix products of a different length)."""
  model = small_model()
  rng = np.random.default_rng(1)
  inputs = np.array(random_tokens(rng, 1, 5))
  targets = random_tokens(rng, 1, 4)
  params = model.init(jax.random.key(0), inputs, targets)
  short = model.apply(params, inputs, targets)
  padded = model.apply(params, np.pad(inputs, ((0, 0), (0, 7))), targets)
  np.testing.assert_allclose(short, padded, rtol=0, atol=1e-5)


def test_future_target_tokens_do_not_change_earlier_outputs():
  model = small_model()
  rng = np.random.default_rng(2)
  inputs = random_tokens(rng, 2, 7)
  targets = np.array(random_tokens(rng, 2, 8))
  params = model.init(jax.random.key(0), inputs, targets)
  logits = model.apply(params, inputs, targets)
  for t in range(7):
    changed = targets.copy()
    changed[:, t + 1:] = rng.integers(4, 50, changed[:, t + 1:].shape)
    # decoder input at position p is target p-1: outputs 0..t+1 depend on targets 0..t only
    np.testing.assert_array_equal(logits[:, :t + 2], model.apply(params, inputs, changed)[:, :t + 2])


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
  params = model.init(jax.random.key(0), inputs, targets)["params"]
  full = model.apply({"params": params}, inputs, targets)
  memory = model.apply({"params": params}, inputs, method=model_lib.Transformer.encode)
  decoder_inputs = model_lib.shift_right(targets)
  _, cache = model.apply({"params": params}, memory, inputs, decoder_inputs[:, :1], decode=True,
                         cache_length=7, method=model_lib.Transformer.decode, mutable=["cache"])
  cache = cache["cache"]
  for t in range(7):
    logits, updated = model.apply({"params": params, "cache": cache}, None, inputs,
                                  decoder_inputs[:, t:t + 1], decode=True, cache_length=7,
                                  method=model_lib.Transformer.decode, mutable=["cache"])
    cache = updated["cache"]
    np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5, rtol=0)


def test_beams_attending_to_one_copy_of_the_encoder_output_match_repeated_copies():
  """Beam search keeps the encoder's keys/values once per sentence: K query rows per sentence
  against them give the logits of K explicit copies."""
  model, beams = small_model(), 3
  rng = np.random.default_rng(4)
  inputs = np.array(random_tokens(rng, 2, 6))
  inputs[1, 4:] = 0
  params = model.init(jax.random.key(0), inputs, random_tokens(rng, 2, 5))["params"]
  memory = model.apply({"params": params}, inputs, method=model_lib.Transformer.encode)
  bos = jnp.full((2, 1), model_lib.BOS_ID, jnp.int32)
  _, cache = model.apply({"params": params}, memory, inputs, bos, decode=True, cache_length=5,
                         method=model_lib.Transformer.decode, mutable=["cache"])
  per_hypothesis, per_sentence = translator._split_cache(cache["cache"])
  shared = traverse_util.unflatten_dict(
      {**traverse_util.flatten_dict(decoding.expand_to_beams(per_hypothesis, beams)),
       **per_sentence})
  repeated = decoding.expand_to_beams(cache["cache"], beams)
  ids = random_tokens(rng, 2 * beams, 1)
  step = lambda c, source: model.apply(  # noqa: E731
      {"params": params, "cache": c}, None, source, ids, decode=True, cache_length=5,
      method=model_lib.Transformer.decode, mutable=["cache"])[0]
  np.testing.assert_allclose(step(shared, inputs), step(repeated, np.repeat(inputs, beams, 0)),
                             atol=1e-6, rtol=0)


def test_embedding_is_shared_and_tied():
  model = small_model()
  params = model.init(jax.random.key(0), jnp.ones((1, 3), jnp.int32), jnp.ones((1, 3), jnp.int32))
  embeddings = [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
                if "embedding" in jax.tree_util.keystr(path)]
  assert len(embeddings) == 1  # one matrix: encoder input, decoder input, output projection


TABLE3 = [("base", base.get_config().model), ("big", big.get_config().model)] + [
    (row, base.get_config(row).model) for row in base.TABLE3_ROWS]


@pytest.mark.parametrize("name,cfg", TABLE3, ids=[name for name, _ in TABLE3])
def test_parameter_count_matches_analytic_formula(name, cfg):
  model = model_lib.Transformer(ml_collections.FrozenConfigDict(cfg))
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.ones((1, 8), jnp.int32),
                          jnp.ones((1, 8), jnp.int32))
  counted = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  assert counted == flops.parameter_count(cfg)
  if name in base.PAPER_PARAMS_MILLIONS:  # the paper's Table 3 column, to within 7%
    assert abs(counted / 1e6 - base.PAPER_PARAMS_MILLIONS[name]) <= 0.07 * base.PAPER_PARAMS_MILLIONS[name]
