"""Every command in a fenced bash block of README.md and docs/ (lab notes too) names things that exist:
the script or module it runs, each `--flag` of that script (absl or argparse), each
`--config.FIELD` of the config file it names, each repository file in its arguments, each
`make` target and variable, each pip extra. Long commands are parsed, never run; the dry runs
that need no compiler (`--dry_run` without `--target`, `dry_run --table`) are run."""
import importlib.util
import pathlib
import re
import shlex

import pytest

from conftest import REPO, run_script

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]  # lab_notes/ too
PYTHONS = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?$")
# Top-level entries of the repository: an argument starting with one names a repository file.
REPO_ENTRIES = {p.name for p in REPO.iterdir() if not p.name.startswith(".")} - {"runs"}


def bash_commands(text: str) -> list[list[str]]:
  """The commands of the text's ```bash blocks, each as its words: continuation lines joined,
  comments dropped, split at &&, ||, ; and |."""
  commands = []
  for block in re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
    for line in block.replace("\\\n", " ").splitlines():
      lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
      lexer.whitespace_split = True
      lexer.commenters = "#"
      words, redirect = [], False
      for word in lexer:
        if redirect:  # 2>&1: one redirection, not a command sent to the background
          words[-1], redirect = words[-1] + word, False
        elif word == "&" and words and words[-1].endswith(">"):
          words[-1], redirect = words[-1] + word, True
        elif word in ("&&", "||", ";", "|", "&"):
          commands.append(words)
          words = []
        else:
          words.append(word)
      commands.append(words)
  return [c for c in commands if c]


def script_flags(path: pathlib.Path) -> tuple[set[str], bool]:
  """(the flags a script defines, whether --config is a config file flag)."""
  source = path.read_text(encoding="utf-8")
  names = set(re.findall(r"flags\.DEFINE_\w+\(\s*\"(\w+)\"", source))
  names |= set(re.findall(r"add_argument\(\s*\"--([\w-]+)\"", source))
  for module in re.findall(r"^from bench import (\w+)", source, re.MULTILINE):
    names |= script_flags(REPO / "bench" / f"{module}.py")[0]  # absl flags are process-wide
  return names, "DEFINE_config_file(\"config\"" in source


def load_config(spec: str):
  """get_config() of `configs/FILE.py[:ARG]`."""
  file, _, argument = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("docs_config", REPO / file)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(argument) if argument else module.get_config()


def has_field(config, dotted: str) -> bool:
  node = config
  for part in dotted.split("."):
    if not hasattr(node, "keys") or part not in node:
      return False
    node = node[part]
  return True


def repository_path_problems(value: str) -> list[str]:
  """A word naming a file of the repository (configs/x.py, tests/t.py::test_x) that is not there."""
  path, _, test = value.partition("::")
  path = path.partition(":")[0] if path.startswith("configs/") else path
  if path.split("/")[0] not in REPO_ENTRIES or "/" not in path and "." not in path:
    return []
  if not (REPO / path).exists():
    return [f"no file {path}"]
  if test and not re.search(rf"^def {re.escape(test)}\(", (REPO / path).read_text(), re.M):
    return [f"{path} has no test {test}"]
  return []


def python_problems(words: list[str]) -> list[str]:
  """What a `python SCRIPT|-m MODULE ARGS...` command names that does not exist."""
  if words[0] == "-m":
    module, args = words[1], words[2:]
    if module == "pytest":
      return [p for a in args for p in repository_path_problems(a)]
    if not module.startswith("aiayn_flax"):
      return []  # venv, pip: not ours
    script = REPO / (module.replace(".", "/") + ".py")
  else:
    script, args = REPO / words[0], words[1:]
  if not script.exists():
    return [f"no script {script.relative_to(REPO)}"]
  flags, has_config = script_flags(script)
  problems, config_spec = [], None
  for arg in args:
    problems += repository_path_problems(arg)
    if not arg.startswith("--"):
      continue
    name, _, value = arg[2:].partition("=")
    problems += repository_path_problems(value)
    if name.startswith("config.") and has_config:
      continue  # checked below, against the config file
    bare = name[2:] if name.startswith("no") and name[2:] in flags else name
    if bare not in flags:
      problems.append(f"{script.name} has no flag --{name}")
    if name == "config":
      config_spec = value
  overrides = [a[len("--config."):].partition("=")[0] for a in args
               if a.startswith("--config.")]
  if overrides and config_spec and not problems:
    config = load_config(config_spec)
    problems += [f"{config_spec} has no field {field}" for field in overrides
                 if not has_field(config, field)]
  return problems


