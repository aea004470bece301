"""Loss, schedule, and the training step."""
import functools

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


def test_both_forms_of_the_target_logit_give_the_same_values_and_gradients():
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(3, 5, 17)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 17, (3, 5)), jnp.int32)
  forms = [loss.target_logit_by_gather, loss.target_logit_by_select, loss.target_logit]
  weights = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
  values = [form(logits, targets) for form in forms]
  grads = [jax.grad(lambda x, f=form: jnp.sum(f(x, targets) * weights))(logits) for form in forms]
  for value, grad in zip(values[1:], grads[1:]):
    np.testing.assert_array_equal(value, values[0])  # one nonzero term: exact
    np.testing.assert_array_equal(grad, grads[0])


def test_the_loss_scatters_on_the_cpu_alone():
  """platform_dependent picks the form when the step is lowered: a CPU keeps the gather (the
  faster there), a GPU or TPU target gets the select, whose gradient is no scatter."""
  logits = jax.ShapeDtypeStruct((2, 3, 11), jnp.float32)
  targets = jax.ShapeDtypeStruct((2, 3), jnp.int32)
  grad = jax.jit(jax.grad(lambda x, t: loss.label_smoothed_nll(x, t, 0.1)[0]))
  def lowered(platform):
    return grad.trace(logits, targets).lower(lowering_platforms=(platform,)).as_text()
  assert "scatter" in lowered("cpu")
  for platform in ("cuda", "tpu"):
    text = lowered(platform)
    assert "scatter" not in text and "compare" in text


@pytest.mark.parametrize("step", [1, 4000, 100000])
def test_learning_rate_follows_equation_3(step):
  schedule = optimizer.paper_learning_rate(512, 4000)
  expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
  np.testing.assert_allclose(schedule(step - 1), expected, rtol=1e-6)  # optax counts from 0


def test_learning_rate_scale_multiplies():
  np.testing.assert_allclose(optimizer.paper_learning_rate(256, 1000, 2.0)(999),
                             2.0 * 256 ** -0.5 * 1000 ** -0.5, rtol=1e-6)


def _toy_state_and_batches(dropout_rate=0.0, dtype="float32"):
  from aiayn_flax import train_step
  from configs import toy
  config = toy.get_config()
  config.model.num_layers = 1  # conftest.TOY_ONE_LAYER: the equalities do not depend on depth
  config.model.dropout_rate, config.model.dtype = dropout_rate, dtype
  config.label_smoothing = 0.1
  config.learning_rate_scale = 0.5  # high enough that a few steps visibly lower the loss
  model = train_step.make_model(config)
  rng = np.random.default_rng(0)
  batches = []
  for pad_from in (9, 5, 12):  # micro-batches with different numbers of real tokens
    batch = {k: rng.integers(4, 20, (8, 12)).astype(np.int32) for k in ("inputs", "targets")}
    batch["targets"][:, pad_from:] = 0
    batches.append(batch)
  return config, model, train_step.create_train_state(config, model), batches


def test_accumulating_micro_batches_equals_one_step_on_their_concatenation():
  from aiayn_flax import train_step
  config, model, state, batches = _toy_state_and_batches()
  rng = train_step.dropout_key(0)
  whole = {k: np.concatenate([b[k] for b in batches]) for k in ("inputs", "targets")}
  # Compiled, as the trainer runs them: op by op (each op compiled alone) 18.6 s against 14.2.
  loss_and_grads = jax.jit(functools.partial(train_step.loss_and_grads, model=model,
                                             label_smoothing=0.1))
  accumulate_step = jax.jit(functools.partial(train_step.accumulate_step, model=model,
                                              label_smoothing=0.1))
  expected_grads, expected = loss_and_grads(state.params, whole, rng)
  sums = None
  for i, batch in enumerate(batches):
    sums = accumulate_step(sums, state.params, batch, rng, state.step, i)
  grads, metrics = sums
  assert float(metrics["tokens"]) == float(expected["tokens"]) == float((whole["targets"] > 0).sum())
  np.testing.assert_allclose(metrics["loss_sum"], expected["loss_sum"], rtol=1e-6)
  # The update divides by the total number of real tokens of the three micro-batches, so the
  # gradient per token is the concatenated batch's, though the micro-batches' counts differ.
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
    np.testing.assert_allclose(a / metrics["tokens"], b / expected["tokens"], atol=1e-6, rtol=0)
  updated, _ = jax.jit(functools.partial(train_step.apply_gradient_sums,
                                         schedule=optimizer.learning_rate_schedule(config)))(
      state, grads, metrics)
  assert int(updated.step) == 1  # one optimizer update for the three micro-batches


