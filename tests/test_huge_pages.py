"""Host buffers on transparent huge pages (aiayn_flax/huge_pages.py): when the entry points
restart themselves, and that glibc still honours the setting on this machine."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from aiayn_flax import huge_pages

# A program that restarts as train.py does, then mallocs and touches 256 MiB, and prints its
# process id, GLIBC_TUNABLES and the page faults the touching took.
PROBE = textwrap.dedent("""
    import ctypes, json, os, resource, sys
    from aiayn_flax import huge_pages
    print(os.getpid(), flush=True)
    huge_pages.restart_with_huge_pages()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    size = 256 * 2 ** 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ctypes.memset(libc.malloc(size), 1, size)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(json.dumps({"pid": os.getpid(), "tunables": os.environ.get("GLIBC_TUNABLES", ""),
                      "faults": faults, "argv": sys.argv[1:]}))
""")
PAGES_OF_4K = 256 * 2 ** 20 // 4096


@pytest.mark.parametrize("environ, mode, libc, expected", [
    ({}, "madvise", (2, 36), True),
    ({}, "madvise", (2, 34), False),  # glibc without the tunable
    ({}, "always", (2, 36), False),  # huge pages without asking
    ({}, "never", (2, 36), False),
    ({}, "", (), False),  # not Linux with glibc
    ({"AIAYN_HUGE_PAGES": "0"}, "madvise", (2, 36), False),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "madvise", (2, 36), False),  # restarted
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", (2, 36), True),
])
def test_restart_needed(environ, mode, libc, expected):
  assert huge_pages.restart_needed(environ, mode, libc) is expected


def test_transparent_huge_page_mode_reads_the_bracketed_word(tmp_path):
  path = tmp_path / "enabled"
  path.write_text("always [madvise] never\n")
  assert huge_pages.transparent_huge_page_mode(str(path)) == "madvise"
  assert huge_pages.transparent_huge_page_mode(str(tmp_path / "missing")) == ""


def run_probe(tmp_path, environ_extra: dict) -> tuple[int, dict]:
  """The probe's process id before the restart, and what it printed after."""
  script = tmp_path / "probe.py"
  script.write_text(PROBE)
  environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  result = subprocess.run([sys.executable, str(script), "--flag", "two words"],
                          env={**environ, **environ_extra}, capture_output=True, text=True,
                          check=True, timeout=60)
  lines = result.stdout.splitlines()
  return int(lines[0]), json.loads(lines[-1])


def test_the_restarted_process_takes_huge_pages(tmp_path):
  """Where the kernel and glibc allow it, the command restarts once (same process id and
  arguments, GLIBC_TUNABLES set) and touching fresh malloc'ed memory takes at most a tenth of
  the 4 KiB page faults; elsewhere it does not restart."""
  pid, after = run_probe(tmp_path, {})
  assert after["pid"] == pid and after["argv"] == ["--flag", "two words"]
  if huge_pages.restart_needed({}, huge_pages.transparent_huge_page_mode(),
                               huge_pages.glibc_version()):
    assert after["tunables"] == huge_pages.TUNABLE
    assert after["faults"] < PAGES_OF_4K / 10, (
        f"{after['faults']} page faults for {PAGES_OF_4K} pages: glibc ignored {huge_pages.TUNABLE}")
  else:
    assert after["tunables"] == ""


def test_turned_off_keeps_the_default_pages(tmp_path):
  pid, after = run_probe(tmp_path, {"AIAYN_HUGE_PAGES": "0"})
  assert after["pid"] == pid and after["tunables"] == ""
  if huge_pages.transparent_huge_page_mode() == "madvise":  # malloc's memory on 4 KiB pages
    assert after["faults"] >= PAGES_OF_4K