def makefile_problems(words: list[str]) -> list[str]:
  makefile = (REPO / "Makefile").read_text()
  targets = set(re.findall(r"^([\w.-]+):", makefile, re.MULTILINE))
  problems = []
  for word in words:
    if word.startswith("-"):
      continue
    if "=" in word:
      variable = word.split("=", 1)[0]
      if not re.search(rf"\b{variable}\b", makefile):
        problems.append(f"the Makefile has no variable {variable}")
      problems += repository_path_problems(word.split("=", 1)[1])
    elif word not in targets:
      problems.append(f"the Makefile has no target {word}")
  return problems


def pip_problems(words: list[str]) -> list[str]:
  """Extras of `pip install -e '.[a,b]'` / `uv pip compile --extra a` and the files named."""
  extras_defined = set(re.findall(r"^(\w+) = \[", (REPO / "pyproject.toml").read_text(),
                                  re.MULTILINE))
  extras = [e for w in words for e in re.findall(r"^\.\[([\w,]+)\]$", w)[:1] for e in e.split(",")]
  extras += [b for a, b in zip(words, words[1:]) if a == "--extra"]
  problems = [f"pyproject.toml has no extra [{e}]" for e in extras if e not in extras_defined]
  problems += [f"no file {b}" for a, b in zip(words, words[1:])
               if a in ("-c", "-r") and not (REPO / b).exists()]
  return problems + [p for w in words if w.endswith((".toml", ".lock"))
                     for p in repository_path_problems(w)]


BATCH_SCRIPT_USAGE = "usage: sbatch $0 CONFIG WORKDIR [FLAG...]"


def sbatch_problems(words: list[str]) -> list[str]:
  """`sbatch [OPTION=...] SCRIPT CONFIG WORKDIR [FLAG...]`: the script exists, and what it passes
  on (`train.py --config=CONFIG --workdir=WORKDIR FLAG...`, its usage line) names what exists."""
  args = [w for w in words if not w.startswith("-")][:1]
  if not args:
    return ["sbatch names no script"]
  script = args[0]
  rest = words[words.index(script) + 1:]
  if not (REPO / script).is_file():
    return [f"no file {script}"]
  if BATCH_SCRIPT_USAGE not in (REPO / script).read_text():
    return [f"{script} no longer says {BATCH_SCRIPT_USAGE!r}: update sbatch_problems"]
  if len(rest) < 2:
    return [f"{script} needs CONFIG and WORKDIR"]
  return python_problems(["train.py", f"--config={rest[0]}", f"--workdir={rest[1]}", *rest[2:]])


def command_problems(words: list[str]) -> list[str]:
  """What one command names that does not exist ([] for commands not of this repository)."""
  while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value before a command
    words = words[1:]
  if not words:
    return []
  program = words[0]
  if program == "sbatch":
    return sbatch_problems(words[1:])
  if program in ("gcloud", "srun", "mpirun", "nohup"):  # the command they run (on each host)
    if "--command" in words:
      return [p for c in bash_commands(f"```bash\n{words[words.index('--command') + 1]}\n```\n")
              for p in command_problems(c)]
    start = next((i for i, w in enumerate(words) if PYTHONS.match(w)), None)
    return command_problems(words[start:]) if start is not None else []
  if PYTHONS.match(program):
    return python_problems(words[1:])
  if program == "make":
    return makefile_problems(words[1:])
  if program in ("pip", "uv"):
    return pip_problems(words[1:])
  return []


def test_bash_commands_join_lines_drop_comments_and_split_pipes():
  text = ("intro\n```bash\nA=1 python train.py --config=configs/toy.py \\\n"
          "    --workdir=w > log 2>&1 &  # a comment\n"
          "echo \"x # y\" | python translate.py --workdir=w && make test\n```\n"
          "```\npython not_a_command.py\n```\n")
  assert bash_commands(text) == [
      ["A=1", "python", "train.py", "--config=configs/toy.py", "--workdir=w", ">", "log",
       "2>&1"],
      ["echo", "x # y"], ["python", "translate.py", "--workdir=w"], ["make", "test"]]


