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


def with_linear_cooldown(schedule: optax.Schedule, num_steps: int,
                         cooldown_steps: int) -> optax.Schedule:
  """The schedule times a factor falling linearly from 1 to 0 over the last cooldown_steps of
  num_steps updates (the last update gets 1 / cooldown_steps of it); unchanged before them.

  Not in the paper: the reciprocal-square-root schedule with a linear cooldown (Zhai et al.,
  2022, "Scaling Vision Transformers"), for runs whose length is fixed in advance. The factor
  depends on num_steps: a run resumed with more steps than it was started with trains the same
  only if it stopped before its cooldown began.
  """
  if cooldown_steps == 0:
    return schedule

  def cooled(count):
    factor = jnp.clip((num_steps - jnp.asarray(count, jnp.float32)) / cooldown_steps, 0.0, 1.0)
    return schedule(count) * factor
  return cooled


def learning_rate_schedule(config) -> optax.Schedule:
  paper = paper_learning_rate(config.model.d_model, config.warmup_steps,
                              config.learning_rate_scale)
  return with_linear_cooldown(paper, config.num_train_steps, config.cooldown_steps)


def make_optimizer(config) -> optax.GradientTransformation:
  """Adam(beta1 0.9, beta2 0.98, eps 1e-9) on the schedule above.

  An update whose gradient holds a NaN or Inf is skipped (parameters and Adam moments stay as
  they were) and counted in the state's `notfinite_count`; the trainer stops after
  `max_consecutive_nonfinite_steps` of them. optax's own give-up-and-apply is disabled.
  """
  adam = optax.adam(learning_rate_schedule(config), b1=config.adam_b1, b2=config.adam_b2,
                    eps=config.adam_eps)
  return optax.apply_if_finite(adam, max_consecutive_errors=2**31 - 1)
