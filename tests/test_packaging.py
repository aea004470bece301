"""`pip install .` and `pip install git+URL` install the wheel that pyproject.toml builds: it must
hold every module of the package, and they must import from it, away from the clone."""
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO


def source_modules() -> list[str]:
  """Every module of the clone's package, as its path inside a wheel."""
  return sorted(str(p.relative_to(REPO)) for p in (REPO / "aiayn_flax").rglob("*.py"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_built_wheel_holds_every_module_and_they_import_from_it_away_from_the_clone(
    tmp_path):
  # What a source distribution holds, copied: setuptools builds in the source folder, and a
  # build/ left there by an earlier build would fill the wheel with its stale modules.
  source = tmp_path / "source"
  shutil.copytree(REPO / "aiayn_flax", source / "aiayn_flax",
                  ignore=shutil.ignore_patterns("__pycache__"))
  for name in ("pyproject.toml", "README.md", "LICENSE"):
    shutil.copy(REPO / name, source / name)
  # No build isolation: the build uses this venv's setuptools (offline, as CI is).
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-q", "-w", str(tmp_path / "dist"), str(source)], check=True, timeout=240,
                 capture_output=True)
  [wheel] = (tmp_path / "dist").glob("aiayn_flax-*.whl")
  with zipfile.ZipFile(wheel) as archive:
    in_wheel = {name for name in archive.namelist() if name.startswith("aiayn_flax/")}
    archive.extractall(tmp_path / "installed")
  assert [m for m in source_modules() if m not in in_wheel] == []
  assert "aiayn_flax/tasks/__init__.py" in in_wheel  # the package pip install . once missed

  # Imported from the wheel's files, from a folder that is not the clone (the clone's own
  # editable install comes after them on sys.path): every module, as a user's program would.
  imported = subprocess.run(
      [sys.executable, "-c",
       f"import sys; sys.path.insert(0, {str(tmp_path / 'installed')!r})\n"
       "import importlib, pkgutil, aiayn_flax\n"
       "names = [m.name for m in pkgutil.walk_packages(aiayn_flax.__path__, 'aiayn_flax.')]\n"
       "for name in names: importlib.import_module(name)\n"
       "print(aiayn_flax.__file__); print(len(names))"],
      cwd=tmp_path, capture_output=True, text=True, timeout=240,
      env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2",
           "HOME": str(tmp_path)})
  assert imported.returncode == 0, imported.stderr[-3000:]
  location, count = imported.stdout.split()
  assert pathlib.Path(location).is_relative_to(tmp_path / "installed")
  assert int(count) == len(source_modules()) - 1  # every module but the package's own __init__
