"""Training speed: our step against the PyTorch peers, MFU, and how throughput scales.

  python bench/train_speed.py --torch_python=.bench_venv/bin/python   # both sizes, 3 pairs
  python bench/train_speed.py --torch_python=... --bf16     # and bf16 rows (AVX512-BF16, AMX)
  python bench/train_speed.py --torch_python=... --scaling   # and tokens/s as batch/length grow
  python bench/train_speed.py --sizes= --config=configs/multi30k.py --batch=80 --length=32
      (one config's step alone: ms, tokens/s, MFU, page faults and kernel time per step)
  python bench/train_speed.py --sizes= --dropout_ab --pairs=4 --steps=4 --batch=80 --length=32

Sizes: `quickstart` is configs/multi30k.py's model on 91x32 batches (its 2200 real tokens per
side per step); `base` is configs/base.py's model (37,000-piece vocabulary) on 16x128 batches,
a small batch of the base shape. Both sides train on the same synthetic batches
(bench/synthetic_batches.py: the last quarter of every row is padding) and tokens/s counts real
source + target tokens. The peer (bench/torch_peer.py) is one process started once and asked
for timings over a pipe, built from our config's shapes (d_model, d_ff, heads, layers,
vocabulary, dropout, label smoothing), so the two sides cannot compare different models. Two
peers by default (--peers): PyTorch eager, and the same model and loss through torch.compile
(inductor), whose compile time is printed apart. For each size our step and the peers' are
timed in turn, A B C A B C ..., so all see the same machine load; each ratio is the median
over rounds of peer time / our time. The first line names the CPU model and its bf16 units.
Our step runs as the trainer runs it, `steps_per_call` steps per compiled call (4 for the quick
start, 1 for base), so a timing covers whole calls; the peer steps one batch at a time, as PyTorch
trains. Host malloc on huge pages is the environment's setting, as for train.py: start the
bench with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 on a CPU (what `make quickstart` sets;
docs/INSTALL.md#on-a-cpu-malloc-on-huge-pages) for our step on huge pages, without it for default
pages; nothing restarts, and one log line (aiayn_flax/runtime/huge_pages.py) says which it
is. The peer runs without that setting, as a PyTorch user's script does, whatever ours was
started with, unless --peer_huge_pages gives it the setting too. MFU is the model's analytic
training FLOPs (aiayn_flax/planning/flops.py) per second over an f32 matmul peak measured in
this process (the median of the peaks measured at the start and before each round: it moves
with the machine's load).

The peer needs torch, which is not a project dependency: see bench/torch_peer.py for the
install (a venv of its own, the CPU build), then pass --torch_python=PATH of its interpreter.
"""
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from aiayn_flax.planning import flops  # noqa: E402
from aiayn_flax.runtime import huge_pages, provenance  # noqa: E402
from aiayn_flax import model, optimizer, train_step  # noqa: E402
from aiayn_flax.training import trainer  # noqa: E402
from bench.peer_request import peer_request  # noqa: E402
from bench.synthetic_batches import real_tokens, synthetic_batches  # noqa: E402

config_flags.DEFINE_config_file("config", "configs/multi30k.py",
                                "Config timed alone when --sizes is empty.")
flags.DEFINE_list("sizes", ["quickstart", "base"], "Sizes to compare with the PyTorch peer "
                  "(quickstart, base).")
flags.DEFINE_integer("pairs", 3, "Alternating (ours, peer) timings per size.")
flags.DEFINE_integer("steps", 5, "Timed steps per timing.")
flags.DEFINE_bool("scaling", False, "Also print tokens/s as the batch and the length grow.")
flags.DEFINE_integer("batch", 0, "With --sizes empty: rows per batch (0: tokens_per_batch // "
                     "length).")
flags.DEFINE_integer("length", 32, "With --sizes empty: padded length of source and target.")
flags.DEFINE_bool("dropout_ab", False, "With --sizes empty: time --config's step with dropout's "
                  "previous masks (threefry, 16-bit draws) and the current ones (counter hash) "
                  "alternately, and threefry / rbg / unsafe_rbg random words.")
flags.DEFINE_integer("steps_per_call", 0, "Our steps per compiled call for the peer sizes "
                     "(train_step.train_steps); 0: the config's.")
flags.DEFINE_string("torch_python", os.path.join(".bench_venv", "bin", "python"),
                    "Python with torch (bench/torch_peer.py says how to install it).")
