"""Parameter and FLOP counts, for --dry_run, MFU and docs/TRAIN.md's Table 3 column.

The parameters are counted from the model itself (its initialisation's shapes), so that a new
option needs no formula here; the FLOPs are a formula (a plan is made for shapes no CPU traces
quickly), checked against XLA's own count of the lowered step for every model option that
changes them (tests/test_flops.py)."""
import functools
import json
import math

import jax
import jax.numpy as jnp
import ml_collections

from aiayn_flax import model as model_lib
from aiayn_flax.model import head_dims


def parameter_count(model) -> int:
  """Parameters of the Transformer built from the `model` config block (weights and biases),
  from the shapes its initialisation gives (jax.eval_shape: nothing is computed)."""
  fields = model.to_dict() if hasattr(model, "to_dict") else dict(model)
  return _counted_parameters(json.dumps(fields, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _counted_parameters(model_json: str) -> int:
  # the count does not depend on the compute dtype ("auto" needs a device to resolve)
  model = model_lib.Transformer(ml_collections.FrozenConfigDict(
      json.loads(model_json) | {"dtype": "float32"}))
  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), tokens, tokens)
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))


def forward_flops(model, batch: int, source_length: int, target_length: int) -> int:
  """Multiply-adds x2 of one forward pass on a [batch, length] pair, padding included."""
  d, f, h, n, vocab = model.d_model, model.d_ff, model.num_heads, model.num_layers, model.vocab_size
  k, v = head_dims(model)
  s, t = source_length, target_length
  projections = d * h * (2 * k + v) + h * v * d  # fused QKV + output, per token
  ffn = 2 * d * f
  encoder_layer = s * (projections + ffn) + s * s * h * (k + v)
  decoder_layer = (t * (projections + ffn) + t * t * h * (k + v)  # self-attention, FFN
                   + t * (d * h * k + h * v * d) + s * d * h * (k + v) + t * s * h * (k + v))
  output_projection = t * d * vocab  # tied to the embedding
  return 2 * batch * (n * (encoder_layer + decoder_layer) + output_projection)


def train_flops(model, batch: int, source_length: int, target_length: int) -> int:
  """Forward + backward (twice the forward's FLOPs)."""
  return 3 * forward_flops(model, batch, source_length, target_length)
