"""Adam with the paper's learning-rate schedule (section 5.3, equation 3)."""
import jax.numpy as jnp
import optax


def paper_learning_rate(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1.

  optax counts updates from 0, so the first update uses step 1.
  """
  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)
  return schedule


def learning_rate_schedule(config) -> optax.Schedule:
  return paper_learning_rate(config.model.d_model, config.warmup_steps,
                             config.learning_rate_scale)


def make_optimizer(config) -> optax.GradientTransformation:
  """Adam(beta1 0.9, beta2 0.98, eps 1e-9) on the schedule above.

  An update whose gradient holds a NaN or Inf is skipped (parameters and Adam moments stay as
  they were) and counted in the state's `notfinite_count`; the trainer stops after
  `max_consecutive_nonfinite_steps` of them. optax's own give-up-and-apply is disabled.
  """
  adam = optax.adam(learning_rate_schedule(config), b1=config.adam_b1, b2=config.adam_b2,
                    eps=config.adam_eps)
  return optax.apply_if_finite(adam, max_consecutive_errors=2**31 - 1)
