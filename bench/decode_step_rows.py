"""What a beam search cannot avoid: the model's decoding step on `beam` rows per sentence.

  python bench/decode_step_rows.py --workdir=runs/multi30k [--batch=64] [--beam=4]
      [--steps=24] [--repeats=5]

Beam search of width k runs the decoder on k rows per sentence at every step, greedy search on
one. This times that part alone, on a trained run: the decoding step of `model.py` (the decoder
layers with their cache reads and writes, the output layer, and the chunked argmax that
consumes the logits) at `batch` rows and at `batch` x `beam` rows. It uses one batch of
test2016 sources of the median length, the translator's padding, a cache of 32 positions
(the translator's second stage), and `steps` steps in one compiled loop, from the same
encoder output. There is no search around the step: no top-k, no log-softmax, no reordering.
The two row counts are timed alternately, and the median ratio of `repeats` pairs is printed.

Any search that scores the same hypotheses computes at least this per step: every row's
logits over the whole vocabulary (an exact log-softmax needs all of them). So on this machine
the ratio bounds beam k / greedy per decoding step from below, whatever the search does
around it. For reference, the script also times the output layer's matmul alone ([rows, d_model]
x [d_model, vocab], XLA's dot) at both row counts, and a self-attention step alone in both of
attention.py's forms (`_decoding_attention`'s batched dots, `_beam_attention`'s broadcast
products) with one query and with `beam` queries per sentence, each on its own cache layout.
It prints each step's analytic FLOPs and the rate they run at.

Host malloc on huge pages is the environment's setting (start the script with
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 on a CPU, as `make quickstart` does;
docs/INSTALL.md#on-a-cpu-malloc-on-huge-pages); the script never restarts itself for it and
says whether it is on in one log line and its first printed line (aiayn_flax/runtime/huge_pages.py).
"""
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

flags.DEFINE_string("workdir", "runs/multi30k", "A trained run.")
flags.DEFINE_integer("batch", 64, "Sentences per batch (greedy's rows).")
flags.DEFINE_integer("beam", 4, "Rows per sentence of the beam search.")
flags.DEFINE_integer("steps", 24, "Decoding steps per timed call (positions 1 to steps).")
flags.DEFINE_integer("repeats", 5, "Timed pairs of calls.")
FLAGS = flags.FLAGS
CACHE_LENGTH = 32


def step_flops(model, rows: int, beams: int, source_length: int) -> int:
  """Multiply-adds x 2 of one decoding step on `rows` rows: per row, each decoder layer's
  projections (self-attention q, k, v, out; cross-attention q, out: the encoder side's keys and
  values are cached), its FFN, its products with the cache (CACHE_LENGTH x beams slots: the
  sentence's beams share them) and with the source, then the output layer."""
  from aiayn_flax.model import head_dims
  d, f, h, vocab = model.d_model, model.d_ff, model.num_heads, model.vocab_size
  k, v = head_dims(model)
  projections = d * h * (2 * k + v) + h * v * d + d * h * k + h * v * d
  products = (CACHE_LENGTH * beams + source_length) * h * (k + v)
  return 2 * rows * (model.num_layers * (projections + 2 * d * f + products) + d * vocab)


