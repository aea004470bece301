"""Loss, schedule, and the training step."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aiayn_flax import loss, optimizer


def test_label_smoothed_loss_equals_hand_computation():
  logits = np.array([[[2.0, 1.0, 0.0, -1.0], [0.5, 0.5, 3.0, 0.0], [9.0, 9.0, 9.0, 9.0]]])
  targets = np.array([[2, 3, 0]])  # the last position is padding
  eps, vocab = 0.1, 4
  expected_loss = expected_nll = 0.0
  for t in range(2):
    p = np.exp(logits[0, t]) / np.exp(logits[0, t]).sum()
    smoothed = np.full(vocab, eps / vocab)
    smoothed[targets[0, t]] += 1 - eps
    expected_loss += -(smoothed * np.log(p)).sum()
    expected_nll += -np.log(p[targets[0, t]])
  loss_sum, nll_sum, tokens = loss.label_smoothed_nll(jnp.asarray(logits), targets, eps)
  np.testing.assert_allclose(loss_sum, expected_loss, rtol=1e-6)
  np.testing.assert_allclose(nll_sum, expected_nll, rtol=1e-6)
  assert tokens == 2


def test_padding_contributes_nothing_to_the_loss():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 11)).astype(np.float32)
  targets = np.array([[4, 5, 6, 0, 0], [7, 8, 0, 0, 0]])
  sums = loss.label_smoothed_nll(logits, targets, 0.1)
  logits[targets == 0] = rng.normal(size=(5, 11)) * 100  # garbage under the padding
  np.testing.assert_array_equal(sums, loss.label_smoothed_nll(logits, targets, 0.1))


def test_loss_gradient_matches_explicit_smoothed_distribution():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(3, 4, 13)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 13, (3, 4)))

  def explicit(x):
    smoothed = jax.nn.one_hot(targets, 13) * 0.9 + 0.1 / 13
    per_token = -(smoothed * jax.nn.log_softmax(x)).sum(-1)
    return jnp.sum(per_token * (targets != 0))

  fast = lambda x: loss.label_smoothed_nll(x, targets, 0.1)[0]  # noqa: E731
  np.testing.assert_allclose(fast(logits), explicit(logits), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(fast)(logits), jax.grad(explicit)(logits), atol=1e-6)


@pytest.mark.parametrize("step", [1, 4000, 100000])
def test_learning_rate_follows_equation_3(step):
  schedule = optimizer.paper_learning_rate(512, 4000)
  expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
  np.testing.assert_allclose(schedule(step - 1), expected, rtol=1e-6)  # optax counts from 0


def test_learning_rate_scale_multiplies():
  np.testing.assert_allclose(optimizer.paper_learning_rate(256, 1000, 2.0)(999),
                             2.0 * 256 ** -0.5 * 1000 ** -0.5, rtol=1e-6)
