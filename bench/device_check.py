"""On a lent accelerator: base's training step and the quick start's first steps, measured
against what the dry run planned for this device.

  python bench/device_check.py --out=$OUT/device_check.md            # both sizes, ~5 minutes
  python bench/device_check.py --sizes=quickstart --steps=3 --out=x.md   # CPU: tried here first
  python bench/device_check.py --from_file=x.md --write_results       # into docs/RESULTS.md
  python bench/device_check.py --trace_dir=/tmp/trace                 # and a profile of 3 steps

For each size (configs/base.py, configs/multi30k.py) it builds the dry run's plan for the local
device (`train.py --dry_run`: compute dtype, the batch the plan counts FLOPs on, step time at
the plan's MFU), compiles the training step on that batch and reads the compiled program's
memory (arguments + outputs + temporaries - aliased, as the dry run's compiled plan counts
it), then times each of the first `--steps` steps one by one: the first includes nothing but
the step (compiled before), the rest show the steady state. It prints a markdown table row
per size: device, batch, measured ms per step (median after the first), the plan's, the
measured MFU, peak device memory in use (the runtime's `peak_bytes_in_use`; on a CPU, the
process's peak RSS) against the compiled figure. Each size runs in a process of its own, so
that one size's peak is not another's. `--write_results` puts the table into
docs/RESULTS.md under "On an accelerator", replacing the rows of the same device and size.
The batches are synthetic (bench/synthetic_batches.py: the last quarter of every row padding),
so the check needs no data.
"""
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

flags.DEFINE_list("sizes", ["base", "quickstart"], "Configs to check: base, quickstart.")
flags.DEFINE_integer("steps", 20, "Steps timed one by one per size (the first is reported "
                     "apart).")
QUEUED_STEPS = 20  # the table's last column, as its header says
flags.DEFINE_integer("queued_steps", QUEUED_STEPS, "Steps then queued, as the trainer runs them, "
                     "and timed with one wait at the end (the table's last column; another "
                     "count is named in the cell).")
flags.DEFINE_string("out", "", "Also write the table (markdown) to this file.")
flags.DEFINE_string("trace_dir", "", "Also trace 3 steps per size with jax.profiler into "
                    "TRACE_DIR/SIZE (an .xplane.pb: bench/kernel_stats.py reads it).")
flags.DEFINE_string("peer_python", "", "An interpreter with torch (on the lent GPU: python3): "
                    "bench/torch_peer.py eager and torch.compile on the same device, batch and "
                    "dtype (bf16 as autocast), timed after ours.")
flags.DEFINE_enum("target_logit", "auto", ["auto", "gather", "select"], "The loss's form of "
                  "the reference token's logit (aiayn_flax/loss.py): auto, as training "
                  "picks it, or one form forced, to measure the two against each other.")
flags.DEFINE_enum("forms", "auto", ["auto", "before"], "The step's forms: auto, as training "
                  "picks them (the config fields of programs.PLAIN_FORMS at their defaults); "
                  "before: every one of those fields plain (attention written out, the loss by "
                  "separate reductions, Adam per array, rows not aligned) and a threefry fold "
                  "per dropout layer, as until 2026-11-28.")
flags.DEFINE_enum("attention", "auto", ["auto", "written_out", "pallas", "cudnn", "xla"],
                  "Training's attention (config model.attention_implementation): auto, as "
                  "training picks it (on one GPU of compute capability >= 8.0: Pallas's kernels "
                  "for attention; written out with --forms=before); cudnn is the fused "
                  "kernel, to be decided on a GPU.")
flags.DEFINE_integer("steps_per_call", 1, "Steps per compiled call (train_steps: a loop in one "
                     "program, as config.steps_per_call runs it); times are per step.")
flags.DEFINE_string("from_file", "", "With --write_results: the table a device run wrote.")
flags.DEFINE_bool("write_results", False, "Put the table's rows into docs/RESULTS.md.")
FLAGS = flags.FLAGS

HEADER = ("| date | device | size | batch (rows x length), dtype | first step (ms) | ms per step "
          "(median after the first) | plan's ms per step (MFU) | measured MFU | peak memory / "
          "compiled (GB) | torch eager / torch.compile ms per step | "
          f"ms per step, {QUEUED_STEPS} queued, one wait |\n"
          "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_peer.py")
SECTION = "## On an accelerator"
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                       "RESULTS.md")


def size_config(size: str):
  from configs import base, multi30k
  if size not in ("base", "quickstart"):
    raise app.UsageError(f"--sizes: unknown size {size!r} (expected base or quickstart)")
  return base.get_config() if size == "base" else multi30k.get_config()