@pytest.mark.parametrize("num_steps", [3, 2])
def test_several_steps_in_one_call_equal_the_same_steps_one_by_one(num_steps):
  from aiayn_flax import train_step
  config, model, state, batches = _toy_state_and_batches(dropout_rate=0.1)  # one shape
  schedule = optimizer.learning_rate_schedule(config)
  rng = train_step.dropout_key(0)
  one = jax.jit(functools.partial(train_step.train_step, model=model, label_smoothing=0.1,
                                  schedule=schedule))
  several = jax.jit(functools.partial(train_step.train_steps, model=model, label_smoothing=0.1,
                                      schedule=schedule))
  expected, sums = state, None
  for batch in batches[:num_steps]:
    expected, metrics = one(expected, batch, rng)
    sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
  stacked = {k: np.stack([b[k] for b in batches]) for k in ("inputs", "targets")}  # K = 3
  got, got_sums = several(state, stacked, num_steps, rng)
  assert int(got.step) == num_steps
  # Bit for bit: the same updates, dropout masks and Adam moments; the unused batch is skipped.
  for a, b in zip(jax.tree.leaves((got.params, got.opt_state)),
                  jax.tree.leaves((expected.params, expected.opt_state))):
    np.testing.assert_array_equal(a, b)
  for key in sums:
    np.testing.assert_allclose(got_sums[key], sums[key], rtol=1e-6)
  assert float(got_sums["tokens"]) == sum(float((b["targets"] > 0).sum())
                                          for b in batches[:num_steps])


def test_the_initial_state_compiled_for_one_call_is_jits_bit_for_bit():
  """devices.call_once compiles the trainer's initial state with LLVM at -O1 on a CPU (at -O0
  some arrays round otherwise): every array the same as jax.jit's at XLA's default level."""
  from aiayn_flax import devices, train_step
  from configs import toy
  config = toy.get_config()
  model = train_step.make_model(config)
  new_state = lambda: train_step.create_train_state(config, model)  # noqa: E731
  once, jitted = devices.call_once(new_state, "cpu"), jax.jit(new_state)()
  assert jax.tree.structure(once) == jax.tree.structure(jitted)
  for a, b in zip(jax.tree.leaves(once), jax.tree.leaves(jitted)):
    np.testing.assert_array_equal(a, b)


def test_the_states_shapes_and_logical_specs_from_one_trace_are_those_of_two():
  from aiayn_flax import train_step
  from configs import toy
  config = toy.get_config()
  model = train_step.make_model(config)
  shapes, specs = train_step.state_shapes_and_logical_specs(config, model)
  expected = jax.eval_shape(lambda: train_step.create_train_state(config, model))
  assert jax.tree.leaves(shapes) == jax.tree.leaves(expected)  # shapes, dtypes, weak types
  assert jax.tree.structure(shapes.opt_state) == jax.tree.structure(expected.opt_state)
  assert jax.tree.structure(shapes.params) == jax.tree.structure(expected.params)
  assert specs == train_step.logical_param_specs(model)


