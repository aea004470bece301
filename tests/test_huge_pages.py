"""Host malloc on huge pages (aiayn_flax/runtime/huge_pages.py): the entry points say in one line
whether it is on, for every way a user starts them, and never restart themselves; the line is
right for each setting, allocator and kernel mode; and glibc still honours the setting here."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from aiayn_flax.runtime import huge_pages

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLIBC = "/lib/x86_64-linux-gnu/libc.so.6"
NOT_SET = {}
SET = {"GLIBC_TUNABLES": huge_pages.TUNABLE}


@pytest.mark.parametrize("environ, mode, libc, malloc_path, expected", [
    (NOT_SET, "madvise", (2, 36), GLIBC,
     "host malloc on huge pages: no (transparent huge pages: madvise); on a CPU, start the "
     "command with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 for fewer page faults per step "
     "(docs/PERFORMANCE.md#host-buffers-on-huge-pages)"),
    (SET, "madvise", (2, 36), GLIBC,
     "host malloc on huge pages: yes (GLIBC_TUNABLES=glibc.malloc.hugetlb=1, transparent huge "
     "pages: madvise): fewer page faults per XLA:CPU step"),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}, "madvise", (2, 36),
     GLIBC, "host malloc on huge pages: yes (GLIBC_TUNABLES=glibc.malloc.hugetlb=1, transparent "
     "huge pages: madvise): fewer page faults per XLA:CPU step"),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=0"}, "madvise", (2, 36),
     GLIBC, "host malloc on huge pages: no (GLIBC_TUNABLES sets glibc.malloc.hugetlb=0; "
     "transparent huge pages: madvise)"),
    (SET, "madvise", (2, 31), GLIBC,
     "host malloc on huge pages: no, glibc 2.31 ignores GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "
     "(it needs glibc >= 2.35; transparent huge pages: madvise)"),
    (NOT_SET, "madvise", (2, 31), "/lib/x86_64-linux-gnu/libc-2.31.so",
     "host malloc on huge pages: no (transparent huge pages: madvise); glibc 2.31 cannot ask "
     "for them (the setting needs >= 2.35)"),
    (NOT_SET, "always", (2, 36), GLIBC,
     "host malloc on huge pages: yes, the kernel gives them unasked (transparent huge pages: "
     "always); GLIBC_TUNABLES=glibc.malloc.hugetlb=1 not needed"),
    (SET, "always", (2, 36), GLIBC,
     "host malloc on huge pages: yes, the kernel gives them unasked (transparent huge pages: "
     "always); GLIBC_TUNABLES=glibc.malloc.hugetlb=1 not needed"),
    (NOT_SET, "never", (2, 36), GLIBC,
     "host malloc on huge pages: no, the kernel gives none (transparent huge pages: never); as "
     "root, echo madvise > /sys/kernel/mm/transparent_hugepage/enabled, then "
     "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (docs/PERFORMANCE.md#host-buffers-on-huge-pages)"),
    (SET, "never", (2, 36), GLIBC,
     "host malloc on huge pages: no, the kernel gives none (transparent huge pages: never); "
     "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 has nothing to ask for; as root, echo madvise > "
     "/sys/kernel/mm/transparent_hugepage/enabled, then GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "
     "(docs/PERFORMANCE.md#host-buffers-on-huge-pages)"),
    ({**SET, "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "madvise", (2, 36),
     "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
     "host malloc: libjemalloc.so.2 (LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2), "
     "not glibc's: GLIBC_TUNABLES does not apply; whether its blocks take huge pages is its own "
     "setting and the kernel's (transparent huge pages: madvise)"),
    ({"LD_PRELOAD": "libtcmalloc_minimal.so.4"}, "always", (2, 36),
     "/usr/lib/libtcmalloc_minimal.so.4",
     "host malloc: libtcmalloc_minimal.so.4 (LD_PRELOAD=libtcmalloc_minimal.so.4), not glibc's: "
     "GLIBC_TUNABLES does not apply; whether its blocks take huge pages is its own setting and "
     "the kernel's (transparent huge pages: always)"),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"}, "madvise", (2, 36), GLIBC,
     "host malloc on huge pages: the kernel's reserved ones, GLIBC_TUNABLES sets "
     "glibc.malloc.hugetlb=2 (as many as /proc/sys/vm/nr_hugepages holds, else default pages; "
     "transparent huge pages: madvise)"),
    (NOT_SET, "", (), "", "host malloc on huge pages: unknown (C library not glibc; transparent "
     "huge pages: unknown)"),
])
def test_describe_says_whether_malloc_takes_huge_pages_and_how_to_turn_them_on(
    environ, mode, libc, malloc_path, expected):
  assert huge_pages.describe(environ, mode, libc, malloc_path) == expected


def test_transparent_huge_page_mode_reads_the_bracketed_word(tmp_path):
  path = tmp_path / "enabled"
  path.write_text("always [madvise] never\n")
  assert huge_pages.transparent_huge_page_mode(str(path)) == "madvise"
  assert huge_pages.transparent_huge_page_mode(str(tmp_path / "missing")) == ""


def test_hugetlb_tunable_is_the_last_value_glibc_tunables_gives():
  assert huge_pages.hugetlb_tunable("") == ""
  assert huge_pages.hugetlb_tunable("glibc.malloc.arena_max=2") == ""
  assert huge_pages.hugetlb_tunable("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1") == "1"
  assert huge_pages.hugetlb_tunable("glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=0") == "0"


def test_tunables_with_hugetlb_sets_or_removes_only_the_malloc_setting():
  """bench/train_speed.py's peer: its malloc setting is --peer_huge_pages's, the rest kept."""
  assert huge_pages.tunables_with_hugetlb("", True) == "glibc.malloc.hugetlb=1"
  assert huge_pages.tunables_with_hugetlb("", False) == ""
  assert huge_pages.tunables_with_hugetlb("glibc.malloc.hugetlb=1", False) == ""
  assert huge_pages.tunables_with_hugetlb(
      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2:glibc.pthread.rseq=0", False) == (
          "glibc.malloc.arena_max=2:glibc.pthread.rseq=0")
  assert huge_pages.tunables_with_hugetlb("glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2",
                                          True) == (
      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")


def test_no_script_restarts_itself_for_huge_pages():
  """The entry points and bench/ only log the line: nothing left to re-execute with."""
  assert not hasattr(huge_pages, "restart_with_huge_pages")
  assert not hasattr(huge_pages, "restart_needed")
  scripts = ["train.py", "evaluate.py", "translate.py", *(
      os.path.join("bench", name) for name in sorted(os.listdir(os.path.join(REPO, "bench"))))]
  for script in scripts:
    if script.endswith(".py"):
      source = open(os.path.join(REPO, script), encoding="utf-8").read()
      assert "execv" not in source and "restart_with_huge_pages" not in source, script
      if "huge_pages" in source:
        assert "huge_pages.log_once_flags_are_parsed()" in source, script


# --- Processes: how malloc is really served here, and the entry points as users start them.

def environment(**extra) -> dict:
  """This process's environment without a malloc setting or preload, plus `extra`."""
  environ = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
  return {**environ, **extra}


