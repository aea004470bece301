"""Every GPU program a user runs, compiled deviceless for every single-GPU target and dtype: the
training step of the quick start, base and big at each bucket their plans use, and evaluate.py's
beam search. A record of which compile, with the attention form each call site took, the forms
a program fell back from, and its memory against the GPU's usable memory.

  python bench/gpu_programs.py --out=docs/records/gpu_programs.json        # hours on 2 cores
  python bench/gpu_programs.py --configs=base --dtypes=float32 --targets=gpu-h100x1 --buckets=256

Needs the `aot` extra (the CUDA plugin). Each (target, dtype, config) is one row of the record,
written as it completes, so an interrupted run keeps what it compiled (--resume skips rows
already there). A bfloat16 program for a GPU without bfloat16 units (T4) is refused in one line
before any compile, as the trainer refuses it. tests/test_gpu_programs.py compiles the part of
this that decides a kernel (each attention form the dispatcher takes, every target and dtype)
in the CI's time; this is the whole matrix.
"""
import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

TARGETS = ["gpu-t4x1", "gpu-l4x1", "gpu-a10gx1", "gpu-a100x1", "gpu-h100x1", "gpu-h200x1"]
CONFIGS = {"quickstart": "configs.multi30k", "base": "configs.base", "big": "configs.big"}
flags.DEFINE_list("targets", TARGETS, "Single-GPU targets of train.py --dry_run --target.")
flags.DEFINE_list("dtypes", ["bfloat16", "float32"], "Compute dtypes (model.dtype).")
flags.DEFINE_list("configs", list(CONFIGS), "quickstart, base, big.")
flags.DEFINE_list("buckets", [], "Bucket lengths to compile (default: every bucket of the plan).")
flags.DEFINE_bool("beam_search", True, "Also compile evaluate.py's beam search.")
flags.DEFINE_string("out", "", "The JSON record (rows appended as they complete).")
flags.DEFINE_bool("resume", False, "Skip the (target, dtype, config) rows --out already holds.")
FLAGS = flags.FLAGS


@contextlib.contextmanager
def chosen_attention():
  """Records backends.choose's answers while programs are traced, {site: backend (block)},
  and puts choose back after."""
  from aiayn_flax.attention import backends
  chosen, choose = {}, backends.choose

  def recording(call, requested, target):
    name = choose(call, requested, target)
    block = backends.pallas_block(call, target)[0] if name == "pallas" else None
    chosen[f"{call.site} {call.queries}x{call.keys}"] = name + (f" (block {block})" if block
                                                               else "")
    return name
  backends.choose = recording
  try:
    yield chosen
  finally:
    backends.choose = choose


def row(target_name: str, dtype: str, config_name: str) -> dict:
  import importlib

  from aiayn_flax import devices, sharding
  from aiayn_flax.data import bucketing
  from aiayn_flax.planning import accelerator_targets, compiled_plan
  config = importlib.import_module(CONFIGS[config_name]).get_config()
  config.model.dtype = dtype
  target = accelerator_targets.target(target_name)
  kind = devices.kind(target.kind)
  result = {"target": target_name, "dtype": dtype, "config": config_name, "programs": []}
  refusal = devices.dtype_refusal(dtype, kind)
  if refusal:
    return result | {"refused": refusal}
  target_devices = accelerator_targets.topology_devices(target)
  mesh = sharding.make_mesh(config.mesh, target_devices, config.dcn_mesh)
  usable = compiled_plan.usable_memory(kind, target.platform)
  lengths = ([int(b) for b in FLAGS.buckets] if FLAGS.buckets
             else bucketing.boundaries_for(config.dataset))
  with chosen_attention() as chosen:
    compiler = compiled_plan.TrainingCompiler(config, mesh)
    for length in lengths:
      start = time.perf_counter()
      entry = {"bucket": length}
      try:
        programs = compiler.compile_step(config, length)
        memory = max(p.memory_bytes for p in programs)
        entry |= {"compiles": True, "shape": programs[0].shape,
                  "memory_gib": round(memory / 2**30, 2), "fits": memory <= usable}
      except (compiled_plan.DoesNotCompile, compiled_plan.DoesNotFit) as e:
        entry |= {"compiles": False, "error": str(e)[:300]}
      entry |= {"seconds": round(time.perf_counter() - start, 1),
                "fell_back": list(compiler.programs.forms.fell_back),
                "attention": dict(chosen)}
      chosen.clear()
      print(json.dumps(entry), flush=True)
      result["programs"].append(entry)
  if FLAGS.beam_search:  # evaluate.py's decoding, as the compiled plan compiles it
    start = time.perf_counter()
    entry = {"program": "evaluate_beam_search"}
    try:
      plan = compiled_plan.compile_run(config, target_name, include=("evaluate",),
                                       length=lengths[0])
      program = plan["programs"][-1]
      entry |= {"compiles": True, "shape": program.shape,
                "memory_gib": round(program.memory_bytes / 2**30, 2)}
    except (compiled_plan.DoesNotCompile, compiled_plan.DoesNotFit) as e:
      entry |= {"compiles": False, "error": str(e)[:300]}
    entry["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(entry), flush=True)
    result["programs"].append(entry)
  return result


def commit() -> str:
  """The commit a row was compiled from (a record resumed over sessions holds several)."""
  import subprocess
  return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                        cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()


def main(argv):
  del argv
  rows = []
  if FLAGS.resume and FLAGS.out and os.path.exists(FLAGS.out):
    with open(FLAGS.out) as f:
      rows = json.load(f)["rows"]
  done = {(r["target"], r["dtype"], r["config"]) for r in rows}
  import jax
  for config_name in FLAGS.configs:
    for target_name in FLAGS.targets:
      for dtype in FLAGS.dtypes:
        if (target_name, dtype, config_name) in done:
          continue
        print(f"== {target_name} {dtype} {config_name}", flush=True)
        rows.append(row(target_name, dtype, config_name) | {"commit": commit()})
        if FLAGS.out:
          with open(FLAGS.out, "w") as f:
            json.dump({"jax": jax.__version__, "command": " ".join(sys.argv),
                       "rows": rows}, f, indent=1)
  failed = [(r["target"], r["dtype"], r["config"], p.get("bucket", p.get("program")))
            for r in rows for p in r["programs"] if not p["compiles"]]
  print(f"{sum(len(r['programs']) for r in rows)} programs, "
        f"{sum('refused' in r for r in rows)} refused rows, {len(failed)} failed: {failed}")


if __name__ == "__main__":
  app.run(main)