@pytest.mark.parametrize("command, problem", [
    ("python evaluate.py --workdir=runs/x --stepp=3", "evaluate.py has no flag --stepp"),
    ("python train.py --config=configs/base.py --config.model.d_modle=8",
     "configs/base.py has no field model.d_modle"),
    ("python train.py --config=configs/basse.py", "no file configs/basse.py"),
    ("python -m pytest tests/test_decoding.py::test_no_such_test",
     "tests/test_decoding.py has no test test_no_such_test"),
    ("make test TEST_WORKRS=2", "the Makefile has no variable TEST_WORKRS"),
    ("make quickstrat", "the Makefile has no target quickstrat"),
    ("pip install -e '.[tpuu]' -c requirements.lock", "pyproject.toml has no extra [tpuu]"),
    ("gcloud compute tpus tpu-vm ssh N --command \"cd a && python train.py --workdr=gs://b\"",
     "train.py has no flag --workdr"),
    ("gcloud compute tpus tpu-vm ssh N --command \"cd a && nohup .venv/bin/python train.py "
     "--config=configs/bigg.py > log &\"", "no file configs/bigg.py"),
    ("sbatch --nodes=2 scripts/slurm/train.sbatch configs/big.py /w --config.dataset.data_dirr=d",
     "configs/big.py has no field dataset.data_dirr"),
    ("sbatch scripts/slurm/trian.sbatch configs/big.py /w", "no file scripts/slurm/trian.sbatch"),
    ("make install ACCELERATR=gpu", "the Makefile has no variable ACCELERATR"),
])
def test_a_misspelt_name_is_found(command, problem):
  [words] = bash_commands(f"```bash\n{command}\n```\n")
  assert command_problems(words) == [problem]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_names_scripts_flags_fields_files_and_targets_that_exist(page):
  problems = [f"{' '.join(words)}: {problem}"
              for words in bash_commands(page.read_text(encoding="utf-8"))
              for problem in command_problems(words)]
  assert not problems, "\n".join(problems)


def test_the_pages_have_commands_of_every_kind():
  commands = [c for page in PAGES for c in bash_commands(page.read_text(encoding="utf-8"))]
  programs = {c[0] for c in commands}
  assert {"python", "make", "pip", "gcloud", "srun"} <= programs
  assert any("--config.model.vocab_size=32000" in c for c in commands)


def dry_runs() -> list[list[str]]:
  """The documented dry runs that compile nothing: `--dry_run` without `--target`."""
  found = []
  for page in PAGES:
    for words in bash_commands(page.read_text(encoding="utf-8")):
      if words[:2] == ["python", "train.py"] and "--dry_run" in words and not any(
          w.startswith("--target") for w in words) or words[:3] == [
          "python", "-m", "aiayn_flax.planning.dry_run"]:
        if words[1:] not in found:
          found.append(words[1:])
  return found


@pytest.mark.slow
@pytest.mark.parametrize("args", dry_runs(), ids=" ".join)
def test_the_documented_dry_runs_run(args):
  result = run_script(*args)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "num_train_steps:" in result.stdout or "| base |" in result.stdout, result.stdout[-2000:]


# The install and launch lines of the pages a newcomer follows onto several hosts.
LAUNCH_PAGES = [REPO / "README.md", REPO / "docs" / "MULTI_HOST.md", REPO / "docs" / "INSTALL.md"]
# Commands these pages may give that are not this repository's (nothing of ours to check).
SHELL_TOOLS = {"cd", "curl", "sh", "source", "git", "tail", "kill", "scancel", "echo",
               "tensorboard", "export"}
# Placeholders: bare capitals, one name per thing on every page; `$NAME` only for a shell
# variable that the page sets (REPO=...) or the environment has.
PLACEHOLDERS = {"BUCKET": "a Cloud Storage bucket", "NAME": "the TPU VM or pod slice",
                "ZONE": "its zone", "OWNER": "the repository's owner",
                "JOBID": "a SLURM job's id"}
ENVIRONMENT = {"HOME"}
NOT_PLACEHOLDERS = {"TERM"}  # a signal's name


def page_commands(page: pathlib.Path) -> list[list[str]]:
  """The page's commands, and the commands that gcloud ... --command runs on the hosts."""
  commands = []
  for words in bash_commands(page.read_text(encoding="utf-8")):
    commands.append(words)
    if "--command" in words:
      commands += bash_commands(f"```bash\n{words[words.index('--command') + 1]}\n```\n")
  return commands


def placeholder_problems(commands: list[list[str]]) -> list[str]:
  words = [w for c in commands for w in c]
  assigned = {m for w in words for m in re.findall(r"^([A-Z_][A-Z0-9_]*)=", w)}
  problems = []
  for word in words:
    for name in re.findall(r"\$\{?([A-Za-z_]\w*)", word):
      if name not in assigned | ENVIRONMENT:
        problems.append(f"{word}: ${name} is neither set on the page nor the environment's; "
                        f"a placeholder is a bare capital name ({', '.join(PLACEHOLDERS)})")
    for name in re.findall(r"(?<![$\w])([A-Z][A-Z0-9_]*[A-Z0-9])(?!\w)", word):
      if name not in set(PLACEHOLDERS) | assigned | ENVIRONMENT | NOT_PLACEHOLDERS:
        problems.append(f"{word}: {name} is not a placeholder of {', '.join(PLACEHOLDERS)}")
    problems += [f"{word}: {m} is a placeholder in another style (a bare capital name)"
                 for m in re.findall(r"<[A-Za-z_][\w -]*>|\{[a-z_]+\}|\b[Yy]our[-_]\w+", word)]
  return problems


