"""The GPU forms of the training step (issue 55): each equals the CPU's form on the CPU, the
CPU's compiled step is still the CPU's form, a TPU's lowered loss the reductions, and the step compiled for a GPU, deviceless, holds
no more kernels than bench/gpu_census.py counted (docs/PERFORMANCE.md)."""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aiayn_flax.planning import kernel_census
from aiayn_flax import loss, optimizer
from bench import gpu_bars


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_one_pass_loss_equals_the_reductions_values_and_gradients(dtype):
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(6, 7, 301)) * 4, dtype)
  targets = jnp.asarray(rng.integers(1, 301, (6, 7)), jnp.int32).at[:, 5:].set(0)
  upstream = jnp.asarray(rng.normal(size=(2, 6, 7)), jnp.float32)  # both outputs' cotangents

  def weighted(form, x):
    smoothed, nll = form(x, targets, 0.1)
    return jnp.sum(smoothed * upstream[0] + nll * upstream[1])

  plain, fused = loss.smoothed_nll_by_reductions, loss.fused_smoothed_nll
  for a, b in zip(plain(logits, targets, 0.1), fused(logits, targets, 0.1)):
    np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-5)  # the sums' order differs
  grad_plain = jax.grad(functools.partial(weighted, plain))(logits)
  grad_fused = jax.grad(functools.partial(weighted, fused))(logits)
  assert grad_fused.dtype == dtype
  scale = float(jnp.max(jnp.abs(grad_plain.astype(jnp.float32))))
  tolerance = 1e-5 if dtype == jnp.float32 else 1e-2  # bf16: one rounding of the gradient
  np.testing.assert_allclose(np.asarray(grad_fused, np.float32), np.asarray(grad_plain, np.float32),
                             atol=tolerance * scale)


def test_the_one_pass_loss_of_an_infinite_logit_is_not_finite():
  logits = jnp.zeros((1, 2, 5)).at[0, 0, 3].set(jnp.inf)
  smoothed, _ = loss.fused_smoothed_nll(logits, jnp.array([[1, 2]]), 0.1)
  assert not np.isfinite(smoothed[0, 0]) and np.isfinite(smoothed[0, 1])


def _state_and_gradients():
  from aiayn_flax import train_step
  from configs import toy
  config = toy.get_config()
  config.model.update(vocab_size=64, d_model=32, d_ff=64, num_heads=2, num_layers=1)
  model = train_step.make_model(config)
  state = train_step.create_train_state(config, model)
  rng = np.random.default_rng(3)
  gradients = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype) * 5.0,
                            state.params) for _ in range(3)]
  leaf = jax.tree.leaves(gradients[1])[4]
  gradients[1] = jax.tree.map(lambda g: g.at[(0,) * g.ndim].set(jnp.nan) if g is leaf else g,
                              gradients[1])  # the second update is skipped
  return config, state, gradients


def _three_updates(config, state, gradients, form):
  from aiayn_flax import train_step
  apply = jax.jit(functools.partial(train_step.apply_gradient_sums,
                                    schedule=optimizer.learning_rate_schedule(config),
                                    forms=train_step.StepForms(optimizer=form)))
  norms = []
  for g in gradients:
    state, metrics = apply(state, g, {"tokens": jnp.float32(7.0)})
    norms.append(metrics["grad_norm"])
  return state, norms


def test_adam_on_one_vector_equals_adam_per_array_with_a_skipped_update():
  config, state, gradients = _state_and_gradients()
  per_array, norms = _three_updates(config, state, gradients, "per_array")
  config.optimizer_implementation = "one_vector"  # the state's optimizer checks on one vector
  state = state.replace(tx=optimizer.make_optimizer(config))
  one_vector, vector_norms = _three_updates(config, state, gradients, "one_vector")
  assert int(per_array.opt_state.total_notfinite) == int(one_vector.opt_state.total_notfinite) == 1
  assert int(one_vector.opt_state.inner_state[0].count) == 2  # Adam counted the applied two
  assert jax.tree.structure(one_vector.opt_state) == jax.tree.structure(
      per_array.opt_state)  # the same checkpoints
  # The same elementwise arithmetic, which XLA compiles into other fusions (a division may
  # become a multiplication by a reciprocal): equal within a few float32 ulps.
  for a, b in zip(jax.tree.leaves((one_vector.params, one_vector.opt_state)),
                  jax.tree.leaves((per_array.params, per_array.opt_state))):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-12)
  np.testing.assert_allclose(vector_norms[0], norms[0], rtol=1e-6)  # a sum in another order
  assert not np.isfinite(vector_norms[1]) and not np.isfinite(norms[1])


