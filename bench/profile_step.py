"""Where one training step spends its time, op by op: ours (XLA:CPU thunks) and the PyTorch peer's.

  python bench/profile_step.py --size=base          # also quickstart
  python bench/profile_step.py --size=base --torch_python=.bench_venv/bin/python
  python bench/profile_step.py --size=base --top=30 # the 30 costliest ops by name

--steps (traced steps, rounded up to whole calls) and --torch_python are bench/train_speed.py's
flags.

Ours: the step of bench/train_speed.py (same config, batch shape, synthetic batches and
steps per call) is compiled, warmed up, then run for --steps steps under `jax.profiler.trace`.
XLA:CPU records one event per thunk (a fusion, a dot, a copy...), named as the optimized HLO
names its instruction; each name is put in a category by reading that HLO: matmuls by backend
(YNNPACK fusions, oneDNN custom calls, XLA's own dot emitter / Eigen), the output layer's
softmax and loss, scatters and gathers, copies and transposes, other fusions, the optimizer's
update (instructions whose source is optax). Control flow (while, cond) is left out: its events
span the thunks it runs, which are counted. Page faults and kernel time per step come from
getrusage over the same steps, untraced.

The peer (--torch_python): bench/torch_peer.py's step under torch.profiler, its self CPU time
by operator.

Times are per step and add up to the traced thunks' time; thunks run on two threads at once
at places, so the sum can exceed the wall time a little.

Host malloc on huge pages is the environment's setting (start the script with
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 on a CPU, as `make quickstart` does;
docs/INSTALL.md#on-a-cpu-malloc-on-huge-pages); the script never restarts itself for it and
says in one log line (aiayn_flax/runtime/huge_pages.py) whether it is on. The peer here inherits the
same environment (bench/train_speed.py decides its peer's with --peer_huge_pages; this does not).
"""
import collections
import glob
import gzip
import json
import os
import re
import resource
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import jax  # noqa: E402
from absl import app, flags  # noqa: E402

from aiayn_flax.runtime import provenance  # noqa: E402
from bench import train_speed  # noqa: E402

flags.DEFINE_string("size", "base", "quickstart or base (bench/train_speed.py's sizes).")
flags.DEFINE_integer("top", 12, "Also list the costliest ops by name.")
FLAGS = flags.FLAGS

# Events of the runtime itself, not of an HLO instruction; and of control flow, whose events
# span the thunks they run (traced on their own): counted, they would count those twice.
_RUNTIME_EVENTS = re.compile(r"^(ThunkExecutor|SlinkyThreadPool|\$|PjRt|XlaModule|Thunk|"
                             r"CommonPjRt|PjitFunction|while|cond|conditional|call)")


def hlo_instructions(hlo_text: str) -> dict[str, str]:
  """Instruction name -> its line, for every instruction of the optimized module, and the
  computation each fusion calls -> its lines (under the key 'computation:NAME')."""
  lines, computation, body = {}, None, []
  for line in hlo_text.splitlines():
    header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if header:
      computation, body = header.group(1), []
      continue
    if line.startswith("}") and computation:
      lines["computation:" + computation] = "\n".join(body)
      computation = None
      continue
    match = re.match(r"^\s+(?:ROOT )?%?([\w.\-]+) = ", line)
    if match:
      lines[match.group(1)] = line
      body.append(line)
  return lines


def category(name: str, lines: dict[str, str], vocab_size: int) -> str:
  """What an instruction is, by its HLO: the categories of the profile's table (an output
  whose last axis is the vocabulary belongs to the output layer)."""
  line = lines.get(name, "")
  called = re.search(r"calls=%?([\w.\-]+)", line)
  inside = lines.get("computation:" + called.group(1), "") if called else ""
  source = re.search(r'op_name="([^"]*)"', line)
  source = source.group(1) if source else ""
  if "optax" in source or "adam" in source or "apply_gradients" in source:
    return "optimizer update"
  if "__ynn_fusion" in line or name.startswith("ynn_fusion"):
    return "YNNPACK fusions (matmuls; some reductions)"
  if "onednn" in line.lower():
    return "matmul: oneDNN"
  if re.search(r"\bdot\(", line) or name.startswith("dot"):
    return "matmul: XLA dot (Eigen)"
  if "scatter" in name or " scatter(" in inside or " scatter(" in line:
    return "scatter"
  if "gather" in name or " gather(" in inside or " gather(" in line:
    return "gather"
  over_vocabulary = re.search(rf"^\s+%?[\w.\-]+ = \w+\[[\d,]*\b{vocab_size}\]", line)
  if "attend" in source or over_vocabulary or "log_softmax" in source or "logsumexp" in source:
    return "output layer: softmax and loss (elementwise)"
  if re.search(r"\b(copy|transpose)\(", line) or name.startswith(("copy", "transpose")):
    return "copies and transposes"
  if re.search(r"\b(pad|dynamic-update-slice)\(", line) or "wrapped_pad" in name:
    return "pads and slice updates"
  if " transpose(" in inside or " copy(" in inside:
    return "fusions with a transpose or copy"
  if " reduce(" in inside or " reduce(" in line:
    return "fusions with a reduction (layer norm, softmax, sums)"
  return "other elementwise fusions"


