"""The path of `config` through the start of a run: the modules it visits, and how often it
goes back up to a higher layer (issue 84, docs/LAYOUT.md "The start of a run").

  python bench/config_path.py              # the toy run, on the CPU: nothing compiled to fit
  python bench/config_path.py --budget     # a memory budget the whole batch exceeds: the fit
                                           # compiles, and chooses micro-batches
  python bench/config_path.py --calls      # and each call, in order

The trainer starts in this process (training/trainer.py's train_and_evaluate on the toy task,
one CPU device, a fresh workdir) and is stopped where its training loop begins (the stop
signals are installed). Meanwhile every call of a function of aiayn_flax/ made from
`_train_and_evaluate` down, in this thread, with a config among its arguments (an
ml_collections ConfigDict: the run's config or a part of it, config.model, config.dataset) is
recorded, in order, as the module of the called function. That sequence, with consecutive calls
into one module merged into one visit, is the path counted:
  - modules: how many distinct modules it visits;
  - up: how many visits are to a module of a higher layer than the visit before (the layers of
    aiayn_flax/__init__.py: runtime 1, data and decoding 2, the model layer 3, parsing 4, tasks
    5, planning 6, training 7, export 8), i.e. the path came back up to continue;
  - accumulation_steps: how many times train_step.accumulation_steps was entered.
"""
import argparse
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from ml_collections import config_dict  # noqa: E402

LAYERS = {"runtime": 1, "data": 2, "decoding": 2, "attention": 3, "parsing": 4, "tasks": 5,
          "planning": 6, "training": 7, "export": 8}
# A budget below the toy batch's whole-batch step (71 MiB on one CPU device at
# tokens_per_batch 4096): the fit compiles the whole batch, then micro-batches.
BUDGET_BYTES = 48 * 2**20


def layer(module: str) -> int:
  parts = module.split(".")
  return LAYERS.get(parts[1], 3) if len(parts) > 2 else 3  # aiayn_flax.x: the model layer


class StartReached(BaseException):
  """Raised where the training loop begins (not an Exception: the trainer lets it through)."""


def config_path(config) -> list[tuple[str, str]]:
  """(module, function) of each call that passes a config on, from _train_and_evaluate down
  to the training loop."""
  from aiayn_flax.runtime import stops
  from aiayn_flax.training import trainer
  library = os.path.join(REPO, "aiayn_flax") + os.sep
  calls, inside = [], []

  def profile(frame, event, arg):
    if event != "call":
      return
    code = frame.f_code
    if code is trainer._train_and_evaluate.__code__:
      inside.append(True)
      return
    if not inside or not code.co_filename.startswith(library):
      return
    count = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames[:count]
    if any(isinstance(frame.f_locals.get(name), config_dict.ConfigDict) for name in names):
      module = os.path.relpath(code.co_filename, REPO)[:-3].replace(os.sep, ".")
      calls.append((module, code.co_name))

  def loop_begins(*args, **kwargs):
    raise StartReached

  original = stops.StopSignals
  stops.StopSignals = loop_begins
  sys.setprofile(profile)
  try:
    with tempfile.TemporaryDirectory() as workdir:
      trainer.train_and_evaluate(config, workdir)
  except StartReached:
    pass
  finally:
    sys.setprofile(None)
    stops.StopSignals = original
  return calls


def visits(calls: list[tuple[str, str]]) -> list[str]:
  merged = []
  for module, _ in calls:
    if not merged or merged[-1] != module:
      merged.append(module)
  return merged


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--budget", action="store_true",
                      help=f"config.device_memory_bytes={BUDGET_BYTES}: the fit compiles")
  parser.add_argument("--calls", action="store_true", help="print each call, in order")
  args = parser.parse_args(argv)
  from configs import toy
  config = toy.get_config()
  config.model.num_layers = 1
  config.tokens_per_batch = 4096
  config.dataset.toy_eval_examples = 16
  config.eval_every_steps = 0
  if args.budget:
    config.device_memory_bytes = BUDGET_BYTES
  calls = config_path(config)
  path = visits(calls)
  if args.calls:
    for module, function in calls:
      print(f"  {layer(module)} {module}.{function}")
  ups = sum(layer(b) > layer(a) for a, b in zip(path, path[1:]))
  print(" -> ".join(f"{m.removeprefix('aiayn_flax.')}({layer(m)})" for m in path))
  print(f"modules: {len(set(path))}; visits: {len(path)}; up: {ups}; accumulation_steps "
        f"entered: {sum(f == 'accumulation_steps' for _, f in calls)}; calls: {len(calls)}")


if __name__ == "__main__":
  main()
