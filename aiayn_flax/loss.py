"""Label-smoothed cross-entropy (section 5.4), summed over real target tokens."""
import jax
import jax.numpy as jnp

from aiayn_flax.model import PAD_ID


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
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [B, T]
  nll = log_partition - target_logit  # -log p(reference)
  uniform_ce = log_partition - jnp.mean(logits, axis=-1)  # -mean_v log p(v)
  loss = (1.0 - smoothing) * nll + smoothing * uniform_ce
  weights = (targets != PAD_ID).astype(jnp.float32)
  return jnp.sum(loss * weights), jnp.sum(nll * weights), jnp.sum(weights)
