"""Attention (section 3.2) and dropout (section 5.4), the Transformer's pieces below its layers.

Scaled dot-product and multi-head attention, with the autoregressive cache that decoding uses
(the layout is described in model.py's docstring), the padding and causal masks, the parameter
initializers with logical axis names, and the hashed-counter dropout that attention weights,
residuals and source tokens share. model.py builds the layers from these and re-exports the
names other code reads there (model.Dropout, model.head_dims, ...). Shapes as in model.py.
"""
import functools
import hashlib
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from aiayn_flax import devices
# EOS, PAD and UNK matter to source token dropout and the padding mask
from aiayn_flax.data.vocabulary import EOS_ID, PAD_ID, UNK_ID


def _xavier(*axes):
  """Glorot-uniform weights annotated with logical axis names; `aiayn_flax/sharding.py` maps
  the names (embed, heads, kv, mlp, vocab) to mesh axes. The model never names a device."""
  return nn.with_logical_partitioning(nn.initializers.xavier_uniform(), axes)


def _zeros(*axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def _ones(*axes):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), axes)



def head_dims(config) -> tuple[int, int]:
  """(d_k, d_v) per head; 0 in the config means d_model / h as in the paper."""
  default = config.d_model // config.num_heads
  return config.qk_dim or default, config.v_dim or default


def padding_mask(tokens: jnp.ndarray) -> jnp.ndarray:
  """[B, L] token ids -> [B, 1, 1, L] True where a key is a real token."""
  return (tokens != PAD_ID)[:, None, None, :]


def causal_mask(length: int) -> jnp.ndarray:
  """[1, 1, L, L] True where key position <= query position (section 3.2.3)."""
  return jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))[None, None]


def _mix32(x):
  """A 32-bit integer hash with full avalanche (the "lowbias32" finalizer, C. Wellons)."""
  x = (x ^ (x >> 16)) * jnp.uint32(0x7FEB352D)
  x = (x ^ (x >> 15)) * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


# "one_key", as below; "make_rng": a threefry fold per layer, as until 2026-11-28 (a benchmark
# counts the two against each other).
DROPOUT_SEEDS = "one_key"


def _dropout_seed(module: nn.Module):
  """Two uint32 words for one call of `module`, distinct per module and call. Flax's make_rng
  would fold the module's path into the key with threefry, in small kernels of their own
  (three per dropout layer on a GPU, 96 of base's step); here the apply's "dropout" key is
  hashed into bits once (the same computation in every module, which XLA computes once) and
  mixed with a hash of the path and call count that Python computes when tracing, in integer
  operations that XLA fuses into the masking."""
  rngs = module.scope.rngs
  if "dropout" not in rngs or DROPOUT_SEEDS == "make_rng":  # Flax's error, or its way
    return jax.random.bits(module.make_rng("dropout"), (2,), jnp.uint32)
  module.scope.rng_counters["dropout"] += 1  # as make_rng counts a module's calls
  digest = hashlib.sha1(repr((rngs["dropout"].suffix,
                              module.scope.rng_counters["dropout"])).encode()).digest()
  path_words = np.frombuffer(digest[:8], np.uint32)
  key_words = jax.random.bits(rngs["dropout"].rng, (2,), jnp.uint32)
  return _mix32(key_words ^ path_words)


def _dropped(shape, rate: float, module: nn.Module):
  """A [shape] bool mask, True with probability `rate`: Dropout's hashed counter bits."""
  seed = _dropout_seed(module)
  counter = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  bits = _mix32(_mix32(counter ^ seed[0]) + seed[1])
  return bits < jnp.uint32(min(round(rate * 2 ** 32), 2 ** 32 - 1))