def test_a_sharded_state_keeps_adam_per_array():
  from configs import toy
  config = toy.get_config()
  assert optimizer.state_is_whole_on_each_device(config)
  config.mesh = "data:2,model:2"
  assert not optimizer.state_is_whole_on_each_device(config)
  config.mesh, config.fsdp = "data:-1", True
  assert not optimizer.state_is_whole_on_each_device(config)


def instructions(compiled) -> list[str]:
  """A compiled program's instructions, without metadata or the numbers in their names."""
  return [re.sub(r"\.\d+\b", "", line.split(", metadata=")[0])
          for line in compiled.as_text().splitlines() if " = " in line]


def test_the_cpu_step_is_the_cpu_forms():
  """Nothing changed on the CPU: its compiled training step is the one with the forms forced
  to the CPU's (the loss by reductions, Adam per array, flax's layer norm), instruction for
  instruction (names' numbers aside); each config field of a form takes effect."""
  from aiayn_flax import train_step
  config, state, _ = _state_and_gradients()
  batch = {k: np.full((4, 8), 5, np.int32) for k in ("inputs", "targets")}

  def lowered(loss_form, optimizer_form, layer_norm_form):
    config.model.layer_norm_implementation = layer_norm_form
    config.optimizer_implementation = optimizer_form
    step = jax.jit(functools.partial(
        train_step.train_step, model=train_step.make_model(config), label_smoothing=0.1,
        schedule=optimizer.learning_rate_schedule(config),
        forms=train_step.StepForms(loss=loss_form, optimizer=optimizer_form)))
    stepped = state.replace(tx=optimizer.make_optimizer(config))
    return step.lower(stepped, batch, train_step.dropout_key(0))

  chosen = instructions(lowered("auto", "auto", "auto").compile())
  plain = lowered("reductions", "per_array", "flax")
  assert chosen == instructions(plain.compile())
  for forms in (("fused", "per_array", "flax"), ("reductions", "one_vector", "flax"),
                ("reductions", "per_array", "one_pass")):  # each field takes effect
    assert lowered(*forms).as_text() != plain.as_text(), forms


def test_programs_for_cpu_devices_trace_the_cpu_forms_alone_and_compile_the_same_step():
  """The trainer's programs on a mesh of CPU devices call the CPU's forms directly
  (devices.platform_dependent): no platform_index in their trace, so no GPU form to trace and
  differentiate through a conditional. Their compiled step is the one that tracing every form
  and letting the lowering choose compiles for the CPU, instruction for instruction."""
  from aiayn_flax import programs, sharding, train_step
  config, state, _ = _state_and_gradients()
  model = train_step.make_model(config)
  mesh = sharding.data_parallel_mesh(jax.devices()[:1])
  state_sharding = sharding.train_state_shardings(
      mesh, jax.eval_shape(lambda: state), train_step.logical_param_specs(model), config.fsdp)
  state = jax.device_put(state, state_sharding)
  batch = {k: np.full((4, 8), 5, np.int32) for k in ("inputs", "targets")}
  key = train_step.dropout_key(0)
  on_the_mesh = programs.training_programs(config, model, mesh, state_sharding).step_fn
  replicated = sharding.replicated(mesh)
  every_form = jax.jit(  # as training_programs builds it, without the platform known
      functools.partial(train_step.train_step, model=model,
                        label_smoothing=config.label_smoothing,
                        schedule=optimizer.learning_rate_schedule(config),
                        forms=programs.step_forms(config, mesh)),
      in_shardings=(state_sharding, sharding.batch_sharding(mesh), replicated),
      out_shardings=(state_sharding, replicated), donate_argnums=0)
  assert "platform_index" not in str(jax.make_jaxpr(on_the_mesh)(state, batch, key))
  assert "platform_index" in str(jax.make_jaxpr(every_form)(state, batch, key))

  assert (instructions(on_the_mesh.lower(state, batch, key).compile())
          == instructions(every_form.lower(state, batch, key).compile()))


def test_the_translators_decoding_on_cpu_devices_traces_the_cpu_forms_alone_and_compiles_the_same():
  """As training's programs: the Translator's decoding, on its mesh of CPU devices, calls the
  layer norm's CPU form directly; decoding built without a platform (as the compiled plan
  builds it for a TPU or GPU) traces every form. Compiled for the CPU, the two are the same
  program, instruction for instruction."""
  from aiayn_flax import translator
  from test_model import init, random_tokens, small_model
  model, rng = small_model(num_layers=1), np.random.default_rng(0)
  inputs = random_tokens(rng, 4, 16)
  params = init(model, jax.random.key(0), inputs, inputs[:, :5])["params"]
  on_cpu = translator.Translator(model, params, None, extra_length=8)._decode.jitted.trace(
      params, inputs)
  every_form = translator.make_decode_fn(model, 1, 0.6, 8).trace(params, inputs)
  assert "platform_index" not in str(on_cpu.jaxpr)
  assert "platform_index" in str(every_form.jaxpr)
  assert instructions(on_cpu.lower().compile()) == instructions(every_form.lower().compile())


