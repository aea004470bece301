"""The training state and the jitted steps: pure functions of (state, batch, rng)."""
import dataclasses
import functools
import math

import jax
import jax.flatten_util
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import linen as nn
from flax.training import train_state

from aiayn_flax import devices, loss, model as model_lib, optimizer
from aiayn_flax.attention import backends
from aiayn_flax.data import bucketing
from aiayn_flax.data.vocabulary import PAD_ID

def make_model(config, device=None, device_count: int | None = None) -> model_lib.Transformer:
  """The config's Transformer for `device` (default: the first local device), one of
  `device_count` (default: every device): "auto" dtype is bfloat16 compute where the device has
  bf16 units, else float32 (devices.compute_dtype); the attention's backends are chosen per
  call for the device (attention/backends.py: its target). The compiled dry run passes the
  target's device and count."""
  device = device or jax.devices()[0]
  model = config.model.to_dict()
  kind = devices.local_kind(device)
  refusal = devices.dtype_refusal(model["dtype"], kind)
  if refusal:
    raise ValueError(refusal)
  model["dtype"] = devices.compute_dtype(model["dtype"], kind)
  model["attention_target"] = backends.target_of(
      device, jax.device_count() if device_count is None else device_count).text()
  return model_lib.Transformer(ml_collections.FrozenConfigDict(model))


def boxed_params(model: model_lib.Transformer, seed: int):
  """Parameters still wrapped with their logical axis names (nn.LogicallyPartitioned)."""
  dummy = jnp.ones((1, 8), jnp.int32)
  # One compiled program: called outside a jit, init's ~100 operations would compile one by one.
  return jax.jit(model.init)(jax.random.key(seed), dummy, dummy)["params"]


def init_params(model: model_lib.Transformer, seed: int):
  return nn.meta.unbox(boxed_params(model, seed))


def logical_param_specs(model: model_lib.Transformer):
  """PartitionSpecs of logical axis names, one per parameter (computed from shapes only)."""
  return nn.get_partition_spec(jax.eval_shape(lambda: boxed_params(model, 0)))


def create_train_state(config, model, tx: optax.GradientTransformation | None = None
                       ) -> train_state.TrainState:
  """The initial state, compiled as one program (as boxed_params). `tx`: the optimizer, where
  the caller holds one already: jit matches out_shardings by the state's static fields too,
  so shardings built from state_shapes_and_logical_specs' shapes need its very optimizer."""
  if tx is None:
    tx = optimizer.make_optimizer(config)
  return jax.jit(lambda: _state_of(model, init_params(model, config.seed), tx))()


def state_shapes_and_logical_specs(config, model):
  """(jax.eval_shape of create_train_state, logical_param_specs) from one trace of the model's
  init instead of two (about 0.4 s of CPU for the toy, more for wider models)."""
  boxed = jax.eval_shape(lambda: boxed_params(model, config.seed))
  tx = optimizer.make_optimizer(config)
  shapes = jax.eval_shape(lambda params: _state_of(model, params, tx), nn.meta.unbox(boxed))
  return shapes, nn.get_partition_spec(boxed)


def _state_of(model, params, tx) -> train_state.TrainState:
  return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def dropout_key(seed: int) -> jax.Array:
  """The base key of dropout; each step folds in its step number."""
  return jax.random.fold_in(jax.random.key(seed), 1)