# Mallocs and touches 256 MiB; prints the line `describe()` gives in this process, the page
# faults the touching took and the growth of the process's AnonHugePages (/proc/self/smaps_rollup).
PROBE = textwrap.dedent("""
    import ctypes, json, resource
    from aiayn_flax.runtime import huge_pages
    def anon_huge_kib():
      with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    size = 256 * 2 ** 20
    before, huge_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, anon_huge_kib()
    ctypes.memset(libc.malloc(size), 1, size)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(json.dumps({"line": huge_pages.describe(), "faults": faults,
                      "huge_kib": anon_huge_kib() - huge_before,
                      "malloc": huge_pages.malloc_library()}))
""")
PAGES_OF_4K = 256 * 2 ** 20 // 4096
PAGES_OF_2M = 256 // 2


def run_probe(environ: dict) -> dict:
  result = subprocess.run([sys.executable, "-c", PROBE], env=environ, cwd=REPO,
                          capture_output=True, text=True, check=True, timeout=60)
  return json.loads(result.stdout.splitlines()[-1])


def huge_share(probe: dict) -> float:
  """Measured, not read from the line: the share of the probe's 256 MiB that took 2 MiB pages,
  by two witnesses that must agree within 1/8. By its page faults: 65,536 with 4 KiB pages
  alone, 128 with 2 MiB pages alone, and in between where some 2 MiB pages fell back to 4 KiB
  ones (512 faults each). By its AnonHugePages: 262,144 KiB with 2 MiB pages alone. Measured
  here (THP madvise): with the setting 129 faults and 262,144 KiB, or 640 and 260,096 (one of
  the 128 pages fell back: a share of 0.992 by both witnesses); without, 65,537 and 0."""
  by_faults = (PAGES_OF_4K - probe["faults"]) / (PAGES_OF_4K - PAGES_OF_2M)
  by_anon_huge = probe["huge_kib"] / (256 * 1024)
  by_faults, by_anon_huge = (min(max(share, 0.0), 1.0) for share in (by_faults, by_anon_huge))
  assert abs(by_faults - by_anon_huge) <= 1 / 8, (by_faults, by_anon_huge, probe)
  return (by_faults + by_anon_huge) / 2


