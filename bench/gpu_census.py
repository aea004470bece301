"""What the training step launches on a GPU, counted deviceless, with a roofline estimate.

  python bench/gpu_census.py                          # quick start and base, before and after
  python bench/gpu_census.py --sizes=quickstart --forms=after --detail
  python bench/gpu_census.py --target=tpu-v5e-1 --sizes=quickstart   # XLA's cost analysis

For each size it compiles one training step (one batch per call) for `--target` (default
gpu-h100x1) on the CPU (no GPU needed: the `aot` extra), reads the optimized program
(aiayn_flax/planning/kernel_census.py) and prints, per form of the step:
- kernels per step (fusions, library calls, copies), and the host round trips (while loops,
  conditionals) the program holds;
- the loss's passes over the full logits;
- GB each kernel reads and writes, summed (an upper bound), and the matmuls' TFLOP;
- a roofline estimate for an H100 and an H200 (kernel_census.roofline_ms), and, beside it, the
  one measured row: base on an H200, 1,657 launches, 46.2 ms of kernels, 58.5 ms per step each
  step waited for (docs/RESULTS.md). These are predictions until a lent GPU times them.
"Before" is the step with the forms it had until 2026-11-28 (the loss by separate reductions,
optax's finite check per parameter array, a threefry fold per dropout layer); "after" today's
(one-pass loss, one finite check over all gradients before Adam per array, dropout seeds from
one key), both compiled in this run. On a TPU target it
prints XLA's own cost analysis (FLOPs, bytes accessed) instead.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

flags.DEFINE_list("sizes", ["quickstart", "base"], "quickstart (configs/multi30k.py at 343 x 8), "
                  "quickstart_128 (its 21 x 128 bucket), base.")
flags.DEFINE_list("forms", ["before", "after"], "before: separate loss reductions and Adam per "
                  "array; after: today's forms on an accelerator.")
flags.DEFINE_string("target", "gpu-h100x1", "A --target of train.py --dry_run.")
flags.DEFINE_bool("detail", False, "Also print kernels by kind and by part of the step.")
FLAGS = flags.FLAGS

# The shapes the counts are quoted at: the quick start's most frequent long-sentence bucket of
# issue 55 (343 x 8) and base at the plan's batch on one H100 (976 x 32).
SIZES = {"quickstart": ("configs.multi30k", 8), "quickstart_128": ("configs.multi30k", 128),
         "base": ("configs.base", 32)}


def with_forms(config, form: str):
  """`config` with the forms of `form`: "before" the plain forms of before 2026-11-28 (and a
  threefry fold per dropout layer: a module switch, set here), "after" today's defaults."""
  from aiayn_flax import programs
  from aiayn_flax.attention import dropout
  dropout.DROPOUT_SEEDS = {"before": "make_rng", "after": "one_key"}[form]
  return programs.with_plain_forms(config, programs.PLAIN_FORMS) if form == "before" else config


def census_row(size: str, form: str) -> dict:
  import importlib

  from aiayn_flax.planning import kernel_census
  module, length = SIZES[size]
  config = importlib.import_module(module).get_config()
  config.steps_per_call = 1
  config = with_forms(config, form)
  start = time.perf_counter()
  text, shape, compiled = kernel_census.train_step_hlo(config, FLAGS.target, length)
  seconds = time.perf_counter() - start
  counted = kernel_census.census(text)
  kernels = counted["kernels"]
  rows, length = (int(n) for n in shape.split("x"))
  logits = rows * length * config.model.vocab_size
  row = {"size": size, "form": form, "shape": shape, "compile_s": seconds,
         "kernels": len(kernels), "while": counted["while"],
         "conditional": counted["conditional"],
         "logit_passes": len(kernel_census.full_vocabulary_passes(kernels, logits)),
         "gb": sum(k.bytes_read + k.bytes_written for k in kernels) / 1e9,
         "tflop": sum(k.flops for k in kernels) / 1e12, "census": kernels,
         "cost": compiled.cost_analysis() if FLAGS.target.startswith("tpu") else None}
  for gpu in (kernel_census.H100, kernel_census.H200):
    row[gpu.name] = kernel_census.roofline_ms(kernels, gpu)
  return row


def print_tpu_rows(rows: list[dict]) -> None:
  """A TPU runs its fusions back to back, without a host launch each: what counts there is
  XLA's own cost analysis (FLOPs, bytes accessed)."""
  print(f"\nTarget {FLAGS.target}, one step per call, XLA's cost analysis.\n")
  print("| size, batch | form | entry instructions | TFLOP | GB accessed |\n"
        "|---|---|---:|---:|---:|")
  for r in rows:
    cost = r["cost"] or {}
    print(f"| {r['size']} {r['shape']} | {r['form']} | {r['kernels']:,} | "
          f"{cost.get('flops', 0) / 1e12:.3f} | {cost.get('bytes accessed', 0) / 1e9:.2f} |")


def print_rows(rows: list[dict]) -> None:
  from aiayn_flax.planning import kernel_census
  if FLAGS.target.startswith("tpu"):
    print_tpu_rows(rows)
    return
  print(f"\nTarget {FLAGS.target}, one step per call; predictions, not measurements.\n")
  print("| size, batch | form | kernels | while / conditional | loss passes over the logits | "
        "GB moved (upper bound) | matmul TFLOP | H100 ms: kernels / waited / pipelined | "
        "H200 ms: kernels / waited / pipelined |")
  print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
  for r in rows:
    h100, h200 = r["H100 SXM"], r["H200 SXM"]
    print(f"| {r['size']} {r['shape']} | {r['form']} | {r['kernels']:,} | {r['while']} / "
          f"{r['conditional']} | {r['logit_passes']} | {r['gb']:.1f} | {r['tflop']:.2f} | "
          f"{h100['kernels']:.1f} / {h100['waited']:.1f} / {h100['pipelined']:.1f} | "
          f"{h200['kernels']:.1f} / {h200['waited']:.1f} / {h200['pipelined']:.1f} |")
  for size in {r["size"] for r in rows}:
    by_form = {r["form"]: r for r in rows if r["size"] == size}
    if {"before", "after"} <= set(by_form):
      before, after = by_form["before"]["kernels"], by_form["after"]["kernels"]
      print(f"\n{size}: {before:,} -> {after:,} kernels ({1 - after / before:.0%} fewer)")
    if size == "base" and "before" in by_form:
      measured = kernel_census.MEASURED_H200_BASE
      predicted = by_form["before"]["H200 SXM"]
      print(f"{size}, before, on the H200: measured {measured['launches']:,} launches, "
            f"{measured['kernels_ms']} ms of kernels, {measured['step_ms']} ms a step waited for; "
            f"counted {by_form['before']['kernels']:,} kernels, roofline {predicted['kernels']:.1f}"
            f" ms of kernels (measured / roofline = "
            f"{measured['kernels_ms'] / predicted['kernels']:.2f}), {predicted['waited']:.1f} ms "
            "waited")
  for r in rows:
    if FLAGS.detail:
      for attribute in ("kind", "part"):
        print(f"\n{r['size']} {r['form']} by {attribute}:\n| {attribute} | kernels | GB | GFLOP |"
              "\n|---|---:|---:|---:|")
        for value, count, gb, gflop in kernel_census.table_by(r["census"], attribute):
          print(f"| {value} | {count} | {gb:.2f} | {gflop:.0f} |")


def main(argv):
  del argv
  rows = [census_row(size, form) for size in FLAGS.sizes for form in FLAGS.forms]
  print_rows(rows)


if __name__ == "__main__":
  app.run(main)
