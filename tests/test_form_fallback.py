"""A GPU form that does not compile stops nothing (programs.py): the trainer and the
translator's decoding go on with the plain forms after one warning naming the form and its
switch, with the plain run's results; the planner says when a program fails to compile for
another reason than the device's memory. The failing form here is a Pallas kernel compiled for
a platform its Triton lowering does not serve (this CPU), as a Pallas kernel that asks more
shared memory than its GPU has fails only when that GPU's compiler sees it."""
import functools
import logging

import jax
import numpy as np
import pytest
from jax.experimental import pallas

from aiayn_flax import model as model_lib, programs
from aiayn_flax.attention import backends, forms


def _copy(x_ref, out_ref):
  out_ref[...] = x_ref[...]


def _gpu_kernel(x):
  return pallas.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


@jax.custom_vjp
def uncompilable(x):
  """x, through a kernel that traces and differentiates but does not lower for a CPU."""
  return _gpu_kernel(x)


uncompilable.defvjp(lambda x: (_gpu_kernel(x), None), lambda _, g: (_gpu_kernel(g),))


def _run_uncompilable(q, k, v, mask, bias, call, target, module):
  return uncompilable(forms.through_jax(q, k, v, mask, bias, implementation="xla"))


@pytest.fixture
def untested_kernel(monkeypatch):
  """A backend "untested_kernel" that serves every training call and never compiles."""
  monkeypatch.setitem(backends.BACKENDS, "untested_kernel", backends.Backend(
      "untested_kernel", backends.BACKENDS["xla"].refuses, _run_uncompilable))


def toy_config(attention: str, steps: int = 4):
  from configs import toy
  config = toy.get_config()
  config.model.update(num_layers=1, attention_implementation=attention)
  config.update(num_train_steps=steps, checkpoint_every_steps=steps, eval_every_steps=0,
                log_every_steps=steps)
  return config


def warnings_of(caplog) -> list[str]:
  return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
          and "did not compile" in r.getMessage()]


@pytest.mark.slow
def test_the_trainer_falls_back_to_the_written_out_attention_with_the_same_digest(
    untested_kernel, tmp_path, caplog):
  from aiayn_flax.training import trainer
  caplog.set_level(logging.WARNING)
  fell_back = trainer.train_and_evaluate(toy_config("untested_kernel"), str(tmp_path / "a"))
  (warning,) = warnings_of(caplog)
  assert warning.startswith("training: step_fn did not compile with "
                            "model.attention_implementation=untested_kernel (ValueError: Only "
                            "interpret mode is supported on CPU backend.)")
  assert ("going on with model.attention_implementation=written_out: set "
          "--config.model.attention_implementation=written_out to start so") in warning
  written_out = trainer.train_and_evaluate(toy_config("written_out"), str(tmp_path / "b"))
  assert fell_back["step"] == written_out["step"] == 4
  assert fell_back["params_digest"] == written_out["params_digest"]


def tiny_programs(attention: str):
  """A tiny toy model's training programs on one CPU device: (config, model, the state's
  shapes and sharding, the programs)."""
  from aiayn_flax import sharding, train_step
  config = toy_config(attention)
  config.model.update(vocab_size=24, d_model=16, d_ff=32, num_heads=2)
  model = train_step.make_model(config)
  mesh = sharding.data_parallel_mesh(jax.devices()[:1])
  shapes, specs = train_step.state_shapes_and_logical_specs(config, model)
  state_sharding = sharding.train_state_shardings(mesh, shapes, specs, config.fsdp)
  return (config, model, shapes, state_sharding,
          programs.training_programs(config, model, mesh, state_sharding))


def test_a_program_falls_back_form_by_form_and_reraises_where_the_plain_forms_fail(
    untested_kernel, monkeypatch, caplog):
  """The attention first; where the plain forms do not compile either (the written-out form
  made to fail too), the error is the caller's."""
  from aiayn_flax import train_step
  caplog.set_level(logging.WARNING)
  config, model, shapes, state_sharding, built = tiny_programs("untested_kernel")
  state = jax.device_put(train_step.create_train_state(config, model, shapes.tx), state_sharding)
  batch = {k: np.full((4, 6), 5, np.int32) for k in ("inputs", "targets")}
  built.eval_fn(state.params, batch)  # inference: written out, whatever training asks
  assert not warnings_of(caplog)

  monkeypatch.setitem(backends.BACKENDS, "written_out", backends.Backend(
      "written_out", backends.BACKENDS["written_out"].refuses, _run_uncompilable))
  state = jax.device_put(train_step.create_train_state(config, model, shapes.tx), state_sharding)
  with pytest.raises(ValueError, match="Only interpret mode is supported on CPU backend"):
    built.step_fn(state, batch, train_step.dropout_key(0))
  attention, rest = warnings_of(caplog)
  assert "with model.attention_implementation=untested_kernel" in attention
  assert ("with model.layer_norm_implementation=auto, loss_implementation=auto, "
          "optimizer_implementation=auto" in rest)
  assert "going on with model.layer_norm_implementation=flax, loss_implementation=reductions, "\
         "optimizer_implementation=per_array" in rest
  assert built.forms.fell_back == list(programs.PLAIN_FORMS)


