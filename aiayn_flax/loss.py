"""Label-smoothed cross-entropy (section 5.4), summed over real target tokens."""
import jax
import jax.numpy as jnp

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
  return jax.lax.platform_dependent(logits, targets, cpu=target_logit_by_gather,
                                    default=target_logit_by_select)


def label_smoothed_nll(logits: jnp.ndarray, targets: jnp.ndarray, smoothing: float):
  """Returns (smoothed loss sum, NLL sum, number of real target tokens), all float32 scalars.

  The smoothed target puts 1 - smoothing on the reference token and smoothing / V on every
  token (the reference included), the definition PyTorch and fairseq use. Its cross-entropy
  is computed from the log-partition and the mean logit, without materialising either the
  smoothed distribution or the [B, T, V] log-probabilities. Padding contributes nothing.
  """
  # logits: [B, T, V]; targets: [B, T]
  logits = logits.astype(jnp.float32)
  log_partition = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
  nll = log_partition - target_logit(logits, targets)  # -log p(reference)
  uniform_ce = log_partition - jnp.mean(logits, axis=-1)  # -mean_v log p(v)
  loss = (1.0 - smoothing) * nll + smoothing * uniform_ce
  weights = (targets != PAD_ID).astype(jnp.float32)
  return jnp.sum(loss * weights), jnp.sum(nll * weights), jnp.sum(weights)