def median_batch(config, vocab, batch: int):
  """`batch` test2016 sources around the median length, padded as the translator pads them."""
  import numpy as np

  from aiayn_flax import run_dir, tasks
  from aiayn_flax.data import vocabulary
  from aiayn_flax.translator import padded_source_length
  sources, _ = run_dir.testset_pairs("multi30k/test2016", config, tasks.for_config(config))
  ids = sorted((s + [vocabulary.EOS_ID] for s in vocab.encode_batch(sources)), key=len)
  start = max(0, len(ids) // 2 - batch // 2)
  chosen = ids[start:start + batch]
  inputs = np.zeros((len(chosen), padded_source_length(len(chosen[-1]))), np.int32)
  for row, source in enumerate(chosen):
    inputs[row, :len(source)] = source
  return inputs


def make_stepper(model, steps: int):
  """jit-compiled start(params, inputs, beams) -> the translator's decoding cache for
  inputs.shape[0] x beams rows, and run(params, inputs, step_cache, fixed_cache) -> the first
  tokens of `steps` greedy-like steps of the translator's decoding step on those rows (every
  beam of a sentence fed the same token)."""
  import jax
  import jax.numpy as jnp

  from aiayn_flax import decoding, model as model_lib, translator

  start = jax.jit(lambda params, inputs, beams: translator.start_decoding(
      model, params, inputs, beams, CACHE_LENGTH), static_argnums=2)

  @jax.jit
  def run(params, inputs, step_cache, fixed_cache):
    tokens_to_logits = translator.decoding_step(model, params, inputs, fixed_cache)
    rows = step_cache["decoder"]["slots"].shape[0]

    def body(_, carry):
      ids, step_cache = carry
      logits, step_cache = tokens_to_logits(ids, step_cache)
      return decoding.argmax_by_chunks(logits)[:, None], step_cache
    ids = jnp.full((rows, 1), model_lib.BOS_ID, jnp.int32)
    return jax.lax.fori_loop(0, steps, body, (ids, step_cache))[0]

  return start, run


def attention_forms(batch: int, heads: int, d_k: int, beams: int) -> dict:
  """The two forms of a decoding step's self-attention, as {name: call} on random inputs
  shaped as the step's: `beams` queries per sentence, CACHE_LENGTH x beams slots, a mask that
  hides 3 slots in 10."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from aiayn_flax.attention import forms
  rng = np.random.default_rng(0)
  slots = CACHE_LENGTH * beams
  q = jnp.asarray(rng.normal(size=(batch, beams, heads, d_k)), jnp.float32)
  keys = jnp.asarray(rng.normal(size=(batch, heads, slots, d_k)), jnp.float32)
  values = jnp.asarray(rng.normal(size=(batch, heads, slots, d_k)), jnp.float32)
  mask = jnp.asarray(rng.random((batch, 1, beams, slots)) < 0.7)
  # Each form reads the cache layout attention.py keeps for it.
  dots_inputs = (q, keys, jnp.swapaxes(values, 2, 3), mask)
  products_inputs = (q, jnp.swapaxes(keys, 2, 3), values, mask)
  dots = jax.jit(lambda *a: forms.decoding_step(*a, None))
  products = jax.jit(lambda *a: forms.beam(*a, None))
  return {"batched dots": lambda: [dots(*dots_inputs) for _ in range(FLAGS.steps)][-1],
          "broadcast products": lambda: [products(*products_inputs)
                                         for _ in range(FLAGS.steps)][-1]}


def alternate(calls: dict, repeats: int) -> dict:
  """Median seconds of each call, timed in turn `repeats` times, and the pairs' ratios."""
  import jax
  seconds = {name: [] for name in calls}
  for call in calls.values():
    jax.block_until_ready(call())  # compiles
  for _ in range(repeats):
    for name, call in calls.items():
      begin = time.perf_counter()
      jax.block_until_ready(call())
      seconds[name].append(time.perf_counter() - begin)
  return seconds


def ratio_line(what: str, seconds: dict) -> str:
  """The time of the second call over the first's: the median of the pairs' ratios."""
  (first, first_times), (second, second_times) = seconds.items()
  ratios = sorted(b / a for a, b in zip(first_times, second_times))
  return (f"{what}: time {second} / {first} = {statistics.median(ratios):.2f} (median of "
          f"{' '.join(f'{r:.2f}' for r in ratios)})")


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp

  from aiayn_flax.runtime import huge_pages, provenance
  from aiayn_flax import run_dir
  from aiayn_flax.model import head_dims
  config = run_dir.load_config(FLAGS.workdir)
  model, params, steps = run_dir.load_model_and_params(FLAGS.workdir, config, 1)
  vocab = run_dir.load_vocabulary(FLAGS.workdir, config)
  inputs = jnp.asarray(median_batch(config, vocab, FLAGS.batch))
  print(f"workdir: {FLAGS.workdir} (step {steps[-1]}); {provenance.cpu_model()}; "
        f"{huge_pages.describe()}")
  print(f"batch {inputs.shape[0]} x {inputs.shape[1]} source positions, cache {CACHE_LENGTH}, "
        f"{FLAGS.steps} steps per call")
  start, run = make_stepper(model, FLAGS.steps)
  row_counts = {1: f"{inputs.shape[0]} rows", FLAGS.beam: f"{inputs.shape[0] * FLAGS.beam} rows"}
  caches = {beams: start(params, inputs, beams) for beams in row_counts}
  seconds = alternate({name: functools.partial(run, params, inputs, *caches[beams])
                       for beams, name in row_counts.items()}, FLAGS.repeats)
  for beams, name in row_counts.items():
    per_step = statistics.median(seconds[name]) / FLAGS.steps
    flops = step_flops(config.model, inputs.shape[0] * beams, beams, inputs.shape[1])
    print(f"decoding step, {name}: {per_step * 1e3:.2f} ms, {flops / 1e6:.0f} MFLOP, "
          f"{flops / per_step / 1e9:.0f} GFLOP/s")
  print(ratio_line("decoding step", seconds))

  embedding = params["shared_embedding"]["embedding"]  # [vocab, d_model]
  output_layer = jax.jit(lambda x: x @ embedding.T)
  inputs_of = {name: jnp.ones((inputs.shape[0] * beams, embedding.shape[1]), embedding.dtype)
               for beams, name in row_counts.items()}
  matmul_seconds = alternate(
      {name: lambda x=x: [output_layer(x) for _ in range(FLAGS.steps)][-1]
       for name, x in inputs_of.items()}, FLAGS.repeats)
  for name, x in inputs_of.items():
    per_call = statistics.median(matmul_seconds[name]) / FLAGS.steps
    flops = 2 * x.shape[0] * embedding.shape[0] * embedding.shape[1]
    print(f"output layer matmul alone, {name}: {per_call * 1e3:.2f} ms, "
          f"{flops / per_call / 1e9:.0f} GFLOP/s")
  print(ratio_line("output layer matmul alone", matmul_seconds))

  d_k = head_dims(config.model)[0]
  for beams in (1, FLAGS.beam):
    forms = attention_forms(inputs.shape[0], config.model.num_heads, d_k, beams)
    attention_seconds = alternate(forms, FLAGS.repeats)
    print(f"self-attention alone, {beams} quer{'y' if beams == 1 else 'ies'} per sentence: "
          + ", ".join(f"{name} {statistics.median(t) / FLAGS.steps * 1e3:.3f} ms"
                      for name, t in attention_seconds.items()))
    print(ratio_line(f"self-attention alone, {beams} per sentence", attention_seconds))


if __name__ == "__main__":
  from aiayn_flax.runtime import huge_pages
  huge_pages.log_once_flags_are_parsed()  # malloc on huge pages? the environment's setting
  app.run(main)