def test_accumulation_steps_follow_the_device_budget():
  from aiayn_flax import train_step
  from configs import base
  config = base.get_config()
  assert train_step.accumulation_steps(config, 8) == 1
  config.micro_batch_tokens_per_device = 1000
  # 25,000 real tokens are batched within 31,250 padded slots per side
  assert train_step.accumulation_steps(config, 8) == 4  # 8 x 1000 x 4 >= 31250
  assert train_step.accumulation_steps(config, 1) == 32  # 1000 x 32 >= 31250


def test_bfloat16_training_lowers_a_finite_loss_and_keeps_float32_parameters():
  from aiayn_flax import train_step
  config, model, state, batches = _toy_state_and_batches(dropout_rate=0.1, dtype="bfloat16")
  step = jax.jit(lambda s, b: train_step.train_step(
      s, b, train_step.dropout_key(0), model=model, label_smoothing=0.1,
      schedule=optimizer.learning_rate_schedule(config)))
  losses = []
  for _ in range(15):
    state, metrics = step(state, batches[0])
    losses.append(float(metrics["loss_sum"] / metrics["tokens"]))
  assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.5, losses
  assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {jnp.dtype("float32")}
  logits = jax.jit(model.apply)({"params": state.params}, batches[0]["inputs"],
                                batches[0]["targets"])
  assert logits.dtype == jnp.float32  # softmax and loss in float32


def test_a_validation_decode_leaves_no_copy_of_the_parameters_on_the_devices(tmp_path):
  """Training's validation BLEU places the parameters whole on every device to decode; that
  copy is dropped afterwards, or it would hold a whole model on each device through training
  (undoing what FSDP or a `model` axis saves)."""
  import gc
  from aiayn_flax import tasks, train_step
  from aiayn_flax.training import trainer
  from aiayn_flax.data import pipeline, source_text
  from aiayn_flax.translator import Translator
  from configs import toy
  config = toy.get_config()
  model, task = train_step.make_model(config), tasks.for_config(config)
  params = jax.device_get(train_step.init_params(model, 0))  # on the host, as checkpoints are
  translator = Translator(model, None, pipeline.vocabulary_for(config, str(tmp_path), task),
                          beam_size=1, extra_length=config.decode_extra_length, batch_size=8)
  sources, references = (lines[:8] for lines in source_text.text_pairs(config, "validation"))

  def device_bytes():
    gc.collect()
    return sum(x.nbytes for x in jax.live_arrays())
  before = device_bytes()
  trainer.evaluate_translations(translator, params, sources, references, task)
  assert translator.params is None
  model_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  assert device_bytes() - before < model_bytes / 2


@pytest.mark.slow  # trains the toy model twice
def test_eval_every_steps_zero_trains_the_same_steps_without_evaluating(tmp_path):
  """`eval_every_steps=0`: no evaluation while training, not even at the end (evaluate.py
  scores the run afterwards); the parameters are those of a run that evaluates; 0 or more."""
  from aiayn_flax import config_checks
  from aiayn_flax.training import trainer
  from configs import toy
  summaries = {}
  for every in (0, 4):
    config = toy.get_config()
    config.update(num_train_steps=4, eval_every_steps=every, checkpoint_every_steps=4,
                  log_every_steps=2)
    config.dataset.toy_eval_examples = 8
    summaries[every] = trainer.train_and_evaluate(config, str(tmp_path / str(every)))
  assert not [key for key in summaries[0] if key.startswith("valid/")]
  assert "valid/loss" in summaries[4] and "valid/exact_match" in summaries[4]
  assert summaries[0]["step"] == summaries[4]["step"] == 4
  assert summaries[0]["params_digest"] == summaries[4]["params_digest"]
  config.eval_every_steps = -1
  with pytest.raises(ValueError, match=r"^config\.eval_every_steps=-1: must be 0 \(no "
                                       r"evaluation while training: evaluate\.py afterwards\) "
                                       r"or positive$"):
    config_checks.check_config(config)
