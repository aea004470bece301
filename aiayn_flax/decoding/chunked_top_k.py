"""The searches' top-k and argmax over the vocabulary, computed chunk by chunk: the same
values and indices as lax.top_k and jnp.argmax, with one fast max per chunk in place of
XLA:CPU's slow TopK and argmax over a whole row (docs/PERFORMANCE.md).
"""
import jax
import jax.numpy as jnp
from jax import lax

from aiayn_flax.decoding.contract import NEG_INF


def top_k_by_chunks(x: jax.Array, k: int, chunk: int = 64) -> tuple[jax.Array, jax.Array]:
  """lax.top_k(x, k) over the last axis, the same values and indices (ties: lower index first),
  computed as the best k chunks of `chunk` elements by their maximum, then the best k elements
  of those chunks. XLA's TopK on CPU reads a row of V elements slowly (5 ms for beam search's
  256 x 8000 log-probs); one max over the row is a fast vectorised pass.

  Why the same: an element of the top k lies in one of the k best chunks. If its chunk c were
  not picked, each of the k picked chunks would have a maximum above it, or equal to it in a
  chunk before c, so k elements would rank before it. The picked chunks are then read in their
  order in x, so ties among their elements are broken as lax.top_k breaks them.
  """
  *batch, size = x.shape
  num_chunks = -(-size // chunk)
  if num_chunks <= k:
    return lax.top_k(x, k)
  padded = jnp.pad(x, [(0, 0)] * len(batch) + [(0, num_chunks * chunk - size)],
                   constant_values=NEG_INF)  # padding comes last, so loses every tie
  chunks = padded.reshape(*batch, num_chunks, chunk)  # [..., C, chunk]
  _, best_chunks = lax.top_k(jnp.max(chunks, axis=-1), k)  # [..., k]
  best_chunks = jnp.sort(best_chunks, axis=-1)  # in x's order
  candidates = jnp.take_along_axis(chunks, best_chunks[..., None], axis=-2)  # [..., k, chunk]
  values, picks = lax.top_k(candidates.reshape(*batch, k * chunk), k)  # [..., k]
  indices = jnp.take_along_axis(best_chunks, picks // chunk, axis=-1) * chunk + picks % chunk
  return values, indices


def best_extensions(logits, alive_log_probs, must_end, cannot_end, eos_id: int, k: int,
                    chunk: int = 64) -> tuple[jax.Array, jax.Array]:
  """The best k one-token extensions of each alive hypothesis, best first: the same values and
  token indices as `top_k_by_chunks(candidates, k, chunk)` of the plain computation

    log_probs = jax.nn.log_softmax(logits)  # [B, K, V]
    log_probs = jnp.where(must_end & (token != eos_id), -inf, log_probs)
    log_probs = jnp.where(cannot_end & (token == eos_id), -inf, log_probs)
    candidates = alive_log_probs[:, :, None] + log_probs,

  without writing the [B, K, V] log-probs or candidates. Why the same: a candidate is
  f(logit) = alive + ((logit - max) - log_sum), each operation monotonic in the logit even as
  rounded in float32, so a chunk's best candidate is f(the chunk's best logit); only the best
  k chunks' candidates are computed, with the same operations as the plain way. A row's max
  is the max of its chunks' maxima (exact), and its log_sum the same expression as
  log_softmax's. On CPU this saves beam search a slow reduction and two passes over the
  [B * K, V] logits per step (docs/PERFORMANCE.md)."""
  # logits: [B, K, V] float32; alive_log_probs: [B, K]; must_end, cannot_end: bool [B, 1, 1]
  *batch, size = logits.shape
  num_chunks = -(-size // chunk)
  padded = jnp.pad(logits, [(0, 0)] * len(batch) + [(0, num_chunks * chunk - size)],
                   constant_values=NEG_INF)
  chunks = padded.reshape(*batch, num_chunks, chunk)  # [B, K, C, chunk]
  chunk_max = jnp.max(chunks, axis=-1)  # [B, K, C]
  row_max = jnp.max(chunk_max, axis=-1, keepdims=True)  # [B, K, 1]: log_softmax's max
  log_sum = jnp.log(jnp.sum(jnp.exp(logits - row_max), axis=-1, keepdims=True))  # [B, K, 1]
  row_max, log_sum = row_max[..., 0], log_sum[..., 0]  # [B, K]

  def candidate(x):  # the candidates of logits x [B, K, ...], as the plain way computes them
    per_row = lambda y: y.reshape(*y.shape, *[1] * (x.ndim - y.ndim))  # noqa: E731
    return per_row(alive_log_probs) + ((x - per_row(row_max)) - per_row(log_sum))

  chunk_best = candidate(chunk_max)  # [B, K, C]
  # At a sentence's last allowed step only EOS may follow: its chunk's best is EOS, the rest
  # are empty.
  eos_best = candidate(logits[..., eos_id])  # [B, K]
  eos_chunk = jnp.arange(num_chunks) == eos_id // chunk  # [C]
  chunk_best = jnp.where(must_end, jnp.where(eos_chunk, eos_best[..., None], NEG_INF),
                         chunk_best)
  # Where EOS may not follow, EOS's chunk ranks by its best other token (its maximum may be
  # EOS, which would take a place among the best k chunks from one that holds a candidate).
  eos_chunk_logits = chunks[..., eos_id // chunk, :]  # [B, K, chunk]
  eos_chunk_best = candidate(jnp.max(jnp.where(jnp.arange(chunk) == eos_id % chunk, NEG_INF,
                                               eos_chunk_logits), axis=-1))  # [B, K]
  chunk_best = jnp.where(cannot_end & eos_chunk, eos_chunk_best[..., None], chunk_best)
  if num_chunks <= k:
    best_chunks = jnp.broadcast_to(jnp.arange(num_chunks), chunk_best.shape)
  else:
    _, best_chunks = lax.top_k(chunk_best, k)  # [B, K, k]
    best_chunks = jnp.sort(best_chunks, axis=-1)  # in the logits' order
  picked = jnp.take_along_axis(chunks, best_chunks[..., None], axis=-2)  # [B, K, k', chunk]
  values = candidate(picked)  # [B, K, k', chunk]
  tokens = best_chunks[..., None] * chunk + jnp.arange(chunk)  # [B, K, k', chunk]
  values = jnp.where((must_end[..., None] & (tokens != eos_id))
                     | (cannot_end[..., None] & (tokens == eos_id)), NEG_INF, values)
  values, picks = lax.top_k(values.reshape(*batch, -1), k)  # [B, K, k]
  return values, jnp.take_along_axis(tokens.reshape(*batch, -1), picks, axis=-1)


def argmax_by_chunks(x: jax.Array, chunk: int = 64) -> jax.Array:
  """jnp.argmax(x, axis=-1) (the first index of the maximum), computed as the first chunk of
  `chunk` elements that holds the maximum, then the first maximum in it. XLA:CPU's argmax (a
  reduction over (value, index) pairs) took 3.5 ms for greedy search's 64 x 8000 logits, a
  quarter of a decoding step; a max per chunk is a fast vectorised pass."""
  *batch, size = x.shape
  num_chunks = -(-size // chunk)
  padded = jnp.pad(x, [(0, 0)] * len(batch) + [(0, num_chunks * chunk - size)],
                   constant_values=NEG_INF)  # padding comes last, so loses every tie
  chunks = padded.reshape(*batch, num_chunks, chunk)  # [..., C, chunk]
  best_chunk = jnp.argmax(jnp.max(chunks, axis=-1), axis=-1)  # [...]
  picked = jnp.take_along_axis(chunks, best_chunk[..., None, None], axis=-2)[..., 0, :]
  return best_chunk * chunk + jnp.argmax(picked, axis=-1)
