"""The package tree keeps its layers: each package's __init__ says what it may import (a line
`May import: ...`; the root's line is the rule of the model layer, the modules directly in
aiayn_flax/), and every import in the library, at the top of a module or inside a function,
keeps to it; no circle of imports; at most 15 modules directly in aiayn_flax/, none over 500
lines; a module's old path (before the packages) fails with a one-line pointer."""
import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = REPO / "aiayn_flax"
MAX_FLAT_MODULES = 15
MAX_LINES = 500


def module_files(root: pathlib.Path) -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every .py under the package `root` (a package is named
  by its __init__)."""
  names = {}
  for path in sorted(root.rglob("*.py")):
    parts = path.relative_to(root.parent).with_suffix("").parts
    names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return names


def imports_of(name: str, path: pathlib.Path, modules: dict) -> list[tuple[int, str]]:
  """(line, module) for each module of the library that `name` imports, anywhere in it:
  `from p import x` counts as p.x where that is a module, else as p; relative imports are
  resolved."""
  top = next(iter(modules)).split(".")[0]
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: from the importer's package up
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
      targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                 for alias in node.names]
    else:
      continue
    for target in targets:
      while target and target not in modules and "." in target:  # import a.b.c: a.b's file
        target = target.rsplit(".", 1)[0]
      if target in modules and (target == top or target.startswith(top + ".")):
        found.append((node.lineno, target))
  return found


def owner(module: str, modules: dict) -> str:
  """The package whose rule a module keeps: its package's, or the root's for the model
  layer's modules directly in the root (and the root itself)."""
  top = module.split(".")[0]
  parts = module.split(".")
  if len(parts) == 1 or (len(parts) == 2 and modules[module].name != "__init__.py"):
    return top
  return ".".join(parts[:2])


def allowed_imports(package_init: pathlib.Path) -> set[str] | None:
  """The packages named by the `May import:` line of a package's docstring (continued on
  indented lines); None where there is no such line."""
  doc = ast.get_docstring(ast.parse(package_init.read_text())) or ""
  lines = doc.splitlines()
  for i, line in enumerate(lines):
    if line.startswith("May import:"):
      text = line.removeprefix("May import:")
      for more in lines[i + 1:]:
        if not more.startswith(" ") or not more.strip():
          break
        text += " " + more.strip()
      names = {n.strip() for n in text.split(",") if n.strip()}
      return set() if names == {"none"} else names
  return None


def upward_imports(root: pathlib.Path) -> list[str]:
  """One line per import that the importer's package does not allow (or per package with no
  rule)."""
  modules = module_files(root)
  rules, problems = {}, []
  for module, path in modules.items():
    if path.name == "__init__.py" and owner(module, modules) == module:
      rules[module] = allowed_imports(path)
      if rules[module] is None:
        problems.append(f"{path.relative_to(root.parent)}: its docstring has no 'May import:' line")
  for module, path in modules.items():
    mine = owner(module, modules)
    for line, target in imports_of(module, path, modules):
      theirs = owner(target, modules)
      if theirs != mine and theirs not in (rules.get(mine) or set()):
        problems.append(f"{path.relative_to(root.parent)}:{line}: {module} imports {target}, "
                        f"but {mine} may import only {sorted(rules.get(mine) or [])} "
                        f"(its own layer or lower ones)")
  return problems


def import_cycles(root: pathlib.Path) -> list[list[str]]:
  """Each circle of imports among the modules, as the list of modules around it."""
  modules = module_files(root)
  graph = {m: sorted({t for _, t in imports_of(m, p, modules) if t != m})
           for m, p in modules.items()}
  state, stack, cycles = {}, [], []

  def visit(name):
    state[name] = "open"
    stack.append(name)
    for other in graph[name]:
      if state.get(other) == "open":
        cycles.append(stack[stack.index(other):] + [other])
      elif other not in state:
        visit(other)
    stack.pop()
    state[name] = "done"

  for name in sorted(graph):
    if name not in state:
      visit(name)
  return cycles


