"""Code run right after a module is first imported, whoever imports it.

For modules we must not import ourselves: TensorFlow takes seconds to import and many runs
never need it (tensorflow_setup hides the accelerators from it the moment it is imported), and
importing JAX before a command has set its environment could change how JAX starts (the test
clusters' compilation-cache key, tests/cluster_site/sitecustomize.py).
"""
import importlib.abc
import importlib.machinery
import sys


def call_after_import(name: str, callback) -> None:
  """Calls `callback(module)` once the module `name` is imported: now if it is already, else as
  soon as its code has run, before its importer gets it. A callback already waiting for `name`
  is not added twice."""
  if name in sys.modules:
    callback(sys.modules[name])
  elif not any(isinstance(finder, _AfterImport) and (finder.name, finder.callback) == (
      name, callback) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport(name, callback))


class _AfterImport(importlib.abc.MetaPathFinder):
  """Finds the module as the other finders do, wraps its loader's exec_module to call the
  callback after it, and steps aside."""

  def __init__(self, name: str, callback):
    self.name, self.callback = name, callback

  def find_spec(self, name, path=None, target=None):
    if name != self.name:
      return None
    sys.meta_path.remove(self)  # once; and the search below must not find this finder again
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
      return spec
    run_module = spec.loader.exec_module

    def exec_module(module):
      run_module(module)
      self.callback(module)
    spec.loader.exec_module = exec_module
    return spec
