"""What the searches and a model agree on: the model's step callback, the cache's rows
(repeated for the beams, reordered when hypotheses change parents), PAD and -inf. The
contract itself is described in the package's docstring (decoding/__init__.py).
"""
from typing import Any, Callable

import jax
import jax.numpy as jnp


PAD_ID = 0
NEG_INF = float("-inf")  # log-prob of an impossible or empty hypothesis

Cache = Any  # a pytree, see the package docstring
TokensToLogits = Callable[[jax.Array, Cache], tuple[jax.Array, Cache]]
# (log_probs float32[B, K, V] of each hypothesis' next token, sequences int32[B, K, L]: its
# tokens so far, PAD from `step` on, step int32[]) -> the log-probs the search uses [B, K, V].
ConstrainLogProbs = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def expand_to_beams(tree: Cache, beam_size: int) -> Cache:
  """Repeats each row beam_size times: leaves [B, ...] -> [B * beam_size, ...].

  Row b * beam_size + k of the result is beam k of sentence b. Scalar leaves are shared and
  returned untouched.
  """
  def expand(leaf):
    if jnp.ndim(leaf) == 0:
      return leaf
    return jnp.repeat(leaf, beam_size, axis=0)  # [B * K, ...]
  return jax.tree.map(expand, tree)


def _select_beams(x: jax.Array, beam_indices: jax.Array) -> jax.Array:
  """Picks beams per sentence: x [B, M, ...], beam_indices int32[B, N] -> [B, N, ...]."""
  batch_index = jnp.arange(x.shape[0])[:, None]  # [B, 1]
  return x[batch_index, beam_indices]  # [B, N, ...]


def gather_beams(tree: Cache, beam_indices: jax.Array) -> Cache:
  """Reorders cache rows by beam: leaves [B * M, ...] -> [B * N, ...].

  Row b * N + n of the result is row b * M + beam_indices[b, n] of the input: beam n of
  sentence b continues from beam beam_indices[b, n]. Scalar leaves are returned untouched.
  """
  batch_size = beam_indices.shape[0]

  def gather(leaf):
    if jnp.ndim(leaf) == 0:
      return leaf
    per_sentence = leaf.reshape(batch_size, -1, *leaf.shape[1:])  # [B, M, ...]
    chosen = _select_beams(per_sentence, beam_indices)  # [B, N, ...]
    return chosen.reshape(-1, *leaf.shape[1:])  # [B * N, ...]
  return jax.tree.map(gather, tree)
