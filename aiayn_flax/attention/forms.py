"""The forms of equation 1, softmax(Q K^T / sqrt(d_k) + bias) V under a mask, that
backends.py dispatches to. Each takes the layout of the call sites it serves:

- training and teacher-forced sites (encoder, decoder, cross): q [B, Q, H, K], k [B, L, H, K],
  v [B, L, H, V], mask broadcastable to [B, H, Q, L] (the encoder's and cross-attention's key
  padding [B, 1, 1, L], the decoder's causal-and-padding [B, 1, Q, L], both with padding at
  the end of each row); returns [B, Q, H, V];
- decoding sites (model.py's cache): see decoding_step and beam.

`bias`, where given, is added to the logits in float32, broadcastable to [B, H, Q, L].
"""
import functools
import math

import jax
import jax.numpy as jnp

from aiayn_flax import devices
from aiayn_flax.attention.dropout import Dropout


def _heads_major(x):
  """[B, L, H, K] -> [B, H, L, K]."""
  return jnp.swapaxes(x, 1, 2)


def written_out(q, k, v, mask, bias, *, dropout_rate: float, deterministic: bool, module):
  """Equation 1 as jnp operations, the softmax in float32, with attention dropout; sows the
  weights for the paper's figures 3-5 (attention_maps.py). Every platform, every site but
  decoding's."""
  k, v = _heads_major(k), _heads_major(v)  # [B, H, L, K]
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  logits = jnp.einsum("bqhk,bhlk->bhql", q, k).astype(jnp.float32)  # [B, H, Q, L]
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  module.sow("intermediates", "attention_weights", weights)
  if dropout_rate and not deterministic:  # (a module of `module`'s, named as before)
    weights = Dropout(dropout_rate)(weights, deterministic=False)
  return jnp.einsum("bhql,bhlv->bqhv", weights.astype(v.dtype), v)  # [B, Q, H, V]


def through_jax(q, k, v, mask, bias, *, implementation: str):
  """jax.nn.dot_product_attention (cuDNN's fused kernel with implementation="cudnn", XLA's
  with "xla"): a key padding mask [B, 1, 1, L] becomes each row's key count, the decoder's
  causal mask `is_causal` (its padding keys follow every real query). A row with no real key
  (the empty rows that align a batch on a GPU) is given its first key, so that every
  implementation returns finite values there; the loss weighs those rows 0."""
  if mask.shape[-2] == 1:  # padding keys only
    lengths = jnp.maximum(jnp.sum(mask[:, 0, 0, :], axis=-1, dtype=jnp.int32), 1)
    return jax.nn.dot_product_attention(q, k, v, bias=bias, key_value_seq_lengths=lengths,
                                        implementation=implementation)
  return jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=True,
                                      implementation=implementation)