def thunk_seconds(run) -> tuple[collections.Counter, collections.Counter]:
  """Runs `run()` under jax.profiler.trace: seconds and event counts per XLA:CPU thunk name."""
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder, create_perfetto_trace=True):
      run()
    trace = json.load(gzip.open(glob.glob(os.path.join(folder, "**", "*.json.gz"),
                                          recursive=True)[0]))
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  seconds, counts = collections.Counter(), collections.Counter()
  for event in events:
    if event.get("ph") == "X" and not _RUNTIME_EVENTS.match(event["name"]):
      seconds[event["name"]] += event["dur"] / 1e6
      counts[event["name"]] += 1
  return seconds, counts


def by_category(seconds: collections.Counter, lines: dict[str, str],
                vocab_size: int) -> collections.Counter:
  per_category = collections.Counter()
  for name, time in seconds.items():
    per_category[category(name, lines, vocab_size)] += time
  return per_category


def trace_ours(size: str, steps: int):
  """(seconds per step, {thunk name: seconds per step}, HLO lines, page faults and kernel
  seconds per step) of our step at `size`."""
  config, (batch, length) = train_speed.size_config(size)
  ours = train_speed.OurStep(config, batch, length)
  steps = ours.in_whole_calls(steps)
  before = resource.getrusage(resource.RUSAGE_SELF)
  seconds = ours.seconds_per_step(steps)
  after = resource.getrusage(resource.RUSAGE_SELF)
  faults = (after.ru_minflt - before.ru_minflt) / steps
  kernel = (after.ru_stime - before.ru_stime) / steps
  per_name, _ = thunk_seconds(lambda: ours.seconds_per_step(steps))
  per_name = collections.Counter({name: time / steps for name, time in per_name.items()})
  hlo = ours.calls[0].func.lower(ours.state, rng=ours.key, **ours.calls[0].keywords
                                 ).compile().as_text()
  return seconds, per_name, hlo_instructions(hlo), faults, kernel


def profile_peer(python: str, config, batch: int, length: int) -> str:
  """bench/torch_peer.py's step under torch.profiler: its table of self CPU time by op."""
  m = config.model
  request = {"model": {"vocab_size": m.vocab_size, "d_model": m.d_model, "d_ff": m.d_ff,
                       "num_heads": m.num_heads, "num_layers": m.num_layers,
                       "dropout_rate": m.dropout_rate},
             "label_smoothing": config.label_smoothing, "rows": batch, "length": length,
             "steps": FLAGS.steps, "profile": True}
  answer = subprocess.run([python, train_speed.PEER], input=json.dumps(request) + "\n",
                          capture_output=True, text=True, check=True).stdout
  return json.loads(answer)["profile"]


def main(argv):
  del argv
  print(f"machine: {provenance.cpu_model()}, {os.cpu_count()} CPUs, jax {jax.__version__}")
  config, (batch, length) = train_speed.size_config(FLAGS.size)
  vocab_size = config.model.vocab_size
  seconds, per_name, lines, faults, kernel = trace_ours(FLAGS.size, FLAGS.steps)
  per_category = by_category(per_name, lines, vocab_size)
  traced = sum(per_category.values())
  print(f"\nours, {FLAGS.size}: {seconds * 1000:.0f} ms per step (untraced), {faults:.0f} page "
        f"faults and {kernel:.2f} s of kernel time per step; traced thunks "
        f"{traced * 1000:.0f} ms per step\n")
  print("| category | ms per step | share |\n|---|---:|---:|")
  for name, time in per_category.most_common():
    print(f"| {name} | {time * 1000:.0f} | {time / traced:.1%} |")
  if FLAGS.top:
    print(f"\nthe {FLAGS.top} costliest ops:\n| op | category | ms per step | source |\n"
          "|---|---|---:|---|")
    for name, time in per_name.most_common(FLAGS.top):
      source = re.search(r'op_name="([^"]*)"', lines.get(name, ""))
      print(f"| {name} | {category(name, lines, vocab_size)} | {time * 1000:.1f} | "
            f"{source.group(1)[-70:] if source else ''} |")
  if FLAGS.torch_python:
    print(f"\nPyTorch eager, {FLAGS.size}, self CPU time over {FLAGS.steps} steps:\n")
    print(profile_peer(FLAGS.torch_python, config, batch, length))


if __name__ == "__main__":
  from aiayn_flax.runtime import huge_pages
  huge_pages.log_once_flags_are_parsed()  # malloc on huge pages? the environment's setting
  flags.FLAGS.set_default("torch_python", "")  # the peer's profile only when asked for
  app.run(main)