def on_huge_pages(probe: dict) -> bool:
  """Whether the probe took huge pages: at least a quarter of its bytes on them (a process
  without them measures 0; one with them where the kernel had few free loses some to 4 KiB
  pages, and still took them)."""
  return huge_share(probe) >= 1 / 4


def test_both_witnesses_give_one_share_where_some_huge_pages_fell_back():
  """The probes measured here (huge_share): all, all but one, and none of 128 pages huge; and
  witnesses that disagree (faults of 4 KiB pages beside AnonHugePages of 2 MiB ones) fail."""
  assert huge_share({"faults": 129, "huge_kib": 262144}) == pytest.approx(1, abs=1e-4)
  assert huge_share({"faults": 640, "huge_kib": 260096}) == pytest.approx(127 / 128, abs=1e-4)
  assert huge_share({"faults": 65537, "huge_kib": 0}) == 0
  with pytest.raises(AssertionError):
    huge_share({"faults": 65537, "huge_kib": 262144})


@pytest.mark.slow  # starts processes
def test_a_process_started_with_the_setting_takes_huge_pages_where_the_line_says_so():
  """What the line says is what the pages are, with and without the setting: "yes" where the
  process took huge pages, "no" where it took 4 KiB pages, each measured (faults per page
  touched, AnonHugePages), so that a wrong "no" and a wrong "yes" both fail. Under THP
  madvise (the common default, and this host's) the two starts differ, so both words are
  checked here."""
  probes = {"set": run_probe(environment(**SET)), "not set": run_probe(environment())}
  for name, probe in probes.items():
    assert huge_pages.is_glibc_library(probe["malloc"]), probe["malloc"]
    said = probe["line"].removeprefix("host malloc on huge pages: ").split()[0].rstrip(",")
    assert said in ("yes", "no"), (name, probe["line"])
    assert (said == "yes") == on_huge_pages(probe), (name, probe)
  if huge_pages.transparent_huge_page_mode() == "madvise":
    assert on_huge_pages(probes["set"]) and not on_huge_pages(probes["not set"]), probes


@pytest.mark.slow  # builds a library, starts processes
@pytest.mark.parametrize("name", ["libjemalloc_stand_in.so", "libtcmalloc_stand_in.so"])
def test_a_preloaded_allocator_is_named_and_glibc_s_setting_said_not_to_apply(tmp_path, name):
  """A malloc put first by LD_PRELOAD (a stand-in built here that forwards to glibc's: what the
  line reads is which library serves `malloc`, whatever it does inside)."""
  if not shutil.which("cc"):
    pytest.skip("no C compiler to build a stand-in allocator")
  source = tmp_path / "malloc.c"
  source.write_text("#include <stddef.h>\nextern void *__libc_malloc(size_t);\n"
                    "void *malloc(size_t n) { return __libc_malloc(n); }\n")
  library = tmp_path / name
  subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True,
                 timeout=60)
  probe = run_probe(environment(LD_PRELOAD=str(library), **SET))
  assert probe["malloc"] == str(library)
  assert probe["line"].startswith(f"host malloc: {name} (LD_PRELOAD={library}), not glibc's: "
                                  "GLIBC_TUNABLES does not apply")


