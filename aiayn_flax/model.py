"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), section 3, in Flax Linen.

Every module takes the model's `config` (the `model` block of a run's ConfigDict, frozen), so
the config file stays the single source of truth. Shapes: B batch, S source length, T target
length, H heads, K per-head query/key size (d_k), V per-head value size (d_v), D d_model.

Decoding (`decode=True`) uses an autoregressive cache (collection "cache"): each self-attention
layer appends its new key/value at the current step; each cross-attention layer projects the
encoder output to keys/values once, when the cache is created, and reuses them at every step.
Cached keys/values are stored heads-major, so that a decoding step's attention is a batch of
contiguous matrix products (the [B, L, H, K] layout made XLA transpose the whole cache at every
step). A decoding step may carry several hypotheses per sentence (beam search): N = B * beams
rows of decoder inputs, where B is the number of source sentences. Each sentence's beams attend
to its one copy of the encoder output, and its self-attention cache has one slot per beam
and position: at step t the hypothesis in beam k writes its key/value to slot k of position t,
and never moves it. The decoder's cache records, for each hypothesis and position, the slot
that holds its ancestor's key/value (`slots`); the queries of a sentence's beams attend to all
of its slots, masked to their own ancestry. So when beam search reorders hypotheses it moves
only that small table (`reorder_decode_cache`) instead of every layer's keys and values.
"""
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from aiayn_flax import decoding, devices
# head_dims is read here by the planning code and benches (model.head_dims)
from aiayn_flax.attention import (Dropout, MultiHeadAttention, SourceTokenDropout,  # noqa: F401
                                  _ones, _xavier, _zeros, causal_mask, head_dims, padding_mask)
# BOS is the decoder's first input; PAD (model.PAD_ID) marks padding for the loss
from aiayn_flax.data.vocabulary import BOS_ID, PAD_ID

LAYER_NORM_EPSILON = 1e-6

# Layer normalization (Ba et al., 2016), the residual blocks' (section 5.4). On a CPU and a TPU
# `LayerNorm` computes what flax.linen.LayerNorm computes, op for op and in its order (the
# statistics in float32, the variance as E[x^2] - E[x]^2 clipped at 0), with the same parameters,
# so checkpoints and every CPU result are unchanged. On a GPU the forward is the same and the
# backward is written out (`layer_norm_one_pass`): the reciprocal deviation is recomputed from
# the two saved row means where it is used (saved, XLA gave it a kernel of its own), the input's
# gradient is one formula over two row sums, and the scale's and bias's gradients one stacked
# column sum: base's step on an H100, counted deviceless, 80 kernels fewer (docs/PERFORMANCE.md).


class LayerNorm(nn.Module):
  """Over the last axis, the output in `dtype`, scale and bias float32. `form`
  (config model.layer_norm_implementation): "flax", "one_pass" (layer_norm_one_pass), or
  "auto", chosen where the program is lowered: one_pass on a GPU, flax elsewhere."""
  epsilon: float
  dtype: jnp.dtype
  scale_init: object
  bias_init: object
  form: str = "auto"

  @nn.compact
  def __call__(self, x):
    features = (x.shape[-1],)
    scale = self.param("scale", self.scale_init, features, jnp.float32)
    bias = self.param("bias", self.bias_init, features, jnp.float32)
    as_flax = functools.partial(layer_norm_as_flax, epsilon=self.epsilon, dtype=self.dtype)
    one_pass = functools.partial(layer_norm_one_pass, epsilon=self.epsilon, dtype=self.dtype)
    if self.form != "auto":
      return {"flax": as_flax, "one_pass": one_pass}[self.form](x, scale, bias)
    return devices.platform_dependent(x, scale, bias, cpu=as_flax, tpu=as_flax, default=one_pass)


def _row_means(x):
  """E[x] and E[x^2] over the last axis, float32, [...] each."""
  x = x.astype(jnp.float32)
  squares = jax.lax.square(x)  # before the means, as in Flax: the gradient's sums in its order
  return jnp.mean(x, -1), jnp.mean(squares, -1)


def _variance(mean, mean_of_squares):
  return jnp.maximum(0.0, mean_of_squares - jax.lax.square(mean))


def _reciprocal_deviation(mean, mean_of_squares, epsilon):
  """[..., 1], from [...] means."""
  return jax.lax.rsqrt(jnp.expand_dims(_variance(mean, mean_of_squares), -1) + epsilon)


def _normalized(x, scale, bias, epsilon, dtype):
  """(output, E[x], E[x^2]): flax.linen.LayerNorm's operations in its order
  (flax/linen/normalization.py), so that on a CPU values and gradients are its bits."""
  mean, mean_of_squares = _row_means(x)
  variance = jnp.expand_dims(_variance(mean, mean_of_squares), -1)
  y = x - jnp.expand_dims(mean, -1)
  multiplier = jax.lax.rsqrt(variance + epsilon)
  multiplier *= scale
  y *= multiplier
  y += bias
  return y.astype(dtype), mean, mean_of_squares


def layer_norm_as_flax(x, scale, bias, *, epsilon, dtype):
  return _normalized(x, scale, bias, epsilon, dtype)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _one_pass(x, scale, bias, epsilon, dtype):
  return layer_norm_as_flax(x, scale, bias, epsilon=epsilon, dtype=dtype)


def _one_pass_forward(x, scale, bias, epsilon, dtype):
  y, mean, mean_of_squares = _normalized(x, scale, bias, epsilon, dtype)
  return y, (x, mean, mean_of_squares, scale)


def _one_pass_backward(epsilon, dtype, saved, dy):
  x, mean, mean_of_squares, scale = saved
  deviation = _reciprocal_deviation(mean, mean_of_squares, epsilon)
  normalized = (x - jnp.expand_dims(mean, -1)) * deviation
  dy = dy.astype(jnp.float32)
  rows = tuple(range(1, x.ndim))  # of the stacked [2, ..., D] below
  d_scale, d_bias = jnp.sum(jnp.stack([dy * normalized, dy]), axis=rows)
  d_normalized = dy * scale
  d_mean = jnp.mean(d_normalized, -1, keepdims=True)
  d_projection = jnp.mean(d_normalized * normalized, -1, keepdims=True)
  dx = deviation * (d_normalized - d_mean - normalized * d_projection)
  return dx.astype(x.dtype), d_scale, d_bias


_one_pass.defvjp(_one_pass_forward, _one_pass_backward)


def layer_norm_one_pass(x, scale, bias, *, epsilon, dtype):
  """layer_norm_as_flax's values, with the backward written out (the GPU form)."""
  return _one_pass(x, scale, bias, epsilon, dtype)


