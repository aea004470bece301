"""The FLOP formulas the planner and the MFU use (planning/flops.py), against XLA's own count of
the lowered step (cost analysis; the compiled step's differs by under 0.5%), for every model
option that changes FLOPs: tiny widths, one layer, short lengths (source and target differ, so
that cross-attention's two lengths are not confused). XLA also counts the elementwise work
(softmax, layer norm, the loss) that the formula leaves out: its count is 0-2% above."""
import jax
import jax.numpy as jnp
import ml_collections
import optax
import pytest

from aiayn_flax import model as model_lib
from aiayn_flax.planning import flops
from configs import base

# lengths near d_model, so that attention's terms (length x length) are a tenth of the FLOPs
ROWS, SOURCE_LENGTH, TARGET_LENGTH = 1, 64, 48
# Each model field that changes the FLOPs of a step, changed alone from a tiny base model;
# learned positions and a pre-LN stack add no matmul (the formula's count stays).
OPTIONS = {"tiny": {}, "d_model": dict(d_model=256), "d_ff": dict(d_ff=1024),
           "num_heads": dict(num_heads=8), "qk_dim": dict(qk_dim=16), "v_dim": dict(v_dim=64),
           "num_layers": dict(num_layers=2), "vocab_size": dict(vocab_size=1024),
           "positions": dict(positions="learned"), "pre_layer_norm": dict(pre_layer_norm=True)}

RATIO_BOUND = 1.02


def tiny_model_config(**overrides):
  model = base.model_config(vocab_size=512, d_model=128, d_ff=512, num_heads=4, num_layers=1,
                            dropout_rate=0.0, dtype="float32")
  model.update(overrides)
  return model


def xla_flops(model_config, train: bool) -> float:
  """XLA's FLOPs of the loss (train: of its gradient) on one [ROWS, length] batch."""
  model = model_lib.Transformer(ml_collections.FrozenConfigDict(model_config.to_dict()))
  inputs = jax.ShapeDtypeStruct((ROWS, SOURCE_LENGTH), jnp.int32)
  targets = jax.ShapeDtypeStruct((ROWS, TARGET_LENGTH), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.key(0), inputs, targets)["params"]

  def loss(params, inputs, targets):
    logits = model.apply({"params": params}, inputs, targets)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

  step = jax.grad(loss) if train else loss
  return jax.jit(step).lower(params, inputs, targets).cost_analysis()["flops"]


def test_forward_flops_are_xlas_within_its_elementwise_share():
  model = tiny_model_config()
  counted = flops.forward_flops(model, ROWS, SOURCE_LENGTH, TARGET_LENGTH)
  assert 1.0 <= xla_flops(model, train=False) / counted <= RATIO_BOUND


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_train_flops_are_xlas_for_every_model_option(option):
  model = tiny_model_config(**OPTIONS[option])
  counted = flops.train_flops(model, ROWS, SOURCE_LENGTH, TARGET_LENGTH)
  assert 1.0 <= xla_flops(model, train=True) / counted <= RATIO_BOUND