# Sequence lengths Pallas's Triton kernels take: a power of two up to their 128-row block, a
# multiple of 128 beyond (jax.experimental.pallas.ops.gpu.attention).
def pallas_length(length: int) -> int:
  return 1 << (length - 1).bit_length() if length <= 128 else -(-length // 128) * 128


MASKED = 1e4
BACKWARD_BLOCK = 32  # the Pallas kernels' own default for their backward pass


def pallas(q, k, v, mask, bias, *, cross: bool, block: int, interpret: bool):
  """Equation 1 as Pallas's flash-attention kernels (on a GPU, Triton: one kernel forward, two
  backward, where XLA launches 20-30), for sequences padded at their end, in blocks of
  `block` rows (backends.py chooses the largest whose shared memory the GPU has). The kernel
  masks by segment ids (one array for queries and keys) or causally, so: the encoder's key
  padding mask [B, 1, 1, L] becomes segment ids (1 real, 0 padding: a real query sees the real
  keys, as with the mask); the decoder's causal mask [B, 1, L, L] `causal` (its padding keys
  follow every real query); cross-attention's key padding [B, 1, 1, S] a column appended to
  the head: 1 on the queries, 0 on real keys and -MASKED on padding keys, so that a padding
  key's logit is about -1e3 after scaling and its weight exactly 0 (a real key's logit gains
  an exact 0). Lengths are padded to pallas_length and the output cut back. No bias, no
  dropout, no weights sown. `interpret` runs the same kernels through Pallas's interpreter
  (tests, on a CPU); else a program lowered for a CPU (the compiled plan's FLOP count of a GPU
  step) computes it through XLA there. d_k == d_v."""
  del bias  # backends.py gives none: the kernel takes none
  kernels = functools.partial(_pallas_kernels, cross=cross, block=block, interpret=interpret)
  if interpret:
    return kernels(q, k, v, mask)
  xla = functools.partial(through_jax, bias=None, implementation="xla")
  return devices.platform_dependent(q, k, v, mask, cpu=xla, default=kernels)


def _pallas_kernels(q, k, v, mask, cross: bool, block: int, interpret: bool):
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
  backward = min(BACKWARD_BLOCK, length)
  blocks = pallas_attention.BlockSizes(block_q=block, block_k=block, block_q_dkv=backward,
                                       block_kv_dkv=backward, block_q_dq=backward,
                                       block_kv_dq=backward)
  out = pallas_attention.mha(q, k, v, segment_ids, sm_scale=1.0 / math.sqrt(head),
                             causal=causal, block_sizes=blocks, interpret=interpret)
  return out[:, :queries, :, :head]


def decoding_step(q, k, v_transposed, mask, bias):
  """A greedy decoding step's attention, per sentence, on model.py's cache layout. With a
  handful of queries per sentence (its beams), the layouts matter on CPU: logits computed
  keys-first, and both products contracting their operands' last axes, ran 2-4x faster than
  the plain form (XLA's fallback dot)."""
  # q: [B, beams, H, K]; k: [B, H, M, K]; v_transposed: [B, H, V, M]; mask and bias
  # broadcastable to [B, 1, beams, M] and [B, H, beams, M]
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  logits = jnp.einsum("bhmk,bqhk->bhmq", k, q).astype(jnp.float32)  # [B, H, M, beams]
  if bias is not None:
    logits = logits + jnp.swapaxes(bias, 2, 3).astype(jnp.float32)
  logits = jnp.where(jnp.swapaxes(mask, 2, 3), logits, jnp.finfo(jnp.float32).min)
  weights = jnp.swapaxes(jax.nn.softmax(logits, axis=2), 2, 3)  # [B, H, beams, M]
  return jnp.einsum("bhqm,bhvm->bqhv", weights.astype(v_transposed.dtype),
                    v_transposed)  # [B, beams, H, V]


def beam(q, k_transposed, v, mask, bias):
  """decoding_step for a beam search's step: its beams' queries against every slot of their
  sentence. Each product is written as a broadcast multiply summed over an axis that is not
  minor, in float32: XLA:CPU runs each as one fused reduction vectorised along the minor axis
  (slots, then value features), 1.9x as fast at 4 beams as the batched dots, whose matrices
  are only `beams` wide. With one query the same form is 19x slower than the dots, so greedy
  search keeps them (`bench/decode_step_rows.py`, docs/PERFORMANCE.md)."""
  # q: [B, beams, H, K]; k_transposed: [B, H, K, M]; v: [B, H, M, V]; mask and bias
  # broadcastable to [B, 1, beams, M] and [B, H, beams, M]
  f32 = jnp.float32
  q = jnp.swapaxes(q / jnp.sqrt(q.shape[-1]).astype(q.dtype), 1, 2).astype(f32)  # [B, H, beams, K]
  logits = jnp.sum(q[..., None] * k_transposed.astype(f32)[:, :, None], axis=3)  # [B, H, beams, M]
  if bias is not None:
    logits = logits + bias.astype(f32)
  logits = jnp.where(mask, logits, jnp.finfo(f32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  out = jnp.sum(weights[..., None] * v.astype(f32)[:, :, None], axis=3)  # [B, H, beams, V]
  return jnp.swapaxes(out, 1, 2).astype(v.dtype)  # [B, beams, H, V]
