"""Paths in a run's workdir, which is a local folder or a Cloud Storage URL (gs://bucket/run).

Everything under a workdir goes through etils.epath, as orbax's own files do, never through
os.path or open(): on a URL those would quietly make a local folder named "gs:".
"""
import uuid
from collections.abc import Callable
from typing import IO

from etils import epath


def is_url(path) -> bool:
  return "://" in str(path)


def workdir_path(workdir) -> epath.Path:
  """The workdir as an epath.Path, a local one made absolute (a CheckpointManager wants an
  absolute path). epath's own absolute() would turn gs://b/run into ./gs:/b/run."""
  path = epath.Path(workdir)
  return path if is_url(path) else path.expanduser().absolute()


def write_atomically(path: epath.Path, write: Callable[[IO[bytes]], None]) -> None:
  """Calls write(file) on a temporary file beside `path`, then renames it to `path`, so that a
  reader never sees half a file, locally or on Cloud Storage. The temporary file is removed if
  writing fails."""
  path.parent.mkdir(parents=True, exist_ok=True)
  temp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
  try:
    with temp.open("wb") as f:
      write(f)
    temp.replace(path)
  except BaseException:
    if temp.exists():
      temp.unlink()
    raise
