"""Multi-head attention (section 3.2.2) with the autoregressive cache that decoding uses (the
layout is described in model.py's docstring), the padding and causal masks, and the parameter
initializers with logical axis names. Shapes as in model.py.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from aiayn_flax.attention import backends, forms
from aiayn_flax.attention.forms import _heads_major
# PAD marks the keys the padding mask hides
from aiayn_flax.data.vocabulary import PAD_ID


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


class MultiHeadAttention(nn.Module):
  """Section 3.2.2. Self-attention projects Q, K, V with one fused matrix; cross-attention
  projects the queries from the decoder and keys/values (fused) from the encoder output.
  Equation 1 itself is backends.attend's, which picks its form per call site."""
  config: object
  site: str  # "encoder", "decoder" (causal self-attention) or "cross"

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
    if self.site != "cross":
      qkv = dense((cfg.num_heads, 2 * d_k + d_v), "qkv")(x)  # [B, Q, H, 2K+V]
      q, k, v = jnp.split(qkv, [d_k, 2 * d_k], axis=-1)
      if decode:
        return self._decoding_step(q, k, v, mask, cache_length, position, beams)
      out = self._attend(self.site, q, k, v, mask, deterministic)
    else:
      q = dense((cfg.num_heads, d_k), "query")(x)  # [N, Q, H, K]
      key_value = lambda: jnp.split(  # noqa: E731  [B, S, H, K], [B, S, H, V]
          dense((cfg.num_heads, d_k + d_v), "key_value")(memory), [d_k], axis=-1)
      if decode:  # project the encoder output once, when the cache is created
        def keys_and_transposed_values():  # [B, H, S, K], [B, H, V, S]: see forms.decoding_step
          k, v = key_value()
          return _heads_major(k), jnp.swapaxes(_heads_major(v), 2, 3)
        k, v_transposed = self.variable("cache", "memory_key_value",
                                        keys_and_transposed_values).value
        per_sentence = q[:, 0].reshape(k.shape[0], -1, *q.shape[2:])  # [B, beams, H, K]
        out = self._attend("decoding_step", per_sentence, k, v_transposed, mask, True)
        out = out.reshape(q.shape[0], 1, *out.shape[2:])  # [N, 1, H, V]
      else:
        out = self._attend("cross", q, *key_value(), mask, deterministic)
    return self._output_projection(out)

  def _attend(self, site, q, k, v, mask, deterministic, bias=None):
    """backends.attend for this call; its lengths are q's and k's second axes in training's
    layout, the cache's slots when decoding."""
    cfg = self.config
    keys = k.shape[1] if site not in backends.DECODING_SITES else mask.shape[-1]
    call = backends.Call(site, jnp.dtype(q.dtype).name, q.shape[-1], head_dims(cfg)[1],
                         queries=q.shape[1], keys=keys, training=not deterministic,
                         dropout=not deterministic and bool(cfg.attention_dropout_rate),
                         bias=bias is not None)
    return backends.attend(call, q, k, v, mask, bias,
                           requested=cfg.get("attention_implementation", "written_out"),
                           target=backends.Target.parse(cfg.get("attention_target", "")),
                           module=self)

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
    transposed, [B, H, V, L] (forms.decoding_step); for several (a beam search), keys
    transposed, [B, H, K, L * beams], and values [B, H, L * beams, V] (forms.beam)."""
    # q, k, v: [N, 1, H, *]; mask: [B, 1, beams, L * beams]
    step_k, step_v = k, v
    k, v = _heads_major(k), _heads_major(v)  # [N, H, 1, K]
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
      out = forms.written_out(q, step_k, step_v, causal_mask(1), None, dropout_rate=0.0,
                              deterministic=True, module=self)
      return self._output_projection(out)
    per_sentence = lambda x: x.reshape(batch, beams, heads, x.shape[-1])  # noqa: E731
    k, v, q = per_sentence(k), per_sentence(v), per_sentence(q[:, 0])  # [B, beams, H, K]
    slot = position * beams
    if one_query:
      keys.value = jax.lax.dynamic_update_slice(keys.value, jnp.swapaxes(k, 1, 2), (0, 0, slot, 0))
      values.value = jax.lax.dynamic_update_slice(values.value, jnp.transpose(v, (0, 2, 3, 1)),
                                                  (0, 0, 0, slot))
      out = self._attend("decoding_step", q, keys.value, values.value, mask, True)
    else:
      keys.value = jax.lax.dynamic_update_slice(keys.value, jnp.transpose(k, (0, 2, 3, 1)),
                                                (0, 0, 0, slot))
      values.value = jax.lax.dynamic_update_slice(values.value, jnp.swapaxes(v, 1, 2),
                                                  (0, 0, slot, 0))
      out = self._attend("beam", q, keys.value, values.value, mask, True)
    return self._output_projection(out.reshape(n, 1, heads, out.shape[-1]))