def _layer_norm(config, dtype, name=None):
  return LayerNorm(epsilon=LAYER_NORM_EPSILON, dtype=dtype, scale_init=_ones("embed"),
                   bias_init=_zeros("embed"),
                   form=config.get("layer_norm_implementation", "auto"), name=name)


def sinusoidal_positions(length: int, d_model: int) -> np.ndarray:
  """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(same)."""
  position = np.arange(length, dtype=np.float64)[:, None]  # [L, 1]
  two_i = np.arange(0, d_model, 2, dtype=np.float64)  # [D/2]
  angle = position / np.power(10000.0, two_i / d_model)  # [L, D/2]
  table = np.zeros((length, d_model), dtype=np.float32)
  table[:, 0::2] = np.sin(angle)
  table[:, 1::2] = np.cos(angle)
  return table


class FeedForward(nn.Module):
  """Section 3.3: FFN(x) = max(0, x W1 + b1) W2 + b2."""
  config: object

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    h = nn.Dense(cfg.d_ff, dtype=dtype, kernel_init=_xavier("embed", "mlp"),
                 bias_init=_zeros("mlp"), name="inner")(x)
    return nn.Dense(cfg.d_model, dtype=dtype, kernel_init=_xavier("mlp", "embed"),
                    bias_init=_zeros("embed"), name="outer")(nn.relu(h))


class Residual(nn.Module):
  """Section 5.4: LayerNorm(x + Dropout(Sublayer(x))) (post-LN, the paper), or with
  `pre_layer_norm` x + Dropout(Sublayer(LayerNorm(x)))."""
  config: object

  @nn.compact
  def __call__(self, x, sublayer, *, deterministic: bool):
    cfg = self.config
    norm = _layer_norm(cfg, jnp.dtype(cfg.dtype))
    dropout = Dropout(cfg.dropout_rate)
    if cfg.pre_layer_norm:
      return x + dropout(sublayer(norm(x)), deterministic=deterministic)
    return norm(x + dropout(sublayer(x), deterministic=deterministic))


class EncoderLayer(nn.Module):
  config: object

  @nn.compact
  def __call__(self, x, source_mask, *, deterministic: bool):
    self_attention = MultiHeadAttention(self.config, site="encoder", name="self_attention")
    x = Residual(self.config, name="attention_residual")(
        x, lambda y: self_attention(y, None, source_mask, deterministic=deterministic),
        deterministic=deterministic)
    return Residual(self.config, name="ffn_residual")(
        x, FeedForward(self.config, name="ffn"), deterministic=deterministic)