class Dropout(nn.Module):
  """Inverted dropout whose random bits are a counter-based hash of each element's index, keyed
  by two words drawn from the "dropout" rng: a few integer operations that XLA fuses into the
  masking, where nn.Dropout's threefry bits cost 2-8% of a training step on CPU (measured
  in docs/PERFORMANCE.md). The mask depends on the element's index in the whole array, not on how
  the array is sharded. The drop probability is rate rounded to a multiple of 2^-32."""
  rate: float

  @nn.compact
  def __call__(self, x, *, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    if x.size >= 2 ** 32:
      raise ValueError(f"Dropout: {x.size} elements overflow its 32-bit element counter")
    return jnp.where(_dropped(x.shape, self.rate, self), jnp.zeros_like(x),
                     x / jnp.asarray(1.0 - self.rate, x.dtype))


class SourceTokenDropout(nn.Module):
  """In training, each source token but padding and EOS becomes <unk> with probability `rate`:
  the model learns to read a word from its context too, as it must for words unseen in a
  small training set (word dropout, as parsers trained on one treebank use it)."""
  rate: float

  @nn.compact
  def __call__(self, tokens, *, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return tokens
    real = (tokens != PAD_ID) & (tokens != EOS_ID)
    return jnp.where(real & _dropped(tokens.shape, self.rate, self), UNK_ID, tokens)


def attention(q, k, v, mask, dropout_rate, deterministic, module):
  """Scaled dot-product attention (equation 1) with the softmax in float32."""
  # q: [B, Q, H, K]; k: [B, H, L, K]; v: [B, H, L, V] (heads-major); mask: broadcastable to
  # [B, H, Q, L]
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  logits = jnp.einsum("bqhk,bhlk->bhql", q, k).astype(jnp.float32)  # [B, H, Q, L]
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  module.sow("intermediates", "attention_weights", weights)  # for the paper's figures 3-5
  weights = Dropout(dropout_rate)(weights, deterministic=deterministic)
  return jnp.einsum("bhql,bhlv->bqhv", weights.astype(v.dtype), v)  # [B, Q, H, V]


def fused_attention(q, k, v, mask, implementation: str):
  """Equation 1 through jax.nn.dot_product_attention (cuDNN's fused kernel with
  implementation="cudnn"), for training, where sequences are padded at their end: a key
  padding mask [B, 1, 1, L] becomes each row's key count, a causal mask [B, 1, Q, L] (the
  decoder's, whose padding keys follow every real query) `is_causal`. No attention dropout,
  no weights sown. q, k, v: [B, L, H, K] (not heads-major); returns [B, Q, H, V]."""
  if mask.shape[-2] == 1:  # padding keys only
    lengths = jnp.sum(mask[:, 0, 0, :], axis=-1, dtype=jnp.int32)
    return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths,
                                        implementation=implementation)
  return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)


