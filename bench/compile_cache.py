"""What the persistent compilation cache saves a restarted run: start-up with and without it.

  python bench/compile_cache.py                     # configs/multi30k.py, 24 + 24 steps
  python bench/compile_cache.py --steps=40 --config=configs/multi30k.py

Three `train.py` processes, each timed from its start to its first logged training step (the
state built, the first bucket's program compiled or loaded, one call run) and to its end (every
bucket met on the way, the evaluation and the validation-BLEU decoding compiled or loaded):
  1. a first start in an empty workdir (it also trains the vocabulary and fills the cache);
  2. the run resumed from that checkpoint for as many steps again, with the cache it wrote;
  3. the same resume from a copy of the same checkpoint, with the cache off.
Runs 2 and 3 do the same work from the same state: their difference is what the cache saves.
JAX's own rules decide what is cached (programs that took at least
jax_persistent_cache_min_compile_time_secs, 1 s by default, to compile).
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed_run(config: str, workdir: str, steps: int, steps_per_call: int, cache: str,
              extra: list[str]) -> tuple[float, float]:
  """(seconds to the first logged step, seconds to the end) of one train.py process."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  command = [sys.executable, "train.py", f"--config={config}", f"--workdir={workdir}",
             f"--config.num_train_steps={steps}", f"--config.steps_per_call={steps_per_call}",
             f"--config.log_every_steps={steps_per_call}", f"--config.eval_every_steps={steps}",
             f"--config.checkpoint_every_steps={steps}",
             f"--config.compilation_cache_dir={cache}", *extra]
  start = time.perf_counter()
  first_step = None
  with subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True) as p:
    for line in p.stderr:
      if first_step is None and "] step " in line and f"/{steps}:" in line:
        first_step = time.perf_counter() - start
  if p.returncode != 0:
    raise SystemExit(f"{' '.join(command)} failed with status {p.returncode}")
  return first_step, time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/multi30k.py")
  parser.add_argument("--steps", type=int, default=24, help="steps of each run")
  parser.add_argument("--steps_per_call", type=int, default=4)
  parser.add_argument("--eval_decode_sentences", type=int, default=64)
  parser.add_argument("--workdir", default="/tmp/aiayn_bench_compile_cache")
  args = parser.parse_args()
  shutil.rmtree(args.workdir, ignore_errors=True)
  first, with_cache, without_cache = (os.path.join(args.workdir, name) for name in
                                      ("run", "resumed_with_cache", "resumed_without_cache"))
  cache = os.path.join(args.workdir, "xla_cache")
  extra = [f"--config.eval_decode_sentences={args.eval_decode_sentences}"]
  run = lambda workdir, steps, cache_dir: timed_run(  # noqa: E731
      args.config, workdir, steps, args.steps_per_call, cache_dir, extra)
  rows = [("first start, empty cache", *run(first, args.steps, cache))]
  entries = len(os.listdir(cache))
  for copy in (with_cache, without_cache):
    shutil.copytree(first, copy)
  rows.append(("resumed, with the cache", *run(with_cache, 2 * args.steps, cache)))
  rows.append(("resumed, cache off", *run(without_cache, 2 * args.steps, "off")))
  print(f"{args.config}, {args.steps} steps per run in calls of {args.steps_per_call}, "
        f"{os.cpu_count()} cores; the first start left {entries} cache entries")
  print("| start | to the first step (s) | to the end (s) |\n|---|---:|---:|")
  for name, to_first, to_end in rows:
    print(f"| {name} | {to_first:.1f} | {to_end:.1f} |")
  print(f"with the cache a resumed run reached its first step {rows[2][1] / rows[1][1]:.2f}x "
        f"sooner and its end {rows[2][2] / rows[1][2]:.2f}x sooner")


if __name__ == "__main__":
  main()