class DecoderLayer(nn.Module):
  config: object

  @nn.compact
  def __call__(self, y, memory, target_mask, source_mask, *, deterministic: bool,
               decode: bool = False, cache_length: int = 0, position=None, beams: int = 1):
    self_attention = MultiHeadAttention(self.config, site="decoder", name="self_attention")
    cross_attention = MultiHeadAttention(self.config, site="cross", name="cross_attention")
    y = Residual(self.config, name="self_attention_residual")(
        y, lambda z: self_attention(z, None, target_mask, deterministic=deterministic,
                                    decode=decode, cache_length=cache_length,
                                    position=position, beams=beams),
        deterministic=deterministic)
    y = Residual(self.config, name="cross_attention_residual")(
        y, lambda z: cross_attention(z, memory, source_mask, deterministic=deterministic,
                                     decode=decode),
        deterministic=deterministic)
    return Residual(self.config, name="ffn_residual")(
        y, FeedForward(self.config, name="ffn"), deterministic=deterministic)


class PositionalEmbedding(nn.Module):
  """Adds positions (section 3.5; learned ones for Table 3 row E) and applies dropout."""
  config: object

  @nn.compact
  def __call__(self, x, offset, *, deterministic: bool):
    # x: [B, L, D]; offset: first position (the decoding step, else 0)
    cfg = self.config
    length = x.shape[1]
    if cfg.positions == "learned":
      table = self.param("positions", nn.with_logical_partitioning(
          nn.initializers.normal(0.02), (None, "embed")), (cfg.max_positions, cfg.d_model))
    elif cfg.positions == "sinusoidal":
      table = None
    else:
      raise ValueError(f"config.model.positions: unknown value {cfg.positions!r} "
                       "(expected 'sinusoidal' or 'learned')")
    if table is None:
      positions = jnp.asarray(sinusoidal_positions(length, cfg.d_model)) if isinstance(
          offset, int) and offset == 0 else _sinusoid_at(offset + jnp.arange(length), cfg.d_model)
    else:
      positions = jax.lax.dynamic_slice_in_dim(table, offset, length)
    x = x + positions[None].astype(x.dtype)
    return Dropout(cfg.dropout_rate)(x, deterministic=deterministic)


def _sinusoid_at(positions, d_model):
  """sinusoidal_positions for traced positions (decoding steps): [L] -> [L, D]."""
  two_i = jnp.arange(0, d_model, 2, dtype=jnp.float32)
  angle = positions[:, None].astype(jnp.float32) / jnp.power(10000.0, two_i / d_model)
  return jnp.stack([jnp.sin(angle), jnp.cos(angle)], axis=-1).reshape(len(positions), d_model)


class Encoder(nn.Module):
  config: object
  embed: nn.Module

  @nn.compact
  def __call__(self, inputs, *, deterministic: bool):
    # inputs: [B, S] token ids -> [B, S, D]
    cfg = self.config
    source_mask = padding_mask(inputs)
    inputs = SourceTokenDropout(cfg.source_token_dropout_rate, name="token_dropout")(
        inputs, deterministic=deterministic)
    x = self.embed(inputs) * math.sqrt(cfg.d_model)  # section 3.4
    x = PositionalEmbedding(cfg, name="positions")(x, 0, deterministic=deterministic)
    for i in range(cfg.num_layers):
      x = EncoderLayer(cfg, name=f"layer_{i}")(x, source_mask, deterministic=deterministic)
    if cfg.pre_layer_norm:
      x = _layer_norm(cfg, x.dtype, name="final_norm")(x)
    return x