# Every interpreter start, the first and any re-executed one, says so on stderr.
STARTS = "import os, sys; sys.stderr.write(f'interpreter started: {os.getpid()}\\n')\n"
TRAIN = ["--config=configs/toy.py", "--dry_run"]  # seconds: parses flags, prints the plan
# A stand-in for the `ipython` script: `%run train.py ARGS` runs the file in the same process
# with sys.argv = ['train.py', ARGS] and __name__ == '__main__', the working folder on sys.path.
IPYTHON = ("import runpy, sys\nsys.path.insert(0, '')\nsys.argv = ['train.py', *sys.argv[1:]]\n"
           "runpy.run_path('train.py', run_name='__main__')\n")
LAUNCHES = {
    "python": ([sys.executable, "train.py", *TRAIN], None),
    "runpy, as %run": ([sys.executable, "{tmp}/ipython_stand_in.py", *TRAIN], None),
    "python -m pdb": ([sys.executable, "-m", "pdb", "-c", "continue", "train.py", *TRAIN], "q\n"),
    "stdin": ([sys.executable, "-", *TRAIN], open(os.path.join(REPO, "train.py")).read()),
}


def start(command, stdin, environ, tmp_path) -> subprocess.CompletedProcess:
  (tmp_path / "sitecustomize.py").write_text(STARTS)
  (tmp_path / "ipython_stand_in.py").write_text(IPYTHON)
  command = [part.replace("{tmp}", str(tmp_path)) for part in command]
  environ = {**environ, "PYTHONPATH": os.pathsep.join(filter(None, [
      str(tmp_path), environ.get("PYTHONPATH", "")]))}
  return subprocess.run(command, cwd=REPO, env=environ, input=stdin or "", capture_output=True,
                        text=True, timeout=120)


def report_lines(stderr: str) -> list[str]:
  return [line.split("] ", 1)[1] for line in stderr.splitlines()
          if "huge_pages.py" in line and "] host malloc" in line]


@pytest.mark.slow  # starts train.py: 6 processes of a few seconds
@pytest.mark.parametrize("launch", LAUNCHES)
@pytest.mark.parametrize("setting", [NOT_SET, SET], ids=["not set", "set"])
def test_train_py_reports_the_setting_once_and_never_restarts(tmp_path, launch, setting):
  """train.py started plainly, through runpy as IPython's %run does, under pdb
  (non-interactive: `continue`, then `q` at pdb's prompt after the program ends) and from
  stdin: one interpreter start, one line, the line for the environment it was given; and the
  dry run's plan printed (stdin was not read twice)."""
  command, stdin = LAUNCHES[launch]
  result = start(command, stdin, environment(**setting), tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  starts = [line for line in result.stderr.splitlines()
            if line.startswith("interpreter started: ")]
  assert len(starts) == 1, result.stderr[-3000:]
  assert report_lines(result.stderr) == [huge_pages.describe(setting)], result.stderr[-3000:]
  assert "bucket_boundaries: 12" in result.stdout


@pytest.mark.slow  # starts processes
@pytest.mark.parametrize("script", ["evaluate.py", "translate.py"])
def test_evaluate_and_translate_report_the_setting_once_and_never_restart(tmp_path, script):
  """Past flag parsing (a workdir that does not exist: they stop at once, with their own
  one-line error), each says the line once, on stderr, from its only interpreter start."""
  result = start([sys.executable, script, f"--workdir={tmp_path / 'none'}"], None,
                 environment(), tmp_path)
  assert result.returncode != 0
  assert len([line for line in result.stderr.splitlines()
              if line.startswith("interpreter started: ")]) == 1, result.stderr[-3000:]
  assert report_lines(result.stderr) == [huge_pages.describe({})], result.stderr[-3000:]
  assert "host malloc" not in result.stdout  # translate.py's stdout is translations
