"""When a write fails (a full disk, a read-only or vanished workdir, a bucket that refuses it):
the cause in plain words, the path, what is intact and what to do, in one line.

Orbax, tensorstore and the OS report these in their own words (`RESOURCE_EXHAUSTED: Error
writing "opt_state..." in OCDBT database ...`, `[Errno 30] Read-only file system`), often from
several threads at once, each with its traceback. `write_failure` turns such an error into
WriteFailed, one line for the user:

    .../checkpoints/40.orbax-checkpoint-tmp/...: cannot write: the disk is full (no space left
    on device); the newest intact checkpoint is step 20 in .../checkpoints; free space there
    and run the same command to continue from step 20

and `library_tracebacks_to_debug_log` keeps the libraries' tracebacks (orbax's worker threads
log each failure with its traceback; tensorstore's callbacks print "Event loop is closed")
off the terminal: they go to the debug log, which absl's `--verbosity=1` (`-v 1`) shows.
"""
import contextlib
import errno
import logging as python_logging
import os
import re
import sys
import threading
import traceback

from absl import logging

# errno -> the cause in plain words, and what to do about it.
_CAUSES = {
    errno.ENOSPC: ("the disk is full (no space left on device)", "free space there"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space within the quota"),
    errno.EROFS: ("the filesystem is read-only",
                  "remount it read-write (or copy the workdir to a writable disk)"),
    errno.EACCES: ("permission denied", "give this user write permission there"),
    errno.EPERM: ("operation not permitted", "give this user write permission there"),
    errno.ENOENT: ("the folder has vanished (no such file or directory)",
                   "mount the workdir again (or restore it)"),
}
BUCKET_REFUSED = ("the bucket refused the write (no permission to write there)",
                  "grant this account write access to the bucket (roles/storage.objectUser)")
# The same causes as tensorstore, orbax and gcsfs word them (they lose the errno).
_WORDINGS = [
    (re.compile(r"No space left on device|os_error_code='28'"), errno.ENOSPC),
    (re.compile(r"Disk quota exceeded|os_error_code='122'"), errno.EDQUOT),
    (re.compile(r"Read-only file system|os_error_code='30'"), errno.EROFS),
    (re.compile(r"Permission denied|os_error_code='13'"), errno.EACCES),
    (re.compile(r"\b403\b|Forbidden|AccessDenied|does not have storage\.objects\.create"),
     BUCKET_REFUSED),
]
# Where tensorstore's and orbax's messages name the file they failed at.
_PATH_IN_MESSAGE = re.compile(r'(?:Failed writing|local file|Error opening|file): "([^"]+)"')


class WriteFailed(ValueError):
  """A write the run needed failed: the message is the one line for the user."""


def cause(error: BaseException) -> tuple[str, str] | None:
  """(the cause in plain words, what to do) when `error`, or an error it was raised from, is a
  failed write for a reason of storage; None for any other error."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in _CAUSES:
      return _CAUSES[error.errno]
    for wording, reason in _WORDINGS:
      if wording.search(str(error)):
        return _CAUSES[reason] if isinstance(reason, int) else reason
    error = error.__cause__ or error.__context__
  return None


def failed_path(error: BaseException) -> str | None:
  """The file or folder a failed write names, where it names one."""
  if isinstance(error, OSError) and error.filename:
    return str(error.filename)
  found = _PATH_IN_MESSAGE.search(str(error))
  return found.group(1) if found else None


def one_line(path, reason: tuple[str, str], intact: str) -> str:
  """'PATH: cannot write: CAUSE; INTACT; TODO, then run the same command'."""
  what, todo = reason
  if todo.startswith("free space") and "/checkpoints" in str(path):
    todo += " (or lower --config.keep_checkpoints)"
  return f"{path}: cannot write: {what}; {intact}; {todo}, then run the same command"


def write_failure(error: BaseException, where, intact: str,
                  name_where: bool = False) -> WriteFailed | None:
  """WriteFailed in one line for a failed write (`where`: the path to name when the error
  names none, or always with `name_where`, e.g. a checkpoint's folder rather than one of
  tensorstore's files in it; `intact`: what is intact, e.g. 'the newest intact checkpoint is
  step 20 in DIR'), or None when `error` is not a storage failure."""
  if isinstance(error, WriteFailed):
    return error
  reason = cause(error)
  if reason is None:
    return None
  logging.debug("the failed write's traceback:\n%s", "".join(
      traceback.format_exception(type(error), error, error.__traceback__)))
  return WriteFailed(one_line(where if name_where else failed_path(error) or where, reason,
                              intact))


# This package's files. Not "/aiayn_flax/" anywhere in the path: a clone of that name holds
# its .venv, and with it orbax's own files.
_OWN_CODE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class _TracebacksToDebug(python_logging.Filter):
  """Takes the traceback off a library's log record (an orbax thread's failed write) and logs
  it at debug level instead; of a message on several lines (asyncio's "Task was destroyed but
  it is pending!" and the task), the first line stays."""

  silenced = False  # set once the run stops on a failed write: see `stopping`

  def filter(self, record):
    if record.pathname.startswith(_OWN_CODE) or record.levelno < python_logging.WARNING:
      return True
    message = record.getMessage()
    if self.silenced:
      logging.debug("after the failed write: %s", message)
      return False
    if record.exc_info or "\n" in message:
      logging.debug("in full: %s\n%s", message, "".join(
          traceback.format_exception(*record.exc_info)) if record.exc_info else "")
      record.msg, record.args = message.splitlines()[0] if message else message, None
      record.exc_info, record.exc_text = None, None
    return True


def _thread_error_to_debug(args) -> None:
  """An exception that ended a library's thread (orbax's writers after a failed save)."""
  logging.debug("thread %s ended by: %s", args.thread and args.thread.name, "".join(
      traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback)))


def _unraisable_to_debug(unraisable) -> None:
  """An exception Python cannot raise anywhere (tensorstore's callback into an asyncio loop
  that orbax has closed after a failed write): to the debug log."""
  logging.debug("ignored in %r: %s", unraisable.object, "".join(traceback.format_exception(
      unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback)))


_QUIET = _TracebacksToDebug()


def stopping() -> None:
  """The run stops on a failed write: from now on the libraries' log records (orbax's threads
  failing one after another, asyncio's futures never retrieved at exit) go to the debug log,
  so that the run's one line is the last the user sees."""
  if logging.get_verbosity() < logging.DEBUG:
    _QUIET.silenced = True


@contextlib.contextmanager
def library_tracebacks_to_debug_log():
  """While the block runs, library tracebacks go to the debug log (`-v 1` shows them), not to
  the terminal: log records' tracebacks, exceptions that end a library's thread, and
  exceptions that no code can catch. Where the block ends with an error, they stay there: the
  libraries' threads may still be failing while the process exits with its one line."""
  if logging.get_verbosity() >= logging.DEBUG:  # -v 1: the user asked to see everything
    yield
    return
  _QUIET.silenced = False
  handlers = [logging.get_absl_handler(), *python_logging.getLogger().handlers]
  previous = [(handler, _QUIET in handler.filters) for handler in handlers]
  for handler in handlers:
    handler.addFilter(_QUIET)  # (once: a filter already there is not added again)
  hooks = sys.unraisablehook, threading.excepthook
  sys.unraisablehook, threading.excepthook = _unraisable_to_debug, _thread_error_to_debug
  yield  # (an error raised in the block leaves all this in place: see the docstring)
  sys.unraisablehook, threading.excepthook = hooks
  for handler, had in previous:
    if not had:
      handler.removeFilter(_QUIET)