class Decoder(nn.Module):
  config: object
  embed: nn.Module

  @nn.compact
  def __call__(self, decoder_inputs, memory, source_mask, *, deterministic: bool,
               decode: bool = False, cache_length: int = 0):
    # decoder_inputs: [B, T], or [N, 1] when decoding step by step (N = B * beams rows);
    # memory: [B, S, D] -> [B, T, V]
    cfg = self.config
    offset, beams = 0, 1
    if decode:
      beams = decoder_inputs.shape[0] // source_mask.shape[0]
      offset, target_mask = self._decoding_position_and_mask(decoder_inputs.shape[0], beams,
                                                             cache_length)
    else:
      target_mask = causal_mask(decoder_inputs.shape[1]) & padding_mask(decoder_inputs)
    y = self.embed(decoder_inputs) * math.sqrt(cfg.d_model)
    y = PositionalEmbedding(cfg, name="positions")(y, offset, deterministic=deterministic)
    for i in range(cfg.num_layers):
      y = DecoderLayer(cfg, name=f"layer_{i}")(
          y, memory, target_mask, source_mask, deterministic=deterministic, decode=decode,
          cache_length=cache_length, position=offset, beams=beams)
    if cfg.pre_layer_norm:
      y = _layer_norm(cfg, y.dtype, name="final_norm")(y)
    logits = self.embed.attend(y)  # pre-softmax projection tied to the embedding (3.4)
    return logits.astype(jnp.float32)  # [B, T, V]: softmax and loss in float32

  def _decoding_position_and_mask(self, n, beams, cache_length):
    """This step's position, and the self-attention mask [B, 1, beams, L * beams] of the
    hypotheses' ancestries: hypothesis k of sentence b sees slot j at position t (column
    t * beams + j) if its ancestor at t wrote there and t <= this step. Advances the cache's
    step counter and records the slot each hypothesis writes to at this step."""
    is_initialized = self.has_variable("cache", "step")
    step = self.variable("cache", "step", lambda: jnp.array(0, dtype=jnp.int32))
    slots = self.variable("cache", "slots", jnp.zeros, (n, cache_length), jnp.int32)  # [N, L]
    position = step.value
    if not is_initialized:
      return position, None
    cache_length = slots.value.shape[1]  # grow_decode_cache may have lengthened the cache
    own_slot = jnp.arange(n, dtype=jnp.int32) % beams  # [N]: beam k writes to slot k
    slots.value = jax.lax.dynamic_update_slice(slots.value, own_slot[:, None], (0, position))
    step.value = position + 1
    batch = n // beams
    is_slot = slots.value.reshape(batch, beams, cache_length, 1) == jnp.arange(
        beams)  # [B, beams, L, beams (slot)]
    written = (jnp.arange(cache_length) <= position)[:, None]  # [L, 1]
    return position, (is_slot & written).reshape(batch, 1, beams, cache_length * beams)


def grow_decode_cache(cache, length: int):
  """The decoding cache with room for `length` positions: each self-attention cache and the
  slot table padded with empty positions. Decoding can start with a short cache and grow it as
  the steps go on: a step's attention reads the whole cache, written or not."""
  def grow(path, x):
    axis = {"keys": 2, "values_transposed": 3, "keys_transposed": 3, "values": 2,
            "slots": 1}.get(path[-1])  # the position (x slot) axis: see _decoding_step
    if axis is None:
      return x
    slots_per_position = x.shape[axis] // cache["decoder"]["slots"].shape[1]  # beams, or 1
    padding = [(0, 0)] * x.ndim
    padding[axis] = (0, length * slots_per_position - x.shape[axis])
    return jnp.pad(x, padding)
  return traverse_util.path_aware_map(grow, cache)


def reorder_decode_cache(cache, parents):
  """Beam search's reordering of the decoding cache: hypothesis k of sentence b continues from
  hypothesis parents[b, k]. Keys/values stay in their slots; only the slot table (which slot
  holds each position of a hypothesis' ancestry) follows the parents."""
  decoder = dict(cache["decoder"])
  decoder["slots"] = decoding.gather_beams(decoder["slots"], parents)
  return {**cache, "decoder": decoder}


class Transformer(nn.Module):
  """Encoder-decoder with one embedding matrix for source, target and output (section 3.4)."""
  config: object

  def setup(self):
    cfg = self.config
    self.embed = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=jnp.dtype(cfg.dtype),
                          embedding_init=nn.with_logical_partitioning(
                              nn.initializers.normal(cfg.d_model ** -0.5), ("vocab", "embed")),
                          name="shared_embedding")
    self.encoder = Encoder(cfg, self.embed, name="encoder")
    self.decoder = Decoder(cfg, self.embed, name="decoder")

  def __call__(self, inputs, targets, *, train: bool = False):
    """Teacher-forced logits [B, T, V] for targets [B, T] (ending in EOS, padded with 0)."""
    memory = self.encode(inputs, train=train)
    return self.decode(memory, inputs, shift_right(targets), train=train)

  def encode(self, inputs, *, train: bool = False):
    return self.encoder(inputs, deterministic=not train)

  def decode(self, memory, inputs, decoder_inputs, *, train: bool = False, decode: bool = False,
             cache_length: int = 0):
    return self.decoder(decoder_inputs, memory, padding_mask(inputs), deterministic=not train,
                        decode=decode, cache_length=cache_length)


def shift_right(targets: jnp.ndarray) -> jnp.ndarray:
  """Decoder inputs: BOS followed by the targets without their last position."""
  bos = jnp.full((targets.shape[0], 1), BOS_ID, dtype=targets.dtype)
  shifted = jnp.concatenate([bos, targets[:, :-1]], axis=1)
  # Keep padding where the target is padding, so padded positions stay masked as keys.
  return jnp.where(targets == PAD_ID, PAD_ID, shifted)
