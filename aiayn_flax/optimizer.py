"""Adam with the paper's learning-rate schedule (section 5.3, equation 3)."""
import jax
import jax.flatten_util
import jax.numpy as jnp
import optax

from aiayn_flax import devices, sharding


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
  return skip_nonfinite(adam, update_form(config))


def state_is_whole_on_each_device(config) -> bool:
  """Whether every device holds the whole optimizer state (data parallelism alone): then the
  update can run on one vector of all parameters. Sharded (fsdp, a `model` axis), it keeps
  each array apart, as its shards lie."""
  return not config.fsdp and sharding.mesh_axis_sizes(config.mesh).get("model", 1) == 1


def update_form(config) -> str:
  """config.optimizer_implementation where every device holds the whole state, else
  "per_array" (a sharded state keeps its arrays apart, as its shards lie)."""
  if not state_is_whole_on_each_device(config):
    return "per_array"
  return config.get("optimizer_implementation", "auto")


def skip_nonfinite(inner: optax.GradientTransformation,
                   form: str) -> optax.GradientTransformation:
  """optax.apply_if_finite(inner, max_consecutive_errors=2**31 - 1), with the same state (so
  checkpoints are the same either way). With `form` "one_vector" ("auto": on a GPU), the finite
  check is one reduction over one vector of every gradient, where optax's is one per parameter
  array (a kernel launch each: 193 for base); Adam then runs per array, as optax's does, the
  skip a select, so that XLA fuses each array's update in place and merges the small arrays' into a
  few kernels. (Adam on the raveled vector itself, the form before, cost base 131 copies: XLA
  fused the old moments' concatenation into several update kernels, each of which then read
  buffers another one overwrote.) The CPU and TPUs keep optax's form, and their compiled steps
  as they were."""
  per_array = optax.apply_if_finite(inner, max_consecutive_errors=2**31 - 1)

  def update_with_one_check(updates, state):
    finite = jnp.all(jnp.isfinite(jax.flatten_util.ravel_pytree(updates)[0]))
    new_updates, new = inner.update(updates, state.inner_state, None)
    new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state.inner_state)
    state = optax.ApplyIfFiniteState(
        notfinite_count=jnp.where(finite, 0, optax.safe_increment(state.notfinite_count)),
        last_finite=finite,
        total_notfinite=jnp.where(finite, state.total_notfinite,
                                  optax.safe_increment(state.total_notfinite)),
        inner_state=new)
    return jax.tree.map(lambda u: jnp.where(finite, u, 0.0), new_updates), state

  def update(updates, state, params=None):
    del params  # Adam reads none
    by_array = lambda u, s: per_array.update(u, s)  # noqa: E731
    if form in ("per_array", "one_vector"):
      return {"per_array": by_array, "one_vector": update_with_one_check}[form](updates, state)
    return devices.platform_dependent(updates, state, cpu=by_array, tpu=by_array,
                                      default=update_with_one_check)

  return optax.GradientTransformation(per_array.init, update)
