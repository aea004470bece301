"""Reading plain-text corpora: one segment per line, UTF-8, with errors that name file and line."""
import gzip
import os
import zlib


def read_lines(path: str) -> list[str]:
  """Lines of a UTF-8 text file (gzip if the name ends in .gz), without their line endings.

  Every line is kept, empty ones included, so that line i always means segment i.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such file")
  if path.endswith(".gz"):
    raw_lines = _gunzipped(path).split(b"\n")
  else:
    with open(path, "rb") as f:
      raw_lines = f.read().split(b"\n")
  if raw_lines and raw_lines[-1] == b"":
    raw_lines.pop()  # the newline that ends the last line
  return [decode_line(raw, path, number) for number, raw in enumerate(raw_lines, start=1)]


def _gunzipped(path: str) -> bytes:
  """A .gz file's content; a ValueError naming the file when it is cut short (a copy or download
  that stopped: gzip's own EOFError names no file) or not gzip at all."""
  try:
    with gzip.open(path, "rb") as f:
      return f.read()
  except EOFError:
    raise ValueError(f"{path}: truncated gzip file (it ends before its compressed data does); "
                     "copy or download it again") from None
  except (gzip.BadGzipFile, zlib.error) as e:
    raise ValueError(f"{path}: not a readable gzip file ({e})") from None


def decode_line(raw: bytes, path: str, number: int) -> str:
  """One line's bytes (split at b"\n") as text, without the carriage returns that end it; a
  ValueError naming the file and the line for invalid UTF-8."""
  try:
    return raw.decode("utf-8").rstrip("\r")
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}:{number}: invalid UTF-8 ({e.reason} at byte {e.start})") from None


def read_parallel_lines(source_path: str, target_path: str) -> tuple[list[str], list[str]]:
  """Aligned lines of two files; an error naming both files and counts if they differ."""
  source, target = read_lines(source_path), read_lines(target_path)
  if len(source) != len(target):
    raise ValueError(
        f"parallel files differ in length: {source_path} has {len(source)} lines, "
        f"{target_path} has {len(target)} lines")
  return source, target
