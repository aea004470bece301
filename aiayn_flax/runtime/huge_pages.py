"""Host memory on transparent huge pages, for XLA:CPU's per-call buffers: a setting of the
environment that the entry points report in one log line and never set themselves.

XLA's CPU runtime allocates each call's temporaries as one block (2.4 GB for a base step on
16x128 batches) with malloc, which maps fresh memory for it and unmaps it when the call ends:
every call then touches new pages, one page fault per 4 KiB (620,000 faults and 1.0 s of
kernel time per base step on 2 cores). Where the kernel gives transparent huge pages to memory
that asks for them (/sys/kernel/mm/transparent_hugepage/enabled is `madvise`, the common
default), glibc's malloc asks for them when the process starts with
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (glibc >= 2.35): a fault then maps 2 MiB, and a base step
takes 2,000 faults and 0.2 s of kernel time, 17% less time per step on a CPU
(docs/PERFORMANCE.md#host-buffers-on-huge-pages). Nothing measured a gain on a GPU or TPU host,
whose steps do not run in host memory.

glibc reads the setting only when the process starts, so it belongs to whatever starts the
process: `make quickstart` on a CPU, a launch script, the user's shell. The entry points print
`describe()` once (`log_once_flags_are_parsed`) and go on as started: no restart, so IPython's
`%run`, `python -m pdb`, `python - < train.py` and debuggers see one process.

The scripts of bench/ do the same (bench/train_speed.py gives its PyTorch peer a setting of its
own, `tunables_with_hugetlb`).
"""
import ctypes
import os
import platform

TUNABLE = "glibc.malloc.hugetlb=1"
SETTING = f"GLIBC_TUNABLES={TUNABLE}"
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
WHY = "docs/PERFORMANCE.md#host-buffers-on-huge-pages"


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


def hugetlb_tunable(glibc_tunables: str) -> str:
  """The value GLIBC_TUNABLES gives glibc.malloc.hugetlb ("0", "1", "2"), "" when it gives
  none; glibc takes the last of several."""
  values = [item.split("=", 1)[1] for item in glibc_tunables.split(":")
            if item.startswith("glibc.malloc.hugetlb=")]
  return values[-1] if values else ""


def tunables_with_hugetlb(glibc_tunables: str, on: bool) -> str:
  """`glibc_tunables` with its glibc.malloc.hugetlb entries replaced: by TUNABLE when `on`, by
  none otherwise; the other tunables kept in their order."""
  kept = [item for item in glibc_tunables.split(":")
          if item and not item.startswith("glibc.malloc.hugetlb=")]
  return ":".join(kept + ([TUNABLE] if on else []))


class _DlInfo(ctypes.Structure):
  _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
              ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def malloc_library() -> str:
  """The path of the shared object whose `malloc` this process calls (glibc's libc.so.6, or a
  jemalloc or tcmalloc that LD_PRELOAD put first); "" where the C library cannot say."""
  try:
    process = ctypes.CDLL(None)  # the global scope: what the process's own calls resolve to
    dladdr = process.dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not dladdr(ctypes.cast(process.malloc, ctypes.c_void_p), ctypes.byref(info)):
      return ""
    return os.fsdecode(info.dli_fname or b"")
  except (OSError, AttributeError):
    return ""


def is_glibc_library(path: str) -> bool:
  """Whether `path` is glibc's C library (libc.so.6, or libc-2.31.so on older systems)."""
  name = os.path.basename(path)
  return name.startswith("libc.so") or (name.startswith("libc-") and name.endswith(".so"))


def describe(environ=None, thp_mode: str | None = None, libc: tuple[int, ...] | None = None,
             malloc_path: str | None = None) -> str:
  """One line for a run's log: whether host malloc takes huge pages, why, and how to turn them
  on where they are off. Each argument defaults to this process's own."""
  environ = os.environ if environ is None else environ
  thp_mode = transparent_huge_page_mode() if thp_mode is None else thp_mode
  libc = glibc_version() if libc is None else libc
  malloc_path = malloc_library() if malloc_path is None else malloc_path
  value = hugetlb_tunable(environ.get("GLIBC_TUNABLES", ""))
  kernel = f"transparent huge pages: {thp_mode or 'unknown'}"
  if malloc_path and not is_glibc_library(malloc_path):
    preload = environ.get("LD_PRELOAD", "")
    return (f"host malloc: {os.path.basename(malloc_path)}"
            + (f" (LD_PRELOAD={preload})" if preload else "")
            + ", not glibc's: GLIBC_TUNABLES does not apply; whether its blocks take huge "
            f"pages is its own setting and the kernel's ({kernel})")
  if not libc:
    return f"host malloc on huge pages: unknown (C library not glibc; {kernel})"
  if thp_mode == "always":
    return (f"host malloc on huge pages: yes, the kernel gives them unasked ({kernel}); "
            f"{SETTING} not needed")
  if thp_mode == "never":
    return (f"host malloc on huge pages: no, the kernel gives none ({kernel})"
            + (f"; {SETTING} has nothing to ask for" if value == "1" else "")
            + "; as root, echo madvise > " + THP_MODE_FILE + f", then {SETTING} ({WHY})")
  if value == "2":
    return ("host malloc on huge pages: the kernel's reserved ones, GLIBC_TUNABLES sets "
            "glibc.malloc.hugetlb=2 (as many as /proc/sys/vm/nr_hugepages holds, else default "
            f"pages; {kernel})")
  if value == "1" and libc < (2, 35):
    return (f"host malloc on huge pages: no, glibc {'.'.join(map(str, libc))} ignores "
            f"{SETTING} (it needs glibc >= 2.35; {kernel})")
  if value == "1" and thp_mode == "madvise":
    return (f"host malloc on huge pages: yes ({SETTING}, {kernel}): fewer page faults per "
            "XLA:CPU step")
  if value == "1":
    return f"host malloc on huge pages: unknown ({SETTING} set; {kernel})"
  if value:
    return (f"host malloc on huge pages: no (GLIBC_TUNABLES sets glibc.malloc.hugetlb={value}; "
            f"{kernel})")
  if libc < (2, 35):
    return (f"host malloc on huge pages: no ({kernel}); glibc "
            f"{'.'.join(map(str, libc))} cannot ask for them (the setting needs >= 2.35)")
  return (f"host malloc on huge pages: no ({kernel}); on a CPU, start the command with "
          f"{SETTING} for fewer page faults per step ({WHY})")


def log_once_flags_are_parsed() -> None:
  """Has absl print `describe()` on stderr once the flags are parsed, just before main (not
  for --help): stdout stays the program's output (translate.py writes translations there)."""
  from absl import app, logging
  app.call_after_init(lambda: logging.info("%s", describe()))