# Sequence lengths Pallas's Triton kernels take: a power of two up to their 128-row block, a
# multiple of 128 beyond (jax.experimental.pallas.ops.gpu.attention).
def pallas_length(length: int) -> int:
  return 1 << (length - 1).bit_length() if length <= 128 else -(-length // 128) * 128


def pallas_attention(q, k, v, mask, cross: bool, interpret: bool):
  """Equation 1 for training's attention as Pallas's flash-attention kernels (on a GPU, Triton:
  one kernel forward, two backward, where XLA launches 20-30), for sequences padded at their
  end. The kernel masks by segment ids (one array for queries and keys) or causally, so: the
  encoder's key padding mask [B, 1, 1, L] becomes segment ids (1 real, 0 padding: a real query
  sees the real keys, as with the mask); the decoder's causal mask [B, 1, L, L] `causal` (its
  padding keys follow every real query); cross-attention's key padding [B, 1, 1, S] a column
  appended to the head: 1 on the queries, 0 on real keys and -MASKED on padding keys, so that a
  padding key's logit is about -1e3 after scaling and its weight exactly 0 (a real key's logit
  gains an exact 0). Lengths are padded to pallas_length and the output cut back. No attention
  dropout, no weights sown. `interpret` runs the same kernels through Pallas's interpreter (a
  CPU: tests); else a program lowered for a CPU (the compiled plan's FLOP count of a GPU step)
  runs it through XLA there (fused_attention, "xla"). q: [B, Q, H, K], k, v: [B, L, H, K] (not heads-major,
  d_k == d_v); returns [B, Q, H, K]."""
  kernels = functools.partial(_pallas_kernels, cross=cross, interpret=interpret)
  if interpret:
    return kernels(q, k, v, mask)
  through_xla = functools.partial(fused_attention, implementation="xla")
  return devices.platform_dependent(q, k, v, mask, cpu=through_xla, default=kernels)


MASKED = 1e4


def _pallas_kernels(q, k, v, mask, cross: bool, interpret: bool):
  from jax.experimental.pallas.ops.gpu import attention as pallas_attention
  queries, head = q.shape[1], q.shape[-1]
  length = pallas_length(max(q.shape[1], k.shape[1]))  # the kernel's backward: one length
  at_end = lambda x: [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2)  # noqa: E731
  q, k, v = (jnp.pad(x, at_end(x)) for x in (q, k, v))
  causal, segment_ids = mask.shape[-2] != 1, None
  if not causal:  # the key padding, [B, L]
    real_keys = jnp.pad(mask[:, 0, 0, :], at_end(mask[:, 0, 0, :]))
  if cross:
    column = lambda x: jnp.broadcast_to(x.astype(q.dtype), (*q.shape[:3], 1))  # noqa: E731
    q = jnp.concatenate([q, column(jnp.ones(()))], axis=-1)
    k = jnp.concatenate([k, column(jnp.where(real_keys, 0.0, -MASKED)[:, :, None, None])], -1)
    v = jnp.concatenate([v, column(jnp.zeros(()))], axis=-1)
  elif not causal:
    segment_ids = real_keys.astype(jnp.int32)
  out = pallas_attention.mha(q, k, v, segment_ids, sm_scale=1.0 / math.sqrt(head),
                             causal=causal, interpret=interpret)
  return out[:, :queries, :, :head]


def training_implementation(cfg, device, device_count: int) -> str:
  """model.attention_implementation as training will run it on `device`, one of
  `device_count`: "auto" is "pallas" (pallas_attention) on one GPU that Triton compiles for
  (compute capability 8.0 or more) when d_k == d_v and there is no attention dropout, else
  "written_out"; "pallas" on a CPU is "pallas_interpret" (the kernels interpreted: tests). Over
  several devices XLA would gather a Pallas kernel's operands onto each device, so "auto" keeps
  the written-out attention there."""
  requested = cfg.get("attention_implementation", "written_out")
  if requested == "auto":
    capability = str(getattr(device, "compute_capability", ""))
    d_k, d_v = head_dims(cfg)
    # CUDA's "major.minor"; a ROCm device's "gfx90a" is left to the written-out attention
    triton = (device.platform == "gpu" and bool(re.fullmatch(r"\d+\.\d+", capability))
              and float(capability) >= 8.0)
    fits = device_count == 1 and d_k == d_v and not cfg.attention_dropout_rate
    return "pallas" if triton and fits else "written_out"
  if requested == "pallas" and device.platform == "cpu":
    return "pallas_interpret"
  return requested


def _heads_major(x):
  """[B, L, H, K] -> [B, H, L, K]."""
  return jnp.swapaxes(x, 1, 2)


class MultiHeadAttention(nn.Module):
  """Section 3.2.2. Self-attention projects Q, K, V with one fused matrix; cross-attention
  projects the queries from the decoder and keys/values (fused) from the encoder output."""
  config: object
  is_self_attention: bool

  @nn.compact
  def __call__(self, x, memory, mask, *, deterministic: bool, decode: bool = False,
               cache_length: int = 0, position=None, beams: int = 1):
    # x: [B, Q, D] ([N, 1, D] when decoding); memory: [B, S, D] or None (self-attention, and
    # cross-attention steps); position: the decoding step; beams: N // B when decoding
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    d_k, d_v = head_dims(cfg)
    dense = lambda features, name: nn.DenseGeneral(  # noqa: E731
        features, dtype=dtype, kernel_init=_xavier("embed", "heads", "kv"),
        bias_init=_zeros("heads", "kv"), name=name)
    fused = self._fused_form(deterministic or decode)  # None: equation 1 written out
    if self.is_self_attention:
      qkv = dense((cfg.num_heads, 2 * d_k + d_v), "qkv")(x)  # [B, Q, H, 2K+V]
      q, k, v = jnp.split(qkv, [d_k, 2 * d_k], axis=-1)
      if fused:
        return self._output_projection(fused(q, k, v, mask))
      k, v = _heads_major(k), _heads_major(v)  # [B, H, Q, K]
      if decode:
        return self._decoding_step(q, k, v, mask, cache_length, position, beams)
      out = attention(q, k, v, mask, cfg.attention_dropout_rate, deterministic, self)
    else:
      q = dense((cfg.num_heads, d_k), "query")(x)  # [N, Q, H, K]
      key_value = lambda: jnp.split(  # noqa: E731  [B, S, H, K], [B, S, H, V]
          dense((cfg.num_heads, d_k + d_v), "key_value")(memory), [d_k], axis=-1)
      project_memory = lambda: tuple(_heads_major(kv) for kv in key_value())  # noqa: E731
      if fused:
        out = fused(q, *key_value(), mask)
      elif decode:  # project the encoder output once, when the cache is created
        def keys_and_transposed_values():  # [B, H, S, K], [B, H, V, S]: see _decoding_attention
          k, v = project_memory()
          return k, jnp.swapaxes(v, 2, 3)
        k, v_transposed = self.variable("cache", "memory_key_value",
                                        keys_and_transposed_values).value
        out = _decoding_attention(q[:, 0].reshape(k.shape[0], -1, *q.shape[2:]), k,
                                  v_transposed, mask)  # [B, beams, H, V]
        out = out.reshape(q.shape[0], 1, *out.shape[2:])  # [N, 1, H, V]
      else:
        out = attention(q, *project_memory(), mask, cfg.attention_dropout_rate, deterministic,
                        self)
    return self._output_projection(out)

  def _fused_form(self, inference: bool):
    """Training's attention on [B, L, H, K] operands as `attention_implementation` asks (a
    function of q, k, v, mask), or None for equation 1 written out: always at inference, and
    for "auto" left unresolved (a model built without train_step.make_model)."""
    cfg = self.config
    implementation = cfg.get("attention_implementation", "written_out")
    if inference or implementation in ("written_out", "auto"):
      return None
    if cfg.attention_dropout_rate:
      raise ValueError(f"model.attention_implementation={implementation} has no attention "
                       f"dropout: set model.attention_dropout_rate=0 (it is "
                       f"{cfg.attention_dropout_rate}) or model.attention_implementation="
                       "written_out")
    if implementation.startswith("pallas"):
      return functools.partial(pallas_attention, cross=not self.is_self_attention,
                               interpret=implementation == "pallas_interpret")
    return functools.partial(fused_attention, implementation=implementation)

  def _output_projection(self, out):
    return nn.DenseGeneral(self.config.d_model, axis=(-2, -1), dtype=jnp.dtype(self.config.dtype),
                           kernel_init=_xavier("heads", "kv", "embed"), bias_init=_zeros("embed"),
                           name="out")(out)  # [B, Q, D]

  def _decoding_step(self, q, k, v, mask, cache_length, position, beams):
    """Writes this step's keys/values to the hypotheses' slots and attends to the sentence's
    slots under `mask` (from `Decoder`); the call that creates the cache attends to this step
    alone. The cache holds L * beams slots per sentence and head, slot-minor, so that a step
    writes one contiguous block per sentence and head. Its layout is the one each attention
    reads fastest on CPU: for one query per sentence (greedy), keys [B, H, L, K] and values
    transposed, [B, H, V, L] (`_decoding_attention`); for several (a beam search), keys
    transposed, [B, H, K, L * beams], and values [B, H, L * beams, V] (`_beam_attention`)."""
    # q: [N, 1, H, K]; k, v: [N, H, 1, K] heads-major; mask: [B, 1, beams, L * beams]
    n, heads = k.shape[:2]
    batch, slots = n // beams, cache_length * beams
    d_k, d_v = k.shape[-1], v.shape[-1]
    one_query = beams == 1
    keys_name, values_name = ("keys", "values_transposed") if one_query else ("keys_transposed",
                                                                             "values")
    is_initialized = self.has_variable("cache", keys_name)
    keys = self.variable("cache", keys_name, jnp.zeros,
                         (batch, heads, slots, d_k) if one_query else (batch, heads, d_k, slots),
                         k.dtype)
    values = self.variable("cache", values_name, jnp.zeros,
                           (batch, heads, d_v, slots) if one_query else (batch, heads, slots, d_v),
                           v.dtype)
    if not is_initialized:
      out = attention(q, k, v, causal_mask(1), 0.0, True, self)
      return self._output_projection(out)
    per_sentence = lambda x: x.reshape(batch, beams, heads, x.shape[-1])  # noqa: E731
    k, v, q = per_sentence(k), per_sentence(v), per_sentence(q[:, 0])  # [B, beams, H, K]
    slot = position * beams
    if one_query:
      keys.value = jax.lax.dynamic_update_slice(keys.value, jnp.swapaxes(k, 1, 2), (0, 0, slot, 0))
      values.value = jax.lax.dynamic_update_slice(values.value, jnp.transpose(v, (0, 2, 3, 1)),
                                                  (0, 0, 0, slot))
      out = _decoding_attention(q, keys.value, values.value, mask)
    else:
      keys.value = jax.lax.dynamic_update_slice(keys.value, jnp.transpose(k, (0, 2, 3, 1)),
                                                (0, 0, 0, slot))
      values.value = jax.lax.dynamic_update_slice(values.value, jnp.swapaxes(v, 1, 2),
                                                  (0, 0, slot, 0))
      out = _beam_attention(q, keys.value, values.value, mask)
    return self._output_projection(out.reshape(n, 1, heads, out.shape[-1]))


def _decoding_attention(q, k, v_transposed, mask):
  """A decoding step's attention, per sentence. With a handful of queries per sentence (its
  beams), the layouts matter on CPU: logits computed keys-first, and both products contracting
  their operands' last axes, ran 2-4x faster than the plain form (XLA's fallback dot)."""
  # q: [B, beams, H, K]; k: [B, H, M, K]; v_transposed: [B, H, V, M]; mask broadcastable to
  # [B, 1, beams, M]
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  logits = jnp.einsum("bhmk,bqhk->bhmq", k, q).astype(jnp.float32)  # [B, H, M, beams]
  logits = jnp.where(jnp.swapaxes(mask, 2, 3), logits, jnp.finfo(jnp.float32).min)
  weights = jnp.swapaxes(jax.nn.softmax(logits, axis=2), 2, 3)  # [B, H, beams, M]
  return jnp.einsum("bhqm,bhvm->bqhv", weights.astype(v_transposed.dtype),
                    v_transposed)  # [B, beams, H, V]


def _beam_attention(q, k_transposed, v, mask):
  """`_decoding_attention` for a beam search's step: its beams' queries against every slot
  of their sentence. Each product is written as a broadcast multiply summed over an axis
  that is not minor, in float32: XLA:CPU runs each as one fused reduction vectorised along
  the minor axis (slots, then value features), 1.9x as fast at 4 beams as the batched dots,
  whose matrices are only `beams` wide. With one query the same form is 19x slower than the
  dots, so greedy search keeps them (`bench/decode_step_rows.py`, docs/PERFORMANCE.md)."""
  # q: [B, beams, H, K]; k_transposed: [B, H, K, M]; v: [B, H, M, V]; mask broadcastable to
  # [B, 1, beams, M]
  f32 = jnp.float32
  q = jnp.swapaxes(q / jnp.sqrt(q.shape[-1]).astype(q.dtype), 1, 2).astype(f32)  # [B, H, beams, K]
  logits = jnp.sum(q[..., None] * k_transposed.astype(f32)[:, :, None], axis=3)  # [B, H, beams, M]
  logits = jnp.where(mask, logits, jnp.finfo(f32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  out = jnp.sum(weights[..., None] * v.astype(f32)[:, :, None], axis=3)  # [B, H, beams, V]
  return jnp.swapaxes(out, 1, 2).astype(v.dtype)  # [B, beams, H, V]