def test_no_module_imports_from_a_layer_above_its_own():
  problems = upward_imports(LIBRARY)
  assert not problems, "\n".join(problems)


def test_the_library_has_no_circle_of_imports():
  """run_dir.py once reached up into tasks/ (run_dir -> tasks -> tasks/parsing ->
  parsing/evaluation -> run_dir): the caller now hands run_dir the task it needs."""
  cycles = import_cycles(LIBRARY)
  assert not cycles, "circles of imports: " + "; ".join(" -> ".join(c) for c in cycles)


def test_few_modules_lie_directly_in_the_package_and_none_is_long():
  flat = sorted(p.name for p in LIBRARY.glob("*.py"))
  assert len(flat) <= MAX_FLAT_MODULES, (
      f"{len(flat)} modules directly in aiayn_flax/ (at most {MAX_FLAT_MODULES}; "
      f"put new ones in the package of their layer): {flat}")
  long = [f"{p.relative_to(REPO)}: {n} lines" for p in sorted(LIBRARY.rglob("*.py"))
          if (n := len(p.read_text().splitlines())) > MAX_LINES]
  assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def write_package(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
  for name, text in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
  return root / "pkg"


LAYERED = {
    "pkg/__init__.py": '"""Root.\n\nMay import: pkg.low\n"""\n',
    "pkg/flat.py": "from pkg.low import a\n",
    "pkg/low/__init__.py": '"""Low.\n\nMay import: none\n"""\n',
    "pkg/low/a.py": "",
    "pkg/high/__init__.py": '"""High.\n\nMay import: pkg.low,\n  pkg\n"""\n',
    "pkg/high/b.py": "from pkg import flat\nfrom . import c\n",
    "pkg/high/c.py": "",
}


def test_the_check_names_an_upward_import_inside_a_function(tmp_path):
  root = write_package(tmp_path, LAYERED)
  assert upward_imports(root) == []
  (root / "low" / "a.py").write_text("def f():\n  from pkg.high import b\n")
  assert upward_imports(root) == [
      "pkg/low/a.py:2: pkg.low.a imports pkg.high.b, but pkg.low may import only [] "
      "(its own layer or lower ones)"]


def test_the_check_finds_a_circle_and_a_package_without_a_rule(tmp_path):
  root = write_package(tmp_path, LAYERED | {"pkg/high/c.py": "import pkg.high.b\n",
                                            "pkg/none/__init__.py": ""})
  assert import_cycles(root) == [["pkg.high.b", "pkg.high.c", "pkg.high.b"]]
  assert upward_imports(root) == ["pkg/none/__init__.py: its docstring has no 'May import:' line"]


@pytest.mark.parametrize("statement, new_path", [
    ("import aiayn_flax.dry_run", "aiayn_flax.planning.dry_run"),
    ("from aiayn_flax import trainer", "aiayn_flax.training.trainer"),
    ("from aiayn_flax.checkpoints import save", "aiayn_flax.runtime.checkpoints"),
    ("import aiayn_flax.public_data", "aiayn_flax.data.public_data"),
])
def test_an_old_module_path_fails_with_a_one_line_pointer(statement, new_path):
  old = new_path.replace(new_path.split(".")[1] + ".", "", 1)
  result = subprocess.run([sys.executable, "-c", statement], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
  assert result.returncode == 1
  assert result.stderr.splitlines()[-1] == (
      f"ModuleNotFoundError: {old} moved to {new_path}"), result.stderr


def test_modules_that_did_not_move_and_unknown_names_import_as_before():
  result = subprocess.run(
      [sys.executable, "-c", "from aiayn_flax import decoding, sharding\n"
       "import aiayn_flax.runtime.paths\n"
       "try:\n  import aiayn_flax.no_such_module\n"
       "except ModuleNotFoundError as e:\n  print(e)\n"],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == "No module named 'aiayn_flax.no_such_module'"