@pytest.mark.slow
def test_the_loss_is_compiled_in_one_pass_for_a_gpu_alone():
  """platform_dependent picks the loss's form where it is compiled (deviceless, the `aot`
  extra): the one-pass form for a GPU, the reductions for a TPU (where XLA's cost analysis
  counted more bytes for it) and the CPU."""
  pytest.importorskip("jax_cuda12_plugin")
  pytest.importorskip("libtpu")
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from aiayn_flax.planning import accelerator_targets

  def compiled(target, form):
    devices = accelerator_targets.topology_devices(accelerator_targets.target(target))[:1]
    whole = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec())
    logits = jax.ShapeDtypeStruct((4, 8, 64), jnp.bfloat16, sharding=whole)
    targets = jax.ShapeDtypeStruct((4, 8), jnp.int32, sharding=whole)
    grad = jax.jit(jax.grad(lambda x, t: loss.label_smoothed_nll(x, t, 0.1, form)[0]))
    text = grad.lower(logits, targets).compile().as_text()
    return [re.sub(r"\.\d+\b", "", line.split(", metadata=")[0]) for line in text.splitlines()
            if " = " in line]

  assert compiled("gpu-h100x1", "auto") == compiled("gpu-h100x1", "fused")
  assert compiled("gpu-h100x1", "auto") != compiled("gpu-h100x1", "reductions")
  assert compiled("tpu-v5e-1", "auto") == compiled("tpu-v5e-1", "reductions")


@pytest.mark.slow
def test_the_gpu_step_launches_at_most_the_censused_kernels():
  """Compiled deviceless for one H100 (the `aot` extra), the quick start's step at 343 x 8
  (352 x 8 inside: rows aligned to 256 tokens): 565 kernels when bench/gpu_census.py was last
  run (1,051 before issue 55's levers, 649 before the rows were aligned), 5% allowed for another
  XLA; each of the 12 attentions is Pallas's forward kernel and its backward's two; no loop or
  conditional (a round trip through the host); the loss reads the logits twice (once forward,
  once for their gradient)."""
  pytest.importorskip("jax_cuda12_plugin")
  from configs import multi30k
  config = multi30k.get_config()
  config.steps_per_call = 1
  text, shape, _ = kernel_census.train_step_hlo(config, "gpu-h100x1", 8)
  assert shape == "343x8"
  counted = kernel_census.census(text)
  assert len(counted["kernels"]) <= gpu_bars.QUICKSTART_KERNELS * gpu_bars.KERNELS_ALLOWANCE
  assert sum(k.kind == "Pallas (Triton)" for k in counted["kernels"]) == 3 * 12
  assert counted["while"] == counted["conditional"] == 0
  passes = kernel_census.full_vocabulary_passes(counted["kernels"], 352 * 8 * 8000)
  assert [k.kind for k in passes] == ["reduction", "elementwise"], passes


def test_rows_are_aligned_to_256_tokens_where_that_adds_at_most_an_eighth():
  from aiayn_flax import train_step
  aligned = functools.partial(train_step.aligned_rows, multiple=256)
  assert aligned(343, [8, 8]) == 352
  assert aligned(976, [32, 32]) == 976  # base: aligned already
  assert aligned(21, [128, 128]) == 22
  assert aligned(90, [24, 32]) == 96  # 96 x 24 and 96 x 32: both multiples
  assert aligned(85, [24, 32]) == 85  # 96 would add 11
  assert aligned(100, [12, 12]) == 100  # 128 would add 28
  assert train_step.aligned_rows(343, [8, 8], multiple=0) == 343


