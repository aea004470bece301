"""Host memory on transparent huge pages, for XLA:CPU's per-call buffers.

XLA's CPU runtime allocates each call's temporaries as one block (2.4 GB for a base step on
16x128 batches) with malloc, which maps fresh memory for it and unmaps it when the call ends:
every call then touches new pages, one page fault per 4 KiB (620,000 faults and 1.0 s of
kernel time per base step on 2 cores). Where the kernel gives transparent huge pages to memory
that asks for them (/sys/kernel/mm/transparent_hugepage/enabled is `madvise`, the common
default), glibc's malloc asks for them when started with GLIBC_TUNABLES=glibc.malloc.hugetlb=1
(glibc >= 2.35): a fault then maps 2 MiB, and a base step takes 2,000 faults and 0.2 s of kernel
time, 17% less time per step (docs/PERFORMANCE.md). glibc reads the setting only at start-up,
so an entry point calls `restart_with_huge_pages()` first: it re-executes the same command (same
process id, arguments and environment, plus the setting) once.

AIAYN_HUGE_PAGES=0 in the environment turns it off.
"""
import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def transparent_huge_page_mode(path: str = THP_MODE_FILE) -> str:
  """The kernel's mode, the bracketed word of `path` (always, madvise, never); "" if unknown."""
  try:
    with open(path) as f:
      words = f.read().split()
  except OSError:
    return ""
  return next((word[1:-1] for word in words if word.startswith("[")), "")


def glibc_version() -> tuple[int, ...]:
  """(major, minor) of the C library when it is glibc, else ()."""
  name, version = platform.libc_ver()
  if name != "glibc" or not version:
    return ()
  return tuple(int(part) for part in version.split(".")[:2])


def restart_needed(environ, thp_mode: str, libc: tuple[int, ...]) -> bool:
  """Whether this process should re-execute itself with TUNABLE: glibc that knows it, a kernel
  that gives huge pages only to memory that asks (`always` gives them unasked, `never` not at
  all), not turned off, not already set."""
  return (libc >= (2, 35) and thp_mode == "madvise"
          and environ.get("AIAYN_HUGE_PAGES", "1") != "0"
          and "glibc.malloc.hugetlb" not in environ.get("GLIBC_TUNABLES", ""))


def restart_with_huge_pages() -> None:
  """Re-executes the running command with malloc on huge pages when `restart_needed`; returns
  at once otherwise (and in the restarted process). Call it first in an entry point's
  `__main__`, before work that would be lost."""
  if not restart_needed(os.environ, transparent_huge_page_mode(), glibc_version()):
    return
  if sys.orig_argv[1:2] == ["-c"] or not sys.argv[0]:  # nothing to re-execute by name
    return
  tunables = ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES", ""), TUNABLE]))
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
            {**os.environ, "GLIBC_TUNABLES": tunables})


def describe() -> str:
  """One line for a run's log: whether malloc uses huge pages, and why not."""
  if TUNABLE in os.environ.get("GLIBC_TUNABLES", "").split(":"):
    return (f"host buffers on transparent huge pages (GLIBC_TUNABLES={TUNABLE}): "
            "fewer page faults per step")
  mode = transparent_huge_page_mode() or "unknown"
  return f"host buffers on the kernel's default pages (transparent huge pages: {mode})"
