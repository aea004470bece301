"""aiayn_flax: the Transformer of "Attention Is All You Need" in JAX/Flax.

The library is in layers; a module imports only from its own layer or lower ones, and each
package's __init__ says which (its `May import:` line, which tests/test_architecture.py reads):

  1. runtime/    joining hosts, process 0's reads, host agreement, stops, the workdir lease,
                 orbax checkpoints, storage errors, caches and provenance; no model code
  2. data/       sources, vocabulary, token-bucketed batches, the public data files
     decoding/   greedy and beam search against a model's step callback
  3. the model layer, the modules directly in aiayn_flax/: model.py, loss, optimizer,
     train_step, programs, translator, scoring, config_checks, run_dir (reading a saved run),
     attention_maps, plot; and sharding.py and devices.py, which place arrays for the model,
     optimizer and translator and choose each platform's form of an operation (planning/
     reads them too, from above); and attention/, the model layer's package of attention and
     its backends, which reads devices.py
  4. parsing/    constituency parsing's own code (Table 4)
  5. tasks/      the tasks a config trains: translation, parsing, the toy task
  6. planning/   accelerator targets, FLOPs, the dry run, the compiled plan, the kernel census
  7. training/   the trainer: the loop, its metrics, resuming, checkpoints' room
  8. export/     a trained run written for CTranslate2 and transformers' Marian, and run there

The entry points (train.py, evaluate.py, translate.py, export.py) sit above all of them. The
rule of the model layer:

May import: aiayn_flax.runtime, aiayn_flax.data, aiayn_flax.decoding, aiayn_flax.attention
"""
import importlib.abc
import sys

# Modules that moved into the packages above: their old path fails with a pointer to the new.
_MOVED_TO = {
    **dict.fromkeys(["cluster", "process_zero", "host_agreement", "stops", "workdir_lease",
                     "checkpoints", "paths", "storage_errors", "compilation_cache", "huge_pages",
                     "provenance", "tensorflow_setup"], "runtime"),
    "public_data": "data",
    **dict.fromkeys(["accelerator_targets", "compiled_plan", "dry_run", "flops",
                     "kernel_census"], "planning"),
    "trainer": "training",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
  """Asked last, for a module no other finder has: an old path raises ModuleNotFoundError in
  one line ("aiayn_flax.dry_run moved to aiayn_flax.planning.dry_run")."""

  def find_spec(self, fullname, path=None, target=None):
    package, _, name = fullname.rpartition(".")
    if package == __name__ and name in _MOVED_TO:
      # No `name=` on the error: `from aiayn_flax import trainer` would turn an error that
      # names the module it looked for into "cannot import name", losing the pointer.
      raise ModuleNotFoundError(f"{fullname} moved to {__name__}.{_MOVED_TO[name]}.{name}")
    return None


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
  sys.meta_path.append(_MovedModuleFinder())
