"""Parameter and FLOP counts, for --dry_run, MFU and docs/TRAIN.md's Table 3 column.

Both come from the model itself, its initialisation's parameter shapes (jax.eval_shape: nothing
computed, once per model block), so that a new layer or option needs no formula here: the FLOPs
are its matrices' weights on every token they read, plus equation 1's two products per layer
and the output projection. tests/test_flops.py checks them against XLA's own count of the
lowered step for every model option that changes FLOPs."""
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
  return sum(math.prod(shape) for _, shape in _parameter_shapes(model))


def _parameter_shapes(model) -> tuple[tuple[str, tuple[int, ...]], ...]:
  fields = model.to_dict() if hasattr(model, "to_dict") else dict(model)
  return _shapes_of(json.dumps(fields, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _shapes_of(model_json: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
  """(path, shape) of every parameter of the model, e.g. ("encoder/layer_0/ffn/inner/kernel",
  (512, 2048)); the compute dtype does not change them ("auto" needs a device to resolve)."""
  model = model_lib.Transformer(ml_collections.FrozenConfigDict(
      json.loads(model_json) | {"dtype": "float32"}))
  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), tokens, tokens)["params"]
  return tuple(("/".join(str(key.key) for key in path if hasattr(key, "key")), leaf.shape)
               for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0])


def _kernel_weights_per_token(model) -> tuple[int, int]:
  """(weights applied to each source token, to each target token) by the layers' matrices
  (every parameter named "kernel"): the encoder's and cross-attention's keys and values read
  the source, the rest of the decoder the target. A new layer's matrices count themselves."""
  source = target = 0
  for path, shape in _parameter_shapes(model):
    if path.endswith("/kernel"):
      if path.startswith("encoder/") or "/cross_attention/key_value/" in path:
        source += math.prod(shape)
      else:
        target += math.prod(shape)
  return source, target


def forward_flops(model, batch: int, source_length: int, target_length: int) -> int:
  """Multiply-adds x2 of one forward pass on a [batch, length] pair, padding included: the
  layers' matrices on every token they read, equation 1's two products per layer, and the
  output projection (tied to the embedding)."""
  h, n, vocab, d = model.num_heads, model.num_layers, model.vocab_size, model.d_model
  k, v = head_dims(model)
  s, t = source_length, target_length
  source_weights, target_weights = _kernel_weights_per_token(model)
  attention = n * (s * s + t * t + t * s) * h * (k + v)  # encoder, decoder, cross: QK^T, AV
  return 2 * batch * (s * source_weights + t * target_weights + attention + t * d * vocab)


def train_flops(model, batch: int, source_length: int, target_length: int) -> int:
  """Forward + backward (twice the forward's FLOPs)."""
  return 3 * forward_flops(model, batch, source_length, target_length)