def peak_memory_bytes(device) -> tuple[int, str]:
  """(bytes, what they are): the runtime's peak device memory, or on a CPU (no memory stats)
  the process's peak resident set."""
  stats = device.memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return stats["peak_bytes_in_use"], "device peak"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process peak RSS"


def peer_milliseconds(python: str, config, rows: int, length: int, steps: int,
                      device: str) -> str:
  """bench/torch_peer.py's ms per step, eager / torch.compile, on our batch shape and dtype."""
  import json

  from bench.peer_request import peer_request
  peer = subprocess.Popen([python, PEER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
  cells = []
  for variant in ("eager", "compile"):
    peer.stdin.write(json.dumps(peer_request(config, rows, length, steps, variant, device)) + "\n")
    peer.stdin.flush()
    answer = peer.stdout.readline()
    if not answer:
      raise RuntimeError(f"{PEER} exited with status {peer.wait()}")
    answer = json.loads(answer)
    print(f"torch {answer['torch']} {variant}: {answer}", flush=True)
    cells.append(f"{answer['seconds_per_step'] * 1e3:.1f}")
  peer.stdin.close()
  peer.wait()
  return " / ".join(cells)


def check(size: str, steps: int, trace_dir: str = "", peer_python: str = "",
          target_logit: str = "auto", forms: str = "auto",
          attention: str = "auto", steps_per_call: int = 1,
          queued_steps: int = QUEUED_STEPS) -> str:
  """One table row for `size`, measured on the first local device."""
  import jax
  import numpy as np

  from aiayn_flax.planning import dry_run, flops
  from aiayn_flax import loss, programs, sharding, train_step
  if target_logit != "auto":  # one form forced, to time the two against each other
    loss.target_logit = getattr(loss, f"target_logit_by_{target_logit}")
  from bench.synthetic_batches import synthetic_batches
  config = size_config(size)
  if forms == "before":  # as bench/gpu_census.py's "before" (not imported: its flags clash)
    from aiayn_flax.attention import dropout
    config = programs.with_plain_forms(config, programs.PLAIN_FORMS)
    dropout.DROPOUT_SEEDS = "make_rng"
  if attention != "auto":
    config.model.attention_implementation = attention
  config.mfu = config.mfu or dry_run.ASSUMED_MFU  # the plan's assumption, not what this measures
  plan = dry_run.plan(config)  # for the local devices, "auto" dtype resolved for them
  config.model.dtype = plan["compute_dtype"]
  rows, length = map(int, plan["flops_batch_shape"].split("x"))
  model = train_step.make_model(config)
  # The trainer's programs on one device (programs.training_programs: rows aligned on one GPU).
  mesh = sharding.data_parallel_mesh(jax.devices()[:1])
  state = train_step.create_train_state(config, model)
  state_sharding = sharding.train_state_shardings(
      mesh, jax.eval_shape(lambda: state), train_step.logical_param_specs(model), config.fsdp)
  state = jax.device_put(state, state_sharding)
  trained_by = programs.training_programs(config, model, mesh, state_sharding)
  batch = synthetic_batches(rows, length, config.model.vocab_size)[0]
  key = train_step.dropout_key(0)
  if steps_per_call == 1:
    compiled = trained_by.step_fn.lower(state, batch, key).compile()
    call = lambda state: compiled(state, batch, key)  # noqa: E731
  else:  # K steps in one program (a loop), as config.steps_per_call runs them
    stacked = jax.tree.map(lambda x: np.stack([x] * steps_per_call), batch)
    compiled = trained_by.steps_fn.lower(state, stacked, steps_per_call, key).compile()
    call = lambda state: compiled(state, stacked, steps_per_call, key)  # noqa: E731
  memory = compiled.memory_analysis()
  compiled_bytes = (memory.argument_size_in_bytes + memory.output_size_in_bytes
                    + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
  seconds = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = call(state)
    jax.block_until_ready((state, metrics))
    seconds.append((time.perf_counter() - start) / steps_per_call)
  # As the trainer runs them, and as torch_peer.py times its steps: queued, one wait at the end.
  start = time.perf_counter()
  for _ in range(queued_steps):
    state, metrics = call(state)
  jax.block_until_ready((state, metrics))
  queued = (time.perf_counter() - start) / queued_steps / steps_per_call
  if trace_dir:
    with jax.profiler.trace(os.path.join(trace_dir, size)):
      for _ in range(3):
        state, metrics = call(state)
      jax.block_until_ready((state, metrics))
  if not all(bool(jax.numpy.isfinite(x).all()) for x in jax.tree.leaves(metrics)):
    raise RuntimeError(f"{size}: a step's metrics are not finite: {metrics}")
  steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
  device = jax.devices()[0]
  peak_bytes, peak_kind = peak_memory_bytes(device)
  model_flops = flops.train_flops(config.model, rows, length, length)
  peak_flops = plan["peak_flops_per_device"] * jax.device_count()
  mfu = f"{model_flops / steady / peak_flops:.2g}" if peak_flops else "- (no peak known)"
  planned = (f"{plan['step_time_s'] * 1e3:.1f} ({plan['mfu']})" if plan["step_time_s"]
             else "- (no peak known)")
  label = size + "".join(f" ({x})" for x in (forms, attention)
                         if x not in ("auto", "written_out"))
  label += f" ({steps_per_call} steps per call)" if steps_per_call > 1 else ""
  ours = (f"| {time.strftime('%Y-%m-%d')} | {jax.device_count()} x {device.device_kind} | "
          f"{label} | {rows} x {length}, {config.model.dtype} | {seconds[0] * 1e3:.1f} | "
          f"{steady * 1e3:.1f} | {planned} | {mfu} | {peak_bytes / 1e9:.2f} ({peak_kind}) / "
          f"{compiled_bytes / 1e9:.2f} |")
  named = "" if queued_steps == QUEUED_STEPS else f" ({queued_steps} queued)"
  queued_cell = f" {queued * 1e3:.1f}{named} |"
  if not peer_python:
    return ours + " - |" + queued_cell
  print(f"ours, before the peer: {ours}", flush=True)
  return ours + (" " + peer_milliseconds(peer_python, config, rows, length, steps,
                                         "cuda" if device.platform == "gpu" else "cpu") + " |"
                 + queued_cell)


def write_results(rows: list[str], path: str = RESULTS) -> None:
  """The rows into `path`'s SECTION table; a row of the same device and size is replaced."""
  with open(path) as f:
    text = f.read()
  if SECTION not in text:
    text = text.rstrip("\n") + f"\n\n{SECTION}\n\n`python bench/device_check.py` on a lent " \
        "device (see its docstring).\n\n" + HEADER + "\n"
  head, tail = text.split(SECTION, 1)
  lines = tail.split("\n")
  key = lambda row: [cell.strip() for cell in row.split("|")[2:4]]  # noqa: E731 device, size
  new_keys = [key(row) for row in rows]
  kept = [line for line in lines if not (line.startswith("| 20") and key(line) in new_keys)]
  last_row = max(i for i, line in enumerate(kept) if line.startswith("|"))
  kept[last_row + 1:last_row + 1] = rows
  with open(path, "w") as f:
    f.write(head + SECTION + "\n".join(kept))


def main(argv):
  del argv
  if FLAGS.from_file:
    with open(FLAGS.from_file) as f:
      rows = [line for line in f.read().splitlines() if line.startswith("| 20")]
  elif len(FLAGS.sizes) == 1:
    import jax
    print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind} "
          f"({jax.default_backend()}), jax {jax.__version__}", flush=True)
    rows = [check(FLAGS.sizes[0], FLAGS.steps, FLAGS.trace_dir, FLAGS.peer_python,
                  FLAGS.target_logit, FLAGS.forms, FLAGS.attention, FLAGS.steps_per_call,
                  FLAGS.queued_steps)]
  else:
    # A process per size, this one never starting jax: the runtime's peak memory counts from
    # the process's start, and a GPU's memory is held by the process that took it.
    rows = []
    for size in FLAGS.sizes:
      command = [sys.executable, os.path.abspath(__file__), f"--sizes={size}",
                 f"--steps={FLAGS.steps}", f"--trace_dir={FLAGS.trace_dir}",
                 f"--peer_python={FLAGS.peer_python}", f"--target_logit={FLAGS.target_logit}",
                 f"--forms={FLAGS.forms}", f"--attention={FLAGS.attention}",
                 f"--steps_per_call={FLAGS.steps_per_call}",
                 f"--queued_steps={FLAGS.queued_steps}"]
      process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
      found = []
      for line in process.stdout:  # passed on as it comes: a run cut short keeps its lines
        print(line, end="", flush=True)
        found += [line.rstrip("\n")] if line.startswith("| 20") else []
      if process.wait():
        raise RuntimeError(f"{size}: {' '.join(command)} exited with status {process.returncode}")
      rows.append(found[0])
  table = HEADER + "\n" + "\n".join(rows) + "\n"
  print(table)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      f.write(table)
  if FLAGS.write_results:
    write_results(rows)


if __name__ == "__main__":
  app.run(main)