def test_aligned_rows_give_the_loss_gradients_and_metrics_of_the_batch_as_it_came():
  """The empty rows appended on one GPU (train_step.with_aligned_rows) change no sum: 30 x 8
  sources and 30 x 16 targets become 32 rows (256 and 512 tokens). Without dropout, whose
  random bits follow the shape."""
  from aiayn_flax import train_step
  from configs import toy
  config = toy.get_config()
  config.model.update(vocab_size=64, d_model=32, d_ff=64, num_heads=4, num_layers=2,
                      dropout_rate=0.0)
  rng = np.random.default_rng(6)
  batch = {k: rng.integers(4, 64, (30, n)).astype(np.int32) for k, n in (("inputs", 8),
                                                                           ("targets", 16))}
  batch["inputs"][0, 5:] = batch["targets"][3, 7:] = 0  # padded at the end, as bucketed
  assert train_step.with_aligned_rows(batch, 256)["targets"].shape == (32, 16)
  model = train_step.make_model(config)
  params = train_step.init_params(model, 0)
  # Compiled, as the trainer runs them: op by op (each op compiled alone), this test and the
  # four of test_training_through_fused_attention_... took 49 s, compiled 30 s.
  run = jax.jit(functools.partial(train_step.loss_and_grads, model=model, label_smoothing=0.1),
                static_argnames="forms")
  dropout_key, aligning = train_step.dropout_key(0), train_step.StepForms(aligned_tokens=256)
  (grads, metrics), (aligned_grads, aligned_metrics) = (
      run(params, batch, dropout_key), run(params, batch, dropout_key, forms=aligning))
  assert float(aligned_metrics["tokens"]) == float(metrics["tokens"]) == float(
      (batch["targets"] != 0).sum())
  for key in ("loss_sum", "nll_sum"):
    np.testing.assert_allclose(aligned_metrics[key], metrics[key], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(aligned_grads), jax.tree.leaves(grads)):
    # Sums over 30 rows and over 32 in other orders: a few float32 ulps of the largest terms
    # (at most 5e-7 seen, where the gradients reach 10).
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6)
  evaluate = jax.jit(functools.partial(train_step.eval_step, model=model, label_smoothing=0.1),
                     static_argnames="forms")
  np.testing.assert_allclose(evaluate(params, batch, forms=aligning)["loss_sum"],
                             evaluate(params, batch)["loss_sum"], rtol=1e-6)


def test_rows_are_aligned_on_one_gpu_alone_as_the_config_says():
  pytest.importorskip("jax_cuda12_plugin")
  from aiayn_flax import programs, sharding
  from aiayn_flax.planning import accelerator_targets
  from configs import base
  config = base.get_config()
  for name, expected in (("gpu-h100x1", 256), ("gpu-h100x8", 0), ("tpu-v5e-1", 0)):
    devices_ = accelerator_targets.topology_devices(accelerator_targets.target(name))
    mesh = sharding.make_mesh(config.mesh, devices_, config.dcn_mesh)
    assert programs.aligned_tokens(config, mesh) == expected, name
  assert not programs.aligned_tokens(config, sharding.make_mesh(config.mesh, jax.devices()[:1]))
  config.aligned_row_tokens = 0  # read when the programs are built, not when a module loads
  one_gpu = accelerator_targets.topology_devices(accelerator_targets.target("gpu-h100x1"))
  assert programs.aligned_tokens(config, sharding.make_mesh(config.mesh, one_gpu)) == 0


@pytest.mark.slow
def test_the_gpu_update_copies_no_moments_at_base_widths():
  """Base's widths with one layer (a proxy for base, which takes minutes to compile), compiled
  deviceless for one H100: the optimizer's update writes each moment in place. Adam on one
  raveled vector (the GPU form until 2026-11-28) left 67 copies of small moments here (131 in
  base) and 297 kernels; with one finite check and Adam per array, 1 copy and 221 kernels,
  193 with the attentions in Pallas's kernels, 183 with the layer norms' backward written out
  (5% allowed for another XLA)."""
  pytest.importorskip("jax_cuda12_plugin")
  from configs import base
  config = base.get_config()
  config.steps_per_call, config.model.num_layers = 1, 1
  text, shape, _ = kernel_census.train_step_hlo(config, "gpu-h100x1", 32)
  assert shape == "976x32"
  kernels = kernel_census.census(text)["kernels"]
  assert sum(k.kind == "copy" for k in kernels) <= 2
  assert len(kernels) <= 183 * 1.05