def aligned_rows(rows: int, lengths, multiple: int) -> int:
  """The fewest rows >= `rows` that make rows x length a multiple of `multiple` for each of
  `lengths` (the sources' and the targets'), or `rows` where that would add more than an eighth
  of them (or `multiple` is 0)."""
  if not multiple:
    return rows
  step = math.lcm(*(multiple // math.gcd(length, multiple) for length in lengths))
  aligned = -(-rows // step) * step
  return aligned if 8 * (aligned - rows) <= rows else rows


def with_aligned_rows(batch: dict, multiple: int) -> dict:
  """`batch` with empty rows appended as aligned_rows says (XLA's GPU matmuls work on tiles: a
  batch whose rows x length is not a multiple of 256 tokens gets pad and slice kernels around
  its matmuls and their neighbours; the quick start's 343 x 8, compiled deviceless for an
  H100: 649 kernels, 565 at 352 x 8): the same loss, metric sums and gradients (the padding's
  weight is 0). Its rows hold no real key: every attention backend returns finite values there
  (attention/forms.py)."""
  rows = batch["inputs"].shape[0]
  aligned = aligned_rows(rows, [x.shape[1] for x in batch.values()], multiple)
  return jax.tree.map(lambda x: jnp.pad(x, ((0, aligned - rows), (0, 0)),
                                        constant_values=PAD_ID), batch)


@dataclasses.dataclass(frozen=True)
class StepForms:
  """How the step computes, not what (config fields: docs/TRAIN.md's table of forms)."""
  loss: str = "auto"  # config.loss_implementation: loss.per_position's form
  optimizer: str = "per_array"  # optimizer.update_form: the finite check's and norm's form
  aligned_tokens: int = 0  # rows appended up to multiples of these tokens (with_aligned_rows)


def loss_and_grads(params, batch, rng, *, model, label_smoothing: float,
                   forms: StepForms = StepForms()):
  """Gradient of the smoothed loss summed over the batch's real target tokens, and the metric
  sums. The caller divides by the token count: after summing over micro-batches when it
  accumulates, so that k micro-batches give exactly the update of their concatenation."""
  if forms.aligned_tokens:
    batch = with_aligned_rows(batch, forms.aligned_tokens)

  def loss_fn(p):
    logits = model.apply({"params": p}, batch["inputs"], batch["targets"], train=True,
                         rngs={"dropout": rng})
    loss_sum, nll_sum, tokens = loss.label_smoothed_nll(logits, batch["targets"], label_smoothing,
                                                        forms.loss)
    return loss_sum, (nll_sum, tokens)
  (loss_sum, (nll_sum, tokens)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return grads, {"loss_sum": loss_sum, "nll_sum": nll_sum, "tokens": tokens}


def apply_gradient_sums(state, grad_sums, metrics, *, schedule, forms: StepForms = StepForms()):
  """One optimizer update with the gradient per real target token."""
  with jax.named_scope("optimizer"):
    grads, grad_norm = gradients_per_token(grad_sums, metrics["tokens"], forms.optimizer)
    metrics = dict(metrics, grad_norm=grad_norm, learning_rate=schedule(state.step))
    return state.apply_gradients(grads=grads), metrics


def gradients_per_token(grad_sums, tokens, form: str):
  """The gradient sums divided by the token count, and their L2 norm: per array, or with
  `form` "one_vector" (as optimizer.skip_nonfinite's; "auto": on a GPU) on one vector of all
  of them (one kernel for the norm, the division fused into the update)."""
  def per_array(sums, tokens):
    grads = jax.tree.map(lambda g: g / jnp.maximum(tokens, 1.0), sums)
    return grads, optax.tree.norm(grads)

  def in_one_vector(sums, tokens):
    flat_sums, unflatten = jax.flatten_util.ravel_pytree(sums)
    flat_grads = flat_sums / jnp.maximum(tokens, 1.0)
    return unflatten(flat_grads), jnp.sqrt(jnp.sum(flat_grads * flat_grads))

  if form in ("per_array", "one_vector"):
    return {"per_array": per_array, "one_vector": in_one_vector}[form](grad_sums, tokens)
  return devices.platform_dependent(grad_sums, tokens, cpu=per_array, tpu=per_array,
                                    default=in_one_vector)


def train_step(state, batch, rng, *, model, label_smoothing: float, schedule,
               forms: StepForms = StepForms()):
  """One optimizer update on one batch; metrics stay on device (the loop fetches them when it
  logs)."""
  step_rng = jax.random.fold_in(rng, state.step)
  grad_sums, metrics = loss_and_grads(state.params, batch, step_rng, model=model,
                                      label_smoothing=label_smoothing, forms=forms)
  return apply_gradient_sums(state, grad_sums, metrics, schedule=schedule, forms=forms)


def train_steps(state, batches, num_steps, rng, *, model, label_smoothing: float, schedule,
                forms: StepForms = StepForms()):
  """Several optimizer updates in one call: `batches` stacks K batches of one shape
  ({"inputs": [K, B, L], "targets": [K, B, L]}), of which the first `num_steps` (a traced
  1..K, so one compiled program serves any count) are applied in order, each exactly as
  `train_step` applies it. Returns the state and the metrics summed over those steps.

  Why: XLA on CPU allocates a program's temporaries afresh at every call, and touching fresh
  memory costs a page fault per 4 KiB (a base-model step touches 2.3 GB); a loop inside one
  call reuses them (docs/PERFORMANCE.md). On accelerators it saves host dispatches, like
  TPUEstimator's iterations_per_loop."""
  step = functools.partial(train_step, model=model, label_smoothing=label_smoothing,
                           schedule=schedule, forms=forms)
  first = jax.tree.map(lambda x: x[0], batches)
  _, metrics_shape = jax.eval_shape(step, state, first, rng)

  def one_step(i, carry):
    state, sums = carry
    state, metrics = step(state, jax.tree.map(lambda x: x[i], batches), rng)
    return state, jax.tree.map(jnp.add, sums, metrics)

  zeros = jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), metrics_shape)
  return jax.lax.fori_loop(0, num_steps, one_step, (state, zeros))


def accumulate_step(sums, params, batch, rng, step, micro_step, *, model, label_smoothing: float,
                    forms: StepForms = StepForms()):
  """Adds one micro-batch's gradient and metric sums to `sums` (None for the first)."""
  micro_rng = jax.random.fold_in(jax.random.fold_in(rng, step), micro_step)
  grads, metrics = loss_and_grads(params, batch, micro_rng, model=model,
                                  label_smoothing=label_smoothing, forms=forms)
  return (grads, metrics) if sums is None else jax.tree.map(jnp.add, sums, (grads, metrics))


def accumulation_steps(config, data_shards: int) -> int:
  """Micro-batches per optimizer step so that each device's micro-batch, padded, holds at most
  `micro_batch_tokens_per_device` slots per side (0: no limit): shards x micro-batch x steps
  >= the padded budget of tokens_per_batch real tokens (bucketing.padded_budget)."""
  per_device = config.get("micro_batch_tokens_per_device", 0)
  if not per_device:
    return 1
  return -(-bucketing.padded_budget(config.tokens_per_batch) // (per_device * data_shards))


def eval_step(params, batch, *, model, label_smoothing: float, forms: StepForms = StepForms()):
  if forms.aligned_tokens:
    batch = with_aligned_rows(batch, forms.aligned_tokens)
  logits = model.apply({"params": params}, batch["inputs"], batch["targets"], train=False)
  loss_sum, nll_sum, tokens = loss.label_smoothed_nll(logits, batch["targets"], label_smoothing,
                                                      forms.loss)
  return {"loss_sum": loss_sum, "nll_sum": nll_sum, "tokens": tokens}


def summarize(sums: dict) -> dict:
  """Per-token loss, NLL and perplexity from summed metrics (host floats)."""
  tokens = max(float(sums["tokens"]), 1.0)
  nll = float(sums["nll_sum"]) / tokens
  return {"loss": float(sums["loss_sum"]) / tokens, "nll": nll, "perplexity": float(np.exp(nll))}
