"""One attention, several backends (aiayn_flax/attention/backends.py): every backend gives the
written-out form's values and gradients on the calls it declares it serves (Pallas's kernels
interpreted on the CPU, in several blocks); the dispatcher picks per call what the config asks
or, for "auto", the best form that serves it, and refuses in one line a request that cannot be
served; a new bias needs one case per backend. The GPU compiles that decide a kernel's
shared memory are in test_gpu_programs.py."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aiayn_flax.attention import backends, forms
from bench import gpu_bars

H100 = backends.Target("gpu", "9.0", 1)
A100 = backends.Target("gpu", "8.0", 1)
L4 = backends.Target("gpu", "8.9", 1)
T4 = backends.Target("gpu", "7.5", 1)
CPU = backends.Target("cpu", "", 1)


class _Module:
  """What the written-out form asks of its Flax module, outside one (no dropout here)."""

  def sow(self, *args):
    pass


def operands(site: str, dtype, heads=2, d=8, queries=37, keys=29, seed=0):
  """q, k, v [B, L, H, K], the site's mask (key padding at the end of each row, a row of only
  padding among them as aligned rows are; or the decoder's causal-and-padding mask), and
  [B, Q, 1, 1] the queries whose output reaches a real token's loss: in rows with a real key,
  and real themselves in self-attention (a padding position's output meets only masked keys
  and the loss's zero weights, whatever a form computes there)."""
  rng = np.random.default_rng(seed)
  keys = queries if site != "cross" else keys
  q, k, v = (jnp.asarray(rng.normal(size=(3, n, heads, d)), dtype)
             for n in (queries, keys, keys))
  lengths = np.array([keys, keys // 2, 0 if site != "decoder" else 5])
  real = np.arange(keys)[None] < lengths[:, None]  # [B, L]
  if site == "decoder":
    mask = np.tril(np.ones((queries, queries), bool))[None, None] & real[:, None, None]
  else:
    mask = real[:, None, None]
  counted = (lengths[:, None] > 0) & (real if site != "cross" else True)  # [B, Q]
  return q, k, v, jnp.asarray(mask), np.broadcast_to(counted, (3, queries))[..., None, None]


def written_out(q, k, v, mask, bias=None):
  return forms.written_out(q, k, v, mask, bias, dropout_rate=0.0, deterministic=True,
                           module=_Module())


def values_and_gradients(form, q, k, v, mask, counted):
  """form(q, k, v, mask) and the gradient of a weighted sum of it wrt q, k and v, compiled,
  the queries that do not count (operands) weighing 0, as in training's loss."""
  weights = np.random.default_rng(9).normal(size=q.shape[:3] + v.shape[-1:]) * counted

  def loss(q, k, v):
    return jnp.sum(form(q, k, v, mask).astype(jnp.float32) * weights)
  return jax.jit(lambda q, k, v: (form(q, k, v, mask),
                                  jax.grad(loss, argnums=(0, 1, 2))(q, k, v)))(q, k, v)


def assert_close(got, expected, dtype):
  tolerance = gpu_bars.TOLERANCE[jnp.dtype(dtype).name]  # bf16: its own roundings of the terms
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.all(np.isfinite(a))  # the empty row too
    scale = max(float(np.max(np.abs(b))), 1.0)
    np.testing.assert_allclose(a, b, atol=tolerance * scale, rtol=tolerance)


BACKEND_FORMS = {
    "xla": lambda site: functools.partial(forms.through_jax, bias=None, implementation="xla"),
    # blocks of 16 over lengths padded to 64: four blocks forward, two backward
    "pallas": lambda site: functools.partial(forms.pallas, bias=None, cross=site == "cross",
                                             block=16, interpret=True),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("site", ["encoder", "decoder", "cross"])
@pytest.mark.parametrize("backend", sorted(BACKEND_FORMS))
def test_each_backend_gives_the_written_out_values_and_gradients(backend, site, dtype):
  """On right-padded rows with a row of padding only, lengths 37 and 29 (several of Pallas's
  blocks), in float32 and bfloat16. Padded rows' outputs are compared too: finite everywhere."""
  q, k, v, mask, counted = operands(site, dtype)
  expected = values_and_gradients(written_out, q, k, v, mask, counted)
  got = values_and_gradients(BACKEND_FORMS[backend](site), q, k, v, mask, counted)
  # Every output is finite (the empty row's too), the ones that count equal
  assert np.all(np.isfinite(np.asarray(got[0], np.float32)))
  assert_close(jnp.where(counted, got[0], 0), jnp.where(counted, expected[0], 0), dtype)
  assert_close(got[1], expected[1], dtype)


@pytest.mark.parametrize("site", ["encoder", "decoder", "cross"])
def test_a_bias_is_one_case_per_backend_and_equal_in_each(site):
  """An additive bias on the logits (as ALiBi's, a relative-position bias): the written-out
  form adds it before the mask; jax's fused forms take it as `bias`; the decoding steps add it
  in their layouts. Pallas's kernels take none: "auto" gives such a call the written-out form."""
  q, k, v, mask, counted = operands(site, jnp.float32)
  bias = jnp.asarray(np.random.default_rng(4).normal(size=(1, q.shape[2], q.shape[1],
                                                           k.shape[1])), jnp.float32)
  expected = values_and_gradients(functools.partial(written_out, bias=bias), q, k, v, mask,
                                  counted)
  fused = functools.partial(forms.through_jax, bias=bias, implementation="xla")
  got = values_and_gradients(fused, q, k, v, mask, counted)
  assert_close(jnp.where(counted, got[0], 0), jnp.where(counted, expected[0], 0), jnp.float32)
  assert_close(got[1], expected[1], jnp.float32)
  call = backends.Call(site, "bfloat16", 64, 64, 128, 128, bias=True)
  assert backends.choose(call, "auto", H100) == "written_out"
  assert "no bias" in backends.BACKENDS["pallas"].refuses(call, H100)


@pytest.mark.parametrize("beams", [1, 3])
def test_the_decoding_forms_take_a_bias_as_the_written_out_form(beams):
  """A decoding step on the cache's layouts (model.py) equals the written-out form on the same
  keys, values, mask and bias, the beams' queries as one sentence's."""
  rng = np.random.default_rng(beams)
  batch, heads, slots, d = 2, 3, 11, 8
  q = jnp.asarray(rng.normal(size=(batch, beams, heads, d)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(batch, slots, heads, d)), jnp.float32) for _ in "kv")
  mask = jnp.asarray(rng.random((batch, 1, beams, slots)) < 0.6).at[..., 0].set(True)
  bias = jnp.asarray(rng.normal(size=(batch, heads, beams, slots)), jnp.float32)
  expected = written_out(q, k, v, mask, bias)  # [B, beams, H, V]
  heads_major = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731
  step = forms.decoding_step(q, heads_major(k), jnp.transpose(v, (0, 2, 3, 1)), mask, bias)
  beam = forms.beam(q, jnp.transpose(k, (0, 2, 3, 1)), heads_major(v), mask, bias)
  np.testing.assert_allclose(step, expected, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(beam, expected, rtol=2e-5, atol=2e-6)


def call(site="encoder", dtype="bfloat16", d=64, length=256, **changes):
  return backends.Call(site, dtype, d, changes.pop("d_v", d), length, length, **changes)


def test_auto_picks_pallas_on_one_gpu_where_it_serves_the_call_else_written_out():
  for site in backends.TRAINING_SITES:
    assert backends.choose(call(site), "auto", H100) == "pallas", site
    assert backends.choose(call(site), "auto", A100) == "pallas", site
  for target, why in ((backends.Target("gpu", "9.0", 8), "over 8 devices"),
                      (T4, "compute capability 8.0 or more"),
                      (backends.Target("gpu", "gfx90a", 1), "compute capability 8.0"),
                      (CPU, None), (backends.Target(), None)):
    assert backends.choose(call(), "auto", target) == "written_out", target
    if why:
      assert why in backends.BACKENDS["pallas"].refuses(call(), target)
  for changed, why in ((call(dropout=True), "no attention dropout"),
                       (call(d_v=32), "d_k == d_v"), (call(training=False), "inference")):
    assert backends.choose(changed, "auto", H100) == "written_out"
    assert why in backends.BACKENDS["pallas"].refuses(changed, H100)
  # Inference and the decoding steps have their forms, whatever training asks
  assert backends.choose(call(training=False), "pallas", H100) == "written_out"
  for site in backends.DECODING_SITES:
    assert backends.choose(call(site, training=False), "pallas", H100) == site


def test_pallas_takes_the_largest_block_whose_shared_memory_the_gpu_has():
  """float32 at length 256 (base's longest bucket): the self-attention's 64-wide head fits
  128-row blocks on an H100 (133,120 of 232,448 bytes), the cross-attention's 65 columns
  (padded to 128) do not (264,192; Triton asked 262,144 there: the failure of issue 81) and
  take 64; an L4's 101,376 bytes take 64 and 32. bfloat16 and short rows need less."""
  block = lambda c, target: backends.pallas_block(c, target)[0]  # noqa: E731
  f32 = functools.partial(call, dtype="float32")
  assert block(f32("encoder"), H100) == 128 and block(f32("cross"), H100) == 64
  assert block(f32("encoder"), L4) == 64 and block(f32("cross"), L4) == 32
  assert block(call("cross"), H100) == 128 and block(call("cross"), L4) == 64
  assert block(f32("cross", length=64), L4) == 128  # one block of 64 rows
  assert backends.pallas_shared_memory(128, 65, "float32", 256) == 262_144 + 2048
  assert backends.pallas_shared_memory(128, 64, "bfloat16", 256) == 81_920 + 2048
  assert backends.pallas_block(f32("cross", d=512), A100)[0] == 0
  assert "bytes of shared memory" in backends.pallas_block(f32("cross", d=512), A100)[1]


def test_a_request_that_cannot_be_served_is_refused_in_one_line_naming_the_field():
  for requested, c, target, why in (
      ("cudnn", call(dtype="float32"), H100, "bfloat16 or float16, not float32"),
      ("cudnn", call(), CPU, "needs a CUDA GPU"),
      ("pallas", call(), T4, "compute capability 8.0 or more"),
      ("pallas", call("cross", dtype="float32", d=512), A100, "bytes of shared memory"),
      ("xla", call(dropout=True), H100, "no attention dropout"),
      ("xla", call(d_v=32), H100, "d_k == d_v")):
    with pytest.raises(ValueError) as refused:
      backends.choose(c, requested, target)
    line = str(refused.value)
    assert "\n" not in line and why in line, line
    assert line.startswith(f"model.attention_implementation={requested} cannot serve"), line
  assert backends.choose(call(), "cudnn", H100) == "cudnn"
  assert backends.choose(call(), "pallas", CPU) == "pallas"  # interpreted: tests
  with pytest.raises(ValueError, match="unknown; known: auto, written_out, xla, cudnn, pallas"):
    backends.choose(call(), "flash", H100)


def small_config(implementation: str, **model):
  from configs import toy
  config = toy.get_config()
  config.model.update({**dict(vocab_size=64, d_model=32, d_ff=64, num_heads=4, num_layers=2,
                              dropout_rate=0.0, attention_implementation=implementation),
                       **model})
  return config


def training_loss_and_gradients(config, batch):
  from aiayn_flax import train_step
  model = train_step.make_model(config)
  params = train_step.init_params(model, 0)
  compiled = jax.jit(functools.partial(train_step.loss_and_grads, model=model,
                                       label_smoothing=0.1))
  return compiled(params, batch, train_step.dropout_key(0))


@pytest.mark.parametrize("implementation, model_options", [
    ("pallas", {"pre_layer_norm": True, "num_heads": 2})])
def test_training_through_each_backend_equals_the_written_out_attention(implementation,
                                                                       model_options):
  """The model as training runs it, each attention through the backend asked for (Pallas
  interpreted: XLA's fused form is compared above at each site, in each dtype), the same loss
  and gradients as equation 1 written out, on right-padded batches of lengths 7 and 9."""
  rng = np.random.default_rng(5)
  batch = {k: rng.integers(4, 64, (3, n)).astype(np.int32) for k, n in (("inputs", 7),
                                                                          ("targets", 9))}
  batch["inputs"][0, 5:] = batch["inputs"][2, 2:] = 0  # padded at the end, as bucketed
  batch["targets"][1, 4:] = batch["targets"][2, 7:] = 0
  grads, metrics = training_loss_and_gradients(small_config("written_out", **model_options),
                                               batch)
  fused_grads, fused_metrics = training_loss_and_gradients(
      small_config(implementation, **model_options), batch)
  np.testing.assert_allclose(fused_metrics["loss_sum"], metrics["loss_sum"], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(fused_grads), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_model_the_backends_cannot_serve_is_refused_at_the_config_and_at_the_call():
  from aiayn_flax import config_checks, train_step
  config = small_config("xla", attention_dropout_rate=0.1)
  with pytest.raises(ValueError, match="model.attention_dropout_rate=0.1: must be 0 with "
                                       "model.attention_implementation=xla"):
    config_checks.check_config(config)
  model = train_step.make_model(config)  # built past the check: the call refuses it
  batch = np.full((2, 4), 5, np.int32)
  with pytest.raises(ValueError, match="model.attention_implementation=xla cannot serve the "
                                       "encoder attention .*no attention dropout"):
    model.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, batch, batch,
               train=True)


def test_bfloat16_is_refused_in_one_line_on_a_gpu_without_bfloat16_units():
  from aiayn_flax import devices
  for kind in ("t4", "v100", "p100"):
    refusal = devices.dtype_refusal("bfloat16", devices.KINDS[kind])
    assert refusal.startswith("config.model.dtype=bfloat16: the ") and "\n" not in refusal
    assert "no bfloat16 units; set auto (float32 there) or float32" in refusal
    assert not devices.dtype_refusal("auto", devices.KINDS[kind])
  for kind in ("a100", "l4", "h100"):
    assert not devices.dtype_refusal("bfloat16", devices.KINDS[kind])
  assert not devices.dtype_refusal("bfloat16", devices.local_kind(jax.devices("cpu")[0]))