flags.DEFINE_list("peers", ["eager", "compile"], "PyTorch peers timed beside ours: eager (plain "
                  "torch.nn) and compile (the same model and loss through torch.compile).")
flags.DEFINE_bool("bf16", False, "Also time bfloat16 compute (--config.model.dtype=bfloat16 "
                  "against the peer under torch.autocast(bfloat16)), as rows of their own; f32 "
                  "stays the matched comparison. Meant for CPUs with AVX512-BF16 or AMX.")
flags.DEFINE_bool("peer_huge_pages", False, "Start the peer with malloc on huge pages "
                  "(GLIBC_TUNABLES=glibc.malloc.hugetlb=1: aiayn_flax/runtime/huge_pages.py). "
                  "Default: the peer runs as a PyTorch user's script does, without it, whatever "
                  "the environment gave ours.")
flags.DEFINE_integer("torch_threads", 0, "The peer's intra-op threads (0: torch's default, one "
                     "per core). On a machine shared with other jobs, torch's OpenMP threads wait "
                     "for each other at every op, and 1 can be faster than 2.")
FLAGS = flags.FLAGS

PEER = os.path.join(REPO, "bench", "torch_peer.py")


def size_config(size: str):
  """Our config for a peer size, and its batch shape (rows, length)."""
  from configs import base, multi30k
  if size == "quickstart":
    config = multi30k.get_config()
    length = 32
    shape = (config.tokens_per_batch // (length - length // 4), length)  # 91 x 32
  elif size == "base":
    config, shape = base.get_config(), (16, 128)
  else:
    raise app.UsageError(f"--sizes: unknown size {size!r} (expected quickstart or base)")
  if FLAGS.steps_per_call:
    config.steps_per_call = FLAGS.steps_per_call
  config.model.dtype = "float32"  # "auto" is f32 on a CPU already; the bf16 rows set it
  return config, shape


def matmul_peak_gflops(n: int = 2048, repeats: int = 10) -> float:
  """Best-of-`repeats` f32 GFLOP/s of an n x n x n matmul."""
  a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
  matmul = jax.jit(lambda x, y: x @ y)
  matmul(a, a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n ** 3 / best / 1e9


class OurStep:
  """The jitted training step on one batch shape, as the trainer runs it: config.steps_per_call
  steps per call (`train_step.train_steps`) when that is above 1. Compiled and warmed up once,
  then timed."""

  def __init__(self, config, batch: int, length: int):
    self.config, self.batch, self.length = config, batch, length
    self.steps_per_call = config.steps_per_call
    model = train_step.make_model(config)
    self.state = train_step.create_train_state(config, model)
    kwargs = dict(model=model, label_smoothing=config.label_smoothing,
                  schedule=optimizer.learning_rate_schedule(config))
    self.batches = synthetic_batches(batch, length, config.model.vocab_size)
    self.key = train_step.dropout_key(0)
    if self.steps_per_call == 1:
      step = jax.jit(functools.partial(train_step.train_step, **kwargs), donate_argnums=0)
      self.calls = [functools.partial(step, batch=b) for b in self.batches]
    else:
      steps = jax.jit(functools.partial(train_step.train_steps, **kwargs), donate_argnums=0)
      stacked = trainer.stack_batches(
          [self.batches[i % len(self.batches)] for i in range(self.steps_per_call)],
          self.steps_per_call)
      self.calls = [functools.partial(steps, batches=stacked, num_steps=self.steps_per_call)]
    self.seconds_per_step(2)  # compile and warm up

  def in_whole_calls(self, steps: int) -> int:
    """The steps of the fewest whole calls that make at least `steps` steps."""
    return -(-steps // self.steps_per_call) * self.steps_per_call

  def seconds_per_step(self, steps: int) -> float:
    """Runs at least `steps` steps, in whole calls; returns the time per step."""
    steps = self.in_whole_calls(steps)
    start = time.perf_counter()
    for i in range(steps // self.steps_per_call):
      self.state, metrics = self.calls[i % len(self.calls)](self.state, rng=self.key)
    jax.block_until_ready((self.state, metrics))
    return (time.perf_counter() - start) / steps

  def flops_per_step(self) -> float:
    return flops.train_flops(self.config.model, self.batch, self.length, self.length)


def threefry_dropout(self, x, *, deterministic: bool):
  """`model.Dropout.__call__` before the counter hash: 16-bit draws split from threefry words."""
  if deterministic or self.rate == 0.0:
    return x
  words = jax.random.bits(self.make_rng("dropout"), ((x.size + 1) // 2,), jnp.uint32)
  uniform16 = jnp.concatenate([words & 0xFFFF, words >> 16])[:x.size].reshape(x.shape)
  keep = uniform16 >= jnp.uint32(round(self.rate * 65536))
  return jnp.where(keep, x / jnp.asarray(1.0 - self.rate, x.dtype), jnp.zeros_like(x))


def compare_dropout(config, batch: int, length: int) -> None:
  """Both dropouts' steps compiled in this process, then timed alternately (--pairs rounds of
  --steps steps); and the cost of random words per PRNG implementation."""
  hashed = model.Dropout.__call__
  steps = {}
  for name, call in (("threefry 16-bit draws", threefry_dropout), ("counter hash", hashed)):
    model.Dropout.__call__ = call
    steps[name] = OurStep(config, batch, length)  # traced and compiled with this dropout
  model.Dropout.__call__ = hashed
  seconds = {name: [] for name in steps}
  for _ in range(FLAGS.pairs):
    for name, step in steps.items():
      seconds[name].append(step.seconds_per_step(FLAGS.steps))
  for name, times in seconds.items():
    print(f"{config.name} {batch}x{length}, dropout from {name}: "
          f"{' '.join(f'{t * 1000:.0f}' for t in times)} ms per step, "
          f"median {statistics.median(times) * 1000:.0f}")
  words = 655_360  # one dropout mask of the quick-start's 2560 x 256 activations, 2 per word
  for impl in ("threefry2x32", "rbg", "unsafe_rbg"):
    draw = jax.jit(lambda key: jax.random.bits(key, (8 * words,), jnp.uint32))
    key = jax.random.key(0, impl=impl)
    draw(key).block_until_ready()
    start = time.perf_counter()
    for _ in range(20):
      draw(key).block_until_ready()
    print(f"{impl}: {(time.perf_counter() - start) / 20 / 8 * 1000:.2f} ms per {words} words")


class Peer:
  """bench/torch_peer.py in one process for the whole run, asked for timings over a pipe."""

  def __init__(self, python: str):
    if not os.path.exists(python):
      raise app.UsageError(f"--torch_python={python}: no such interpreter; install torch as "
                           "bench/torch_peer.py says")
    environ = dict(os.environ)
    if FLAGS.torch_threads:
      environ["OMP_NUM_THREADS"] = str(FLAGS.torch_threads)
    # The peer's malloc setting is --peer_huge_pages's alone, whatever ours was started with.
    environ["GLIBC_TUNABLES"] = huge_pages.tunables_with_hugetlb(
        environ.get("GLIBC_TUNABLES", ""), FLAGS.peer_huge_pages)
    self.huge_pages = FLAGS.peer_huge_pages
    self.process = subprocess.Popen([python, PEER], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env=environ)

  def seconds_per_step(self, config, rows: int, length: int, steps: int, variant: str) -> float:
    """Seconds per step of the peer `variant` (eager or compile) in our config's dtype."""
    request = peer_request(config, rows, length, steps, variant)
    self.process.stdin.write(json.dumps(request) + "\n")
    self.process.stdin.flush()
    answer = self.process.stdout.readline()
    if not answer:
      raise RuntimeError(f"{PEER} exited with status {self.process.wait()}")
    answer = json.loads(answer)
    self.threads, self.warmup_seconds = answer["threads"], answer["warmup_seconds"]
    return answer["seconds_per_step"]

  def close(self) -> None:
    self.process.stdin.close()
    self.process.wait()


def compare_with_peer(size: str, peak: float, peer: Peer, dtype: str = "float32") -> None:
  """Prints one line per peer: both sides' tokens/s, the ratio (median of pairs), the peer's
  compile time, and our MFU. Ours and every peer are timed in turn within each pair."""
  config, (batch, length) = size_config(size)
  config.model.dtype = dtype
  ours = OurStep(config, batch, length)
  warmup = {}
  for variant in FLAGS.peers:  # builds (and compiles) each peer before the timed pairs
    peer.seconds_per_step(config, batch, length, 1, variant)
    warmup[variant] = peer.warmup_seconds
  ours_s, peers_s, peaks = [], {variant: [] for variant in FLAGS.peers}, [peak]
  for _ in range(FLAGS.pairs):
    peaks.append(matmul_peak_gflops())  # the peak moves with the machine's load, as we do
    ours_s.append(ours.seconds_per_step(FLAGS.steps))
    for variant in FLAGS.peers:
      peers_s[variant].append(peer.seconds_per_step(config, batch, length, FLAGS.steps, variant))
  tokens = real_tokens(batch, length)
  mfu = ours.flops_per_step() / statistics.median(ours_s) / 1e9 / statistics.median(peaks)
  for variant, times in peers_s.items():
    ratios = [p / o for o, p in zip(ours_s, times)]
    print(f"{size} ({config.name}, {batch}x{length}, {dtype}, {ours.steps_per_call} step(s) per "
          f"call): ours {tokens / statistics.median(ours_s):.0f} tokens/s, torch {variant} "
          f"({peer.threads} threads{', autocast bf16' if dtype == 'bfloat16' else ''}"
          f"{', huge pages' if peer.huge_pages else ''}) "
          f"{tokens / statistics.median(times):.0f} tokens/s (warm-up incl. compile "
          f"{warmup[variant]:.1f} s), ours/torch {variant} {statistics.median(ratios):.2f} "
          f"(median of {len(ratios)} pairs; per pair {' '.join(f'{r:.2f}' for r in ratios)}), "
          f"our MFU {mfu:.2f}", flush=True)


def scaling_rows(config, peak: float, base_batch: int, base_length: int) -> list[dict]:
  """tokens/s and MFU as the batch's tokens grow (x1, x2, x4), then as the length grows at the
  base batch's token count."""
  shapes = [(base_batch * k, base_length) for k in (1, 2, 4)]
  tokens = base_batch * base_length
  shapes += [(tokens // length, length) for length in (32, 64, 128, 256)]
  rows = []
  for batch, length in shapes:
    ours = OurStep(config, batch, length)
    seconds = min(ours.seconds_per_step(FLAGS.steps) for _ in range(2))
    rows.append({"batch": f"{batch}x{length}",
                 "tokens_per_s": real_tokens(batch, length) / seconds,
                 "mfu": ours.flops_per_step() / seconds / 1e9 / peak})
  return rows


def main(argv):
  del argv
  peak = matmul_peak_gflops()
  print(f"machine: {provenance.cpu_model()}, {os.cpu_count()} CPUs, jax {jax.__version__} on "
        f"{jax.devices()[0].platform}, f32 matmul peak {peak:.1f} GFLOP/s (2048^3, best of 10)")
  if not FLAGS.sizes:
    config = FLAGS.config
    batch = FLAGS.batch or config.tokens_per_batch // FLAGS.length
    if FLAGS.dropout_ab:
      compare_dropout(config, batch, FLAGS.length)
      return
    ours = OurStep(config, batch, FLAGS.length)
    steps = ours.in_whole_calls(FLAGS.steps)
    before = resource.getrusage(resource.RUSAGE_SELF)
    seconds = ours.seconds_per_step(steps)
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{config.name} {batch}x{FLAGS.length}, {ours.steps_per_call} step(s) per call: "
          f"{seconds * 1000:.0f} ms per step, "
          f"{real_tokens(batch, FLAGS.length) / seconds:.0f} tokens/s, "
          f"MFU {ours.flops_per_step() / seconds / 1e9 / peak:.3f}; per step "
          f"{(after.ru_minflt - before.ru_minflt) / steps:.0f} page faults, "
          f"{(after.ru_stime - before.ru_stime) / steps:.2f} s of kernel time")
    return
  peer = Peer(FLAGS.torch_python)
  try:
    for size in FLAGS.sizes:
      compare_with_peer(size, peak, peer)
    if FLAGS.bf16:
      for size in FLAGS.sizes:
        compare_with_peer(size, peak, peer, dtype="bfloat16")
  finally:
    peer.close()
  if FLAGS.scaling:
    for size in FLAGS.sizes:
      config, (batch, length) = size_config(size)
      print(f"\n{size}: | batch | tokens/s | MFU |\n|---|---:|---:|")
      for row in scaling_rows(config, peak, batch, length):
        print(f"| {row['batch']} | {row['tokens_per_s']:.0f} | {row['mfu']:.2f} |")


if __name__ == "__main__":
  huge_pages.log_once_flags_are_parsed()  # malloc on huge pages? the environment's setting
  app.run(main)