@pytest.mark.parametrize("words, problem", [
    (["gcloud", "ssh", "$TPU", "--zone=ZONE"], "$TPU is neither set"),
    (["python", "evaluate.py", "--workdir=gs://<bucket>/base"], "<bucket> is a placeholder"),
    (["python", "evaluate.py", "--workdir=gs://YOUR_BUCKET/base"], "YOUR_BUCKET is not a placeholder"),
    (["tail", "-f", "aiayn-train-{jobid}.out"], "{jobid} is a placeholder"),
])
def test_a_placeholder_in_another_style_is_found(words, problem):
  problems = placeholder_problems([words])
  assert len(problems) == 1 and problem in problems[0], problems


def test_a_variable_the_page_sets_and_the_named_placeholders_pass():
  assert not placeholder_problems([
      ["REPO=https://github.com/OWNER/aiayn_flax.git"], ["git", "clone", "$REPO"],
      ["source", "$HOME/.local/bin/env"], ["scancel", "--signal=TERM", "JOBID"],
      ["python", "train.py", "--workdir=gs://BUCKET/big"]])


@pytest.mark.parametrize("page", LAUNCH_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_install_and_launch_lines_name_placeholders_in_one_style(page):
  problems = placeholder_problems(page_commands(page))
  assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", LAUNCH_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_install_and_launch_line_is_one_this_test_checks(page):
  """No command of these pages escapes command_problems as `not of this repository`, unless it
  is a shell tool with nothing of ours in it."""
  checked = {"python", "make", "pip", "uv", "gcloud", "srun", "sbatch", "mpirun", "nohup"}
  unchecked = []
  for words in page_commands(page):
    while words and re.match(r"^[A-Z_]+=", words[0]):
      words = words[1:]
    if words and not (PYTHONS.match(words[0]) or words[0] in checked | SHELL_TOOLS):
      unchecked.append(" ".join(words))
  assert not unchecked, "\n".join(unchecked)


def commands_with(commands: list[list[str]], *parts: str) -> list[list[str]]:
  return [c for c in commands if all(any(p in w for w in c) for p in parts)]


def test_the_pod_slice_lines_install_on_every_worker_prepare_once_follow_and_stop():
  """README's pod-slice block, in order: install on every worker, the data once, the detached
  launch on every worker, its log followed, and the signal that stops it."""
  blocks = re.findall(r"^```bash\n(.*?)^```", (REPO / "README.md").read_text(),
                      re.MULTILINE | re.DOTALL)
  [pod] = [b for b in blocks if "--worker=all" in b]
  hosts = [(c[c.index("--command") - 1], c[c.index("--command") + 1]) for c in
           bash_commands(f"```bash\n{pod}```\n") if c[0] == "gcloud"]
  steps = [("--worker=all", "pip install --python .venv/bin/python -e '.[tpu]' -c requirements.lock"),
           ("--worker=0", "--prepare_data"), ("--worker=all", "nohup .venv/bin/python train.py"),
           ("--worker=0", "tail -f aiayn_flax/train.log"), ("--worker=all", "kill -TERM")]
  assert len(hosts) == len(steps), hosts
  for (worker, command), (expected_worker, expected) in zip(hosts, steps):
    assert worker == expected_worker and expected in command, (worker, command)
  launch = hosts[2][1]
  data_dir = re.search(r"--config\.dataset\.data_dir=(\S+)", hosts[1][1]).group(1)
  assert f"--config.dataset.data_dir={data_dir}" in launch  # prepared where the run reads it


def test_the_slurm_path_installs_the_gpu_extra_on_a_login_node_and_trains_nothing_there():
  commands = page_commands(REPO / "docs" / "MULTI_HOST.md")
  assert ["make", "install", "ACCELERATOR=gpu"] in commands
  assert not commands_with(commands, "quickstart")  # it trains Multi30k on the login node's CPU
  [prepare] = commands_with(commands, "train.py", "--prepare_data", "/shared/")
  [submit] = [c for c in commands if c[0] == "sbatch"]
  data_dir = next(w for w in prepare if w.startswith("--config.dataset.data_dir="))
  assert data_dir in submit
  for follow_or_stop in ("tail", "tensorboard", "scancel"):
    assert [c for c in commands if c[0] == follow_or_stop], follow_or_stop
  assert "make install ACCELERATOR=gpu" in (REPO / "scripts/slurm/train.sbatch").read_text()
  readme = " ".join((REPO / "README.md").read_text().split())
  assert "`make install ACCELERATOR=gpu`" in readme and "make quickstart` or" not in readme