def test_the_census_reads_kernels_bytes_and_flops_from_hlo_text():
  text = """HloModule m

%fused_dot (p0: bf16[4,8], p1: bf16[8,2]) -> bf16[4,2] {
  %p0 = bf16[4,8]{1,0} parameter(0)
  %p1 = bf16[8,2]{1,0} parameter(1)
  ROOT %dot.1 = bf16[4,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/Transformer/ffn/dot_general"}
}

%fused_reduce (p0.1: f32[4,2]) -> f32[4] {
  %p0.1 = f32[4,2]{1,0} parameter(0)
  ROOT %r = f32[4]{0} reduce(%p0.1), dimensions={1}, metadata={op_name="jit(f)/loss/reduce_sum"}
}

%fused_slices (p0.2: f32[4]) -> (f32[1], f32[2]) {
  %p0.2 = f32[4]{0} parameter(0)
  %s1 = f32[1]{0} slice(%p0.2), slice={[0:1]}
  %s2 = f32[2]{0} slice(%p0.2), slice={[1:3]}
  ROOT %t2 = (f32[1]{0}, f32[2]{0}) tuple(%s1, %s2)
}

ENTRY %main (a: bf16[4,8], b: bf16[8,2]) -> (f32[4]) {
  %a = bf16[4,8]{1,0} parameter(0)
  %b = bf16[8,2]{1,0} parameter(1)
  %gemm = bf16[4,2]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot
  %bitcast.1 = f32[4,2]{1,0} bitcast(%gemm)
  %sum = f32[4]{0} fusion(%bitcast.1), kind=kInput, calls=%fused_reduce
  %slices = (f32[1]{0}, f32[2]{0}) fusion(%sum), kind=kLoop, calls=%fused_slices
  %while.1 = f32[4]{0} while(%sum), condition=%c, body=%fused_reduce
  ROOT %t = (f32[4]{0}) tuple(%sum)
}
"""
  counted = kernel_census.census(text)
  kernels = {k.name: k for k in counted["kernels"]}
  assert counted["while"] == 1 and counted["conditional"] == 0
  assert set(kernels) == {"gemm", "sum", "slices", "r"}  # a loop's body: its kernels, once
  assert (kernels["slices"].bytes_read, kernels["slices"].bytes_written) == (12, 12)  # 3 of 4
  assert kernels["gemm"].kind == "matmul" and kernels["gemm"].part == "feed-forward"
  assert kernels["gemm"].flops == 2 * 4 * 2 * 8
  assert (kernels["gemm"].bytes_read, kernels["gemm"].bytes_written) == (2 * 32 + 2 * 16, 2 * 8)
  assert kernels["sum"].kind == "reduction" and kernels["sum"].part == "loss"
  assert kernels["sum"].largest_operand == 8
  assert [k.name for k in kernel_census.full_vocabulary_passes(counted["kernels"], 8)] == [
      "sum", "r"]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_layer_norm_is_flax_s_bit_for_bit_on_the_cpu_and_its_gpu_backward_agrees(dtype):
  """On the CPU (as on a TPU) model.LayerNorm is flax.linen.LayerNorm to the bit, values and
  gradients, with the same parameters; the GPU form (`layer_norm_one_pass`, its backward written
  out) gives the same values and gradients within float32 rounding."""
  import flax.linen as nn
  from aiayn_flax import model
  x = (jax.random.normal(jax.random.key(0), (3, 5, 16)) * 3 + 1).astype(dtype)
  ours, flax_s = model._layer_norm({}, dtype), nn.LayerNorm(epsilon=1e-6, dtype=dtype)
  params = nn.meta.unbox(ours.init(jax.random.key(1), x))
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(
      jnp.shape, flax_s.init(jax.random.key(1), x))
  params = jax.tree.map(lambda p: p + jax.random.normal(jax.random.key(2), p.shape), params)

  def values_and_gradients(apply):
    loss = lambda params, x: jnp.sum(jnp.sin(apply(params, x).astype(jnp.float32)))  # noqa
    return jax.jit(lambda p, x: (apply(p, x), jax.grad(loss, argnums=(0, 1))(p, x)))(params, x)

  expected = values_and_gradients(flax_s.apply)
  for a, b in zip(jax.tree.leaves(values_and_gradients(ours.apply)), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(a, b)
  one_pass = lambda p, x: model.layer_norm_one_pass(  # noqa: E731
      x, p["params"]["scale"], p["params"]["bias"], epsilon=1e-6, dtype=dtype)
  tolerance = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}[dtype]
  for a, b in zip(jax.tree.leaves(values_and_gradients(one_pass)), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=tolerance, atol=tolerance)


def test_every_gpu_kind_of_a_target_is_a_device_kind_with_its_memory():
  """An H200 and an A100 80 GB are targets too (the one GPU ever lent was an H200): each GPU
  target's figures describe the device kind the plan uses, memory included."""
  from aiayn_flax.planning import accelerator_targets
  from aiayn_flax import devices
  for name in ("gpu-h200x1", "gpu-a100_80gbx8", "gpu-h100x1", "gpu-t4x1"):
    target = accelerator_targets.target(name)
    figures = accelerator_targets.GPUS[target.gpu]
    assert devices.kind(target.kind).memory_bytes == figures.memory_bytes, name
    assert f"device_memory_size: {figures.memory_bytes}" in figures.target_config()
