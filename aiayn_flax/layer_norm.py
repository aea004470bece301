"""Layer normalization (Ba et al., 2016; section 5.4's residual blocks), Flax's arithmetic on a
CPU and a TPU, and on a GPU the same forward with a backward of its own that XLA compiles into
fewer kernels.

On a CPU and a TPU `LayerNorm` computes what flax.linen.LayerNorm computes, op for op (the
statistics in float32, the variance as E[x^2] - E[x]^2 clipped at 0), with the same parameters
("scale", "bias"), so checkpoints, and every CPU result, are unchanged. On a GPU the forward is
the same and the backward is written out (`one_pass`): the reciprocal deviation is recomputed
from the two saved row means where it is used instead of being saved (XLA launched a kernel for
it), the input's gradient is one formula over two row sums, and the scale's and bias's
gradients are one stacked column sum. Base's step on an H100, counted deviceless: 45 kernels
fewer (docs/PERFORMANCE.md).
"""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp


class LayerNorm(nn.Module):
  """Over the last axis, the output in `dtype`, scale and bias float32."""
  epsilon: float
  dtype: jnp.dtype
  scale_init: object
  bias_init: object

  @nn.compact
  def __call__(self, x):
    features = (x.shape[-1],)
    scale = self.param("scale", self.scale_init, features, jnp.float32)
    bias = self.param("bias", self.bias_init, features, jnp.float32)
    as_flax = functools.partial(flax_form, epsilon=self.epsilon, dtype=self.dtype)
    gpu = functools.partial(one_pass, epsilon=self.epsilon, dtype=self.dtype)
    return jax.lax.platform_dependent(x, scale, bias, cpu=as_flax, tpu=as_flax, default=gpu)


def _row_means(x):
  """E[x] and E[x^2] over the last axis, float32, [...] each."""
  x = x.astype(jnp.float32)
  squares = jax.lax.square(x)  # before the means, as in Flax: the gradient's sums in its order
  return jnp.mean(x, -1), jnp.mean(squares, -1)


def _variance(mean, mean_of_squares):
  return jnp.maximum(0.0, mean_of_squares - jax.lax.square(mean))


def _reciprocal_deviation(mean, mean_of_squares, epsilon):
  """[..., 1], from [...] means."""
  return jax.lax.rsqrt(jnp.expand_dims(_variance(mean, mean_of_squares), -1) + epsilon)


def flax_form(x, scale, bias, *, epsilon, dtype):
  """flax.linen.LayerNorm's operations in its order (flax/linen/normalization.py): on a CPU
  the same bits, values and gradients."""
  mean, mean_of_squares = _row_means(x)
  variance = jnp.expand_dims(_variance(mean, mean_of_squares), -1)
  y = x - jnp.expand_dims(mean, -1)
  multiplier = jax.lax.rsqrt(variance + epsilon)
  multiplier *= scale
  y *= multiplier
  y += bias
  return y.astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _one_pass(x, scale, bias, epsilon, dtype):
  return flax_form(x, scale, bias, epsilon=epsilon, dtype=dtype)


def _one_pass_forward(x, scale, bias, epsilon, dtype):
  mean, mean_of_squares = _row_means(x)
  multiplier = _reciprocal_deviation(mean, mean_of_squares, epsilon) * scale
  y = (((x - jnp.expand_dims(mean, -1)) * multiplier) + bias).astype(dtype)
  return y, (x, mean, mean_of_squares, scale)


def _one_pass_backward(epsilon, dtype, saved, dy):
  x, mean, mean_of_squares, scale = saved
  deviation = _reciprocal_deviation(mean, mean_of_squares, epsilon)
  normalized = (x - jnp.expand_dims(mean, -1)) * deviation
  dy = dy.astype(jnp.float32)
  rows = tuple(range(1, x.ndim))  # of the stacked [2, ..., D] below
  d_scale, d_bias = jnp.sum(jnp.stack([dy * normalized, dy]), axis=rows)
  d_normalized = dy * scale
  d_mean = jnp.mean(d_normalized, -1, keepdims=True)
  d_projection = jnp.mean(d_normalized * normalized, -1, keepdims=True)
  dx = deviation * (d_normalized - d_mean - normalized * d_projection)
  return dx.astype(x.dtype), d_scale, d_bias


_one_pass.defvjp(_one_pass_forward, _one_pass_backward)


def one_pass(x, scale, bias, *, epsilon, dtype):
  """flax_form's values, with the backward written out (the GPU form)."""
  return _one_pass(x, scale, bias, epsilon, dtype)
