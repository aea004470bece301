"""The training state and the jitted steps: pure functions of (state, batch, rng)."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax.training import train_state

from aiayn_flax import loss, model as model_lib, optimizer


def make_model(config) -> model_lib.Transformer:
  return model_lib.Transformer(ml_collections.FrozenConfigDict(config.model))


def init_params(model: model_lib.Transformer, seed: int):
  dummy = jnp.ones((1, 8), jnp.int32)
  return model.init(jax.random.key(seed), dummy, dummy)["params"]


def create_train_state(config, model) -> train_state.TrainState:
  return train_state.TrainState.create(apply_fn=model.apply, params=init_params(model, config.seed),
                                       tx=optimizer.make_optimizer(config))


def dropout_key(seed: int) -> jax.Array:
  """The base key of dropout; each step folds in its step number."""
  return jax.random.fold_in(jax.random.key(seed), 1)


def loss_and_grads(params, batch, rng, *, model, label_smoothing: float):
  """Gradient of the smoothed loss per real target token, and the metric sums."""
  def loss_fn(p):
    logits = model.apply({"params": p}, batch["inputs"], batch["targets"], train=True,
                         rngs={"dropout": rng})
    loss_sum, nll_sum, tokens = loss.label_smoothed_nll(logits, batch["targets"], label_smoothing)
    return loss_sum / jnp.maximum(tokens, 1.0), (loss_sum, nll_sum, tokens)
  (_, (loss_sum, nll_sum, tokens)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return grads, {"loss_sum": loss_sum, "nll_sum": nll_sum, "tokens": tokens}


def train_step(state, batch, rng, *, model, label_smoothing: float, schedule):
  """One optimizer update; metrics stay on device (the loop fetches them when it logs)."""
  step_rng = jax.random.fold_in(rng, state.step)
  grads, metrics = loss_and_grads(state.params, batch, step_rng, model=model,
                                  label_smoothing=label_smoothing)
  metrics["grad_norm"] = optax.global_norm(grads)
  metrics["learning_rate"] = schedule(state.step)
  return state.apply_gradients(grads=grads), metrics


def eval_step(params, batch, *, model, label_smoothing: float):
  logits = model.apply({"params": params}, batch["inputs"], batch["targets"], train=False)
  loss_sum, nll_sum, tokens = loss.label_smoothed_nll(logits, batch["targets"], label_smoothing)
  return {"loss_sum": loss_sum, "nll_sum": nll_sum, "tokens": tokens}


def summarize(sums: dict) -> dict:
  """Per-token loss, NLL and perplexity from summed metrics (host floats)."""
  tokens = max(float(sums["tokens"]), 1.0)
  nll = float(sums["nll_sum"]) / tokens
  return {"loss": float(sums["loss_sum"]) / tokens, "nll": nll, "perplexity": float(np.exp(nll))}
