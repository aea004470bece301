"""Dropout (section 5.4) as a hashed counter, shared by attention weights, residuals and source
tokens."""
import hashlib
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# EOS, PAD and UNK matter to source token dropout
from aiayn_flax.data.vocabulary import EOS_ID, PAD_ID, UNK_ID


def _mix32(x):
  """A 32-bit integer hash with full avalanche (the "lowbias32" finalizer, C. Wellons)."""
  x = (x ^ (x >> 16)) * jnp.uint32(0x7FEB352D)
  x = (x ^ (x >> 15)) * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


# "one_key", as below; "make_rng": a threefry fold per layer, as until 2026-11-28 (a benchmark
# counts the two against each other). Read when a model is traced, so a bench may set it here
# (aiayn_flax.attention.dropout.DROPOUT_SEEDS) before it builds its programs.
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
