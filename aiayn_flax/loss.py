"""Label-smoothed cross-entropy (section 5.4), summed over real target tokens."""
import functools

import jax
import jax.numpy as jnp

from aiayn_flax import devices
from aiayn_flax.model import PAD_ID


def target_logit_by_gather(logits: jnp.ndarray, targets: jnp.ndarray) -> jnp.ndarray:
  """[B, T, V], [B, T] -> [B, T]. Its gradient is a scatter into a zero [B, T, V] buffer."""
  return jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]


def target_logit_by_select(logits: jnp.ndarray, targets: jnp.ndarray) -> jnp.ndarray:
  """The same values, as a sum over the vocabulary of the logit where the token matches: its
  gradient is a select that fuses with the softmax's gradient."""
  vocabulary = jax.lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1)
  return jnp.sum(jnp.where(vocabulary == targets[..., None], logits, 0.0), axis=-1)


def target_logit(logits: jnp.ndarray, targets: jnp.ndarray) -> jnp.ndarray:
  """The reference token's logit, in the form that suits where the step is compiled for. On
  an H200 (base, 976 x 32, bf16) the gather's backward scatter was one 4.1 ms kernel of the
  step's 46 ms; the select left the step's time as it was and took 2.3 GB off its peak memory.
  On the CPU the select was the slower (docs/PERFORMANCE.md has both). Chosen when the step is
  lowered, so that a deviceless compile for a TPU or GPU gets the form of its target."""
  return devices.platform_dependent(logits, targets, cpu=target_logit_by_gather,
                                    default=target_logit_by_select)


def _combine(a, b):
  """Merges two partial reductions over the vocabulary: (max, sum of exp(logit - max), sum of
  logits, the reference logit). Associative, so XLA may reduce in any order and in one pass."""
  (max_a, exp_a, sum_a, ref_a), (max_b, exp_b, sum_b, ref_b) = a, b
  new_max = jnp.maximum(max_a, max_b)
  rescaled = lambda s, m: jnp.where(m == -jnp.inf, 0.0, s * jnp.exp(m - new_max))  # noqa: E731
  return new_max, rescaled(exp_a, max_a) + rescaled(exp_b, max_b), sum_a + sum_b, ref_a + ref_b


def _one_pass_statistics(logits, targets):
  """[B, T, V] -> the log-partition, the mean logit and the reference logit, [B, T] f32 each,
  from one variadic reduction: the logits are read once (an online softmax's max and sum)."""
  x = logits.astype(jnp.float32)
  vocabulary = jax.lax.broadcasted_iota(targets.dtype, x.shape, x.ndim - 1)
  reference = jnp.where(vocabulary == targets[..., None], x, 0.0)
  zero = jnp.zeros((), jnp.float32)
  maximum, exp_sum, logit_sum, reference = jax.lax.reduce(
      (x, jnp.ones_like(x), x, reference), (jnp.array(-jnp.inf, jnp.float32), zero, zero, zero),
      _combine, (x.ndim - 1,))
  return maximum + jnp.log(exp_sum), logit_sum / x.shape[-1], reference


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def fused_smoothed_nll(logits: jnp.ndarray, targets: jnp.ndarray, smoothing: float):
  """Per position (smoothed loss, NLL), [B, T] f32 each, equal to the plain form's
  (label_smoothed_nll's) within float rounding, in two passes over the logits: one reduction
  forward and one elementwise gradient, which writes the logits' cotangent in their dtype.
  Saves only the log-partition (f32) besides the logits themselves."""
  return _fused_forward(logits, targets, smoothing)[0]


def _fused_forward(logits, targets, smoothing):
  log_partition, mean_logit, reference = _one_pass_statistics(logits, targets)
  nll = log_partition - reference
  loss = (1.0 - smoothing) * nll + smoothing * (log_partition - mean_logit)
  return (loss, nll), (logits, targets, log_partition)


def _fused_backward(smoothing, residuals, cotangents):
  logits, targets, log_partition = residuals
  d_loss, d_nll = cotangents  # [B, T]
  probabilities = jnp.exp(logits.astype(jnp.float32) - log_partition[..., None])
  vocabulary = jax.lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1)
  reference = (vocabulary == targets[..., None]).astype(jnp.float32)
  # d/dx of (1-s) nll + s (lse - mean x): softmax - (1-s) onehot - s/V; of nll: softmax - onehot
  d_logits = ((d_loss + d_nll)[..., None] * probabilities
              - ((1.0 - smoothing) * d_loss + d_nll)[..., None] * reference
              - (smoothing / logits.shape[-1]) * d_loss[..., None])
  return d_logits.astype(logits.dtype), None


fused_smoothed_nll.defvjp(_fused_forward, _fused_backward)


def smoothed_nll_by_reductions(logits: jnp.ndarray, targets: jnp.ndarray, smoothing: float):
  """Per position (smoothed loss, NLL), [B, T] f32 each, as separate reductions (the max, the
  sum of exponentials, the mean logit, the reference logit), differentiated by JAX. The faster
  form on the CPU, where XLA does not vectorise fused_smoothed_nll's variadic reduction (4x
  slower there: docs/PERFORMANCE.md)."""
  logits = logits.astype(jnp.float32)
  log_partition = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
  nll = log_partition - target_logit(logits, targets)  # -log p(reference)
  uniform_ce = log_partition - jnp.mean(logits, axis=-1)  # -mean_v log p(v)
  return (1.0 - smoothing) * nll + smoothing * uniform_ce, nll


def per_position(logits: jnp.ndarray, targets: jnp.ndarray, smoothing: float, form: str):
  """(smoothed loss, NLL) per position in `form` (config.loss_implementation): "reductions",
  "fused", or "auto", chosen where the step is lowered (fused on a GPU)."""
  reductions = lambda x, t: smoothed_nll_by_reductions(x, t, smoothing)  # noqa: E731
  fused = lambda x, t: fused_smoothed_nll(x, t, smoothing)  # noqa: E731
  if form != "auto":
    return {"reductions": reductions, "fused": fused}[form](logits, targets)
  return devices.platform_dependent(logits, targets, cpu=reductions, tpu=reductions,
                                    default=fused)


def label_smoothed_nll(logits: jnp.ndarray, targets: jnp.ndarray, smoothing: float,
                       form: str = "auto"):
  """Returns (smoothed loss sum, NLL sum, number of real target tokens), all float32 scalars.

  The smoothed target puts 1 - smoothing on the reference token and smoothing / V on every
  token (the reference included), the definition PyTorch and fairseq use. Its cross-entropy
  is computed from the log-partition and the mean logit, without materialising either the
  smoothed distribution or the [B, T, V] log-probabilities. Padding contributes nothing. On a
  GPU the logits are read twice in all (fused_smoothed_nll); the CPU and TPUs keep the
  reductions (on a TPU, XLA's cost analysis counted more bytes for the other forms:
  docs/PERFORMANCE.md).
  """
  with jax.named_scope("loss"):
    loss, nll = per_position(logits, targets, smoothing, form)  # [B, T] each
    weights = (targets != PAD_ID).astype(jnp.float32)
    return jnp.sum(loss * weights), jnp.sum(nll * weights), jnp.sum(weights)