def test_an_error_in_tracing_is_the_program_s_and_no_fallback(monkeypatch, caplog):
  """A program that does not trace (a bug of its own, here a loss called with the wrong
  arguments) raises as it is: no form is blamed, nothing falls back."""
  from aiayn_flax import loss, sharding, train_step
  caplog.set_level(logging.WARNING)
  _, _, shapes, state_sharding, built = tiny_programs("auto")
  state = sharding.placed(shapes, state_sharding)
  batch = {k: jax.ShapeDtypeStruct((4, 6), np.int32) for k in ("inputs", "targets")}
  monkeypatch.setattr(loss, "label_smoothed_nll", lambda logits, targets: None)
  with pytest.raises(TypeError, match="positional argument"):
    built.step_fn.compile(state, batch, jax.eval_shape(lambda: train_step.dropout_key(0)))
  assert not warnings_of(caplog) and built.forms.fell_back == []


def test_the_planner_falls_back_as_the_trainer_and_tells_a_kernel_from_device_memory(
    untested_kernel, monkeypatch, caplog):
  """The start-up fit (a device memory budget given, so it compiles) hands the trainer the
  config its compiles fell back to; a program that no form compiles is DoesNotCompile, which
  says it is not the device's memory, where an overflow is DoesNotFit."""
  from aiayn_flax.planning import compiled_plan, fit
  caplog.set_level(logging.WARNING)
  config = toy_config("untested_kernel")
  config.device_memory_bytes = 2**30
  fitted = fit.for_local_devices(config)
  assert fitted.fits and fitted.config.model.attention_implementation == "written_out"
  assert len(warnings_of(caplog)) == 1

  monkeypatch.setitem(backends.BACKENDS, "written_out", backends.Backend(
      "written_out", backends.BACKENDS["written_out"].refuses, _run_uncompilable))
  with pytest.raises(compiled_plan.DoesNotCompile,
                     match=r"^train_step \(43x12\) does not compile for this target, and not "
                           r"for its memory: ValueError: Only interpret mode"):
    fit.for_local_devices(config)
  assert programs.is_device_memory_error(RuntimeError(
      "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space "
      "hbm. Used 20.1G of 15.75G hbm. Exceeded hbm capacity by 4.4G."))
  assert not programs.is_device_memory_error(RuntimeError(
      "RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 262144, available: "
      "232448"))


def test_the_translator_falls_back_to_flax_s_layer_norm_with_the_same_translations(
    monkeypatch, caplog):
  """Decoding (evaluate.py, translate.py, training's validation) built with a layer norm that
  does not compile goes on with flax's, after one warning: the same tokens."""
  from aiayn_flax import translator
  from test_model import init, random_tokens, small_model
  caplog.set_level(logging.WARNING)
  inputs = random_tokens(np.random.default_rng(0), 4, 16).at[:, 12:].set(0)
  plain = small_model(num_layers=1, layer_norm_implementation="flax",
                      attention_implementation="written_out")
  params = init(plain, jax.random.key(0), inputs, inputs[:, :5])["params"]
  one_pass = model_lib.layer_norm_one_pass
  monkeypatch.setattr(model_lib, "layer_norm_one_pass",
                      lambda x, *a, **k: uncompilable(one_pass(x, *a, **k)))
  failing = small_model(num_layers=1, layer_norm_implementation="one_pass",
                        attention_implementation="written_out")
  decode = functools.partial(translator.make_decode_fn, beam_size=1, alpha=0.6,
                             extra_length=8)
  expected = decode(plain)(params, inputs)
  decoding = programs.DecodingWithFallback(failing, decode)
  np.testing.assert_array_equal(decoding(params, inputs), expected)
  (warning,) = warnings_of(caplog)
  assert warning.startswith("decoding did not compile with model.layer_norm_implementation="
                            "one_pass (ValueError: Only interpret mode is supported")
  assert decoding.fell_back


def test_a_run_saved_before_the_forms_were_fields_falls_back_from_the_forms_it_ran(caplog):
  """A config saved before the GPU forms became fields ran "auto" forms and 256-token rows (the
  registry's old-run defaults), not the plain ones: where its program does not compile, those
  are the forms it falls back from."""
  from configs import multi30k
  caplog.set_level(logging.WARNING)
  config = multi30k.get_config()
  config.model.attention_implementation = "written_out"
  for block, key in (("model", "layer_norm_implementation"), (None, "loss_implementation"),
                     (None, "optimizer_implementation"), (None, "aligned_row_tokens")):
    del (config[block] if block else config)[key]
  fallback = programs.FormFallback(config, lambda c: {}, "training")
  assert fallback.fall_back("step_fn", RuntimeError("no kernel"))
  assert fallback.fell_back == ["model.layer_norm_implementation", "loss_implementation",
                                "optimizer_implementation", "aligned_row_tokens"]
  assert "aligned_row_tokens=256" in warnings_of(caplog)[0]
  assert not fallback.fall_back("step_fn", RuntimeError("no kernel"))
