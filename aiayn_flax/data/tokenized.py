"""Stage 3 of the data flow (see pipeline.py): token ids of a split, cached in the workdir.

Tokenized splits are cached beside the vocabulary (WORKDIR/tokenized/*.npz: token ids +
offsets), keyed by the vocabulary file, the dataset, the split, max_length and the fields the
task names as changing the ids (`task.cache_key_fields`: a parser's tree leaves and treebank),
so that later runs and restarts skip tokenization and a changed field tokenizes again. The
tokenizer works chunk by chunk on the streamed text. On several hosts the key is process 0's:
of a user's own corpus it holds the files' paths, sizes and times as process 0 sees them.
"""
import dataclasses
import hashlib
import itertools
import json
import os
import re
import tempfile
import zipfile

import jax
import numpy as np
from absl import logging
from etils import epath

from aiayn_flax.runtime import paths, process_zero, storage_errors
from aiayn_flax.data import ragged, vocabulary
from aiayn_flax.data.ragged import RaggedIds
from aiayn_flax.data.source_text import TextChunks

TOKENIZED_DIRNAME = "tokenized"
_CACHE_FORMAT = 1  # bump when the cached arrays change meaning


@dataclasses.dataclass
class TokenizedSplit:
  sources: RaggedIds  # token ids ending in EOS
  targets: RaggedIds
  skipped_empty: int = 0
  skipped_long: int = 0
  # Of the pairs skipped as too long, those whose source / target side was (a pair may count
  # in both); None when read from a cache written before they were counted.
  long_sources: int | None = None
  long_targets: int | None = None

  def long_sides(self) -> str:
    """', N too long on the source side, M on the target side' (or '' when not counted)."""
    if self.long_sources is None or not self.skipped_long:
      return ""
    return (f" ({self.long_sources} too long on the source side, {self.long_targets} on the "
            "target side)")


def tokenize_for_training(sources: list[str], targets: list[str], vocab,
                          max_length: int) -> TokenizedSplit:
  """Token ids + EOS; drops (and counts) empty pairs and pairs longer than max_length."""
  return _tokenize_chunks([(sources, targets)], vocab, max_length)


def _tokenize_chunks(chunks: TextChunks, vocab, max_length: int) -> TokenizedSplit:
  """tokenize_for_training over a stream of chunks. Ids are stored as uint16 when the
  vocabulary allows (batches are int32 all the same: bucketing copies them into int32 rows)."""
  dtype = np.uint16 if vocab.vocab_size <= 2**16 else np.int32
  flat_parts, length_parts = ([], []), ([], [])  # (sources, targets) each
  skipped_empty = skipped_long = long_sources = long_targets = 0
  for sources, targets in chunks:
    kept = ([], [])
    for s, t in zip(vocab.encode_batch(sources), vocab.encode_batch(targets)):
      if not s or not t:
        skipped_empty += 1
      elif max(len(s), len(t)) + 1 > max_length:
        skipped_long += 1
        long_sources += len(s) + 1 > max_length
        long_targets += len(t) + 1 > max_length
      else:
        kept[0].append(s)
        kept[1].append(t)
    for side, sequences in enumerate(kept):
      lengths = np.fromiter(map(len, sequences), np.int64, len(sequences)) + 1
      flat = np.fromiter(itertools.chain.from_iterable(s + [vocabulary.EOS_ID] for s in sequences),
                         dtype, int(lengths.sum()))
      flat_parts[side].append(flat)
      length_parts[side].append(lengths)
  return TokenizedSplit(ragged.from_parts(flat_parts[0], length_parts[0], dtype),
                        ragged.from_parts(flat_parts[1], length_parts[1], dtype),
                        skipped_empty, skipped_long, long_sources, long_targets)


def split_ids(config, vocab, split: str, task) -> TokenizedSplit:
  """A split's token ids: read from the tokenized cache beside the vocabulary file when there,
  else tokenized chunk by chunk and cached. With several processes, process 0 tokenizes and
  writes the cache while the others wait, then they read it (process_zero.first). (The toy
  task's vocabulary has no file, and no cache: its pairs are generated in a moment.)"""
  name = f"{config.dataset.name}/{split}"
  # Process 0's key, on every host: it names the corpus files as process 0 sees them (the
  # other hosts' disks may not hold them at all).
  path, key = process_zero.read_once(
      f"token cache key of {name}",
      lambda: [str(p) if p else None for p in _cache_path_and_key(config, vocab, split, task)])
  if not path:
    return tokenize_split(config, vocab, split, task)
  path = epath.Path(path)

  def make():
    cached = _read_tokenized(path, key)
    if cached is not None:
      logging.info("%s: token ids read from %s", name, path)
      return cached
    task.prepare_data(config)  # (the vocabulary may have been read without it)
    ids = tokenize_split(config, vocab, split, task)
    if not _write_tokenized(path, key, ids) and jax.process_count() > 1:
      # The other hosts read what process 0 wrote: without it they have nothing to train on.
      raise storage_errors.WriteFailed(
          f"{path}: cannot write the token cache that the other hosts read ({_failed_cache[-1]}); "
          "no checkpoint is affected; free space there or make it writable, then run the same "
          "command")
    logging.info("%s: token ids built by process %d of %d", name, jax.process_index(),
                 jax.process_count())
    return _read_tokenized(path, key) or ids  # mapped from the file written: out of the heap

  def read():
    cached = _read_tokenized(path, key)
    if cached is None:  # only process 0 reads text (hosts' disks may differ): nothing to fall back on
      raise ValueError(f"process {jax.process_index()} cannot read {path}, which process 0 "
                       "wrote: every host of a run needs the same workdir (gs://BUCKET/..., or "
                       "a filesystem all hosts mount)")
    logging.info("%s: token ids read from %s on process %d of %d", name, path,
                 jax.process_index(), jax.process_count())
    return cached

  return process_zero.first(f"tokenized {name}", make, read)


def tokenize_split(config, vocab, split: str, task) -> TokenizedSplit:
  """A split's token ids, tokenized afresh (no cache read or written)."""
  return _tokenize_chunks(task.text_pair_chunks(config, split), vocab,
                          config.dataset.max_length)


def _cache_path_and_key(config, vocab, split: str, task) -> tuple[epath.Path | None, str | None]:
  """(WORKDIR/tokenized/NAME-SPLIT-DIGEST.npz, the JSON key the digest is of)."""
  model_path = getattr(vocab, "model_path", None)
  if not model_path or not epath.Path(model_path).exists():
    return None, None
  vocabulary_sha256 = hashlib.sha256(epath.Path(model_path).read_bytes()).hexdigest()
  dataset = config.dataset
  key = {"format": _CACHE_FORMAT, "vocabulary_sha256": vocabulary_sha256,
         "dataset": dataset.name, "split": split, "max_length": dataset.max_length,
         "source_lang": dataset.get("source_lang"), "target_lang": dataset.get("target_lang")}
  if task_fields := task.cache_key_fields(config):  # (none for translation: its caches stay)
    key["task"] = task_fields
  if dataset.name == "parallel_text" and split in dataset.get("files", {}):
    key["files"] = [[os.path.abspath(p), os.path.getsize(p), os.stat(p).st_mtime_ns]
                    for p in dataset.files[split] if os.path.exists(p)]
  key_text = json.dumps(key, sort_keys=True)
  digest = hashlib.sha256(key_text.encode()).hexdigest()[:16]
  stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{dataset.name}-{split}")
  return epath.Path(model_path).parent / TOKENIZED_DIRNAME / f"{stem}-{digest}.npz", key_text


def _read_tokenized(path: epath.Path, key: str) -> TokenizedSplit | None:
  """The cache at path, its id and offset arrays memory-mapped (a host pages in only what its
  batches read; several GB for WMT14 EN-FR stay out of its heap), or None."""
  if not path.exists():
    return None
  try:
    with path.open("rb") as f, np.load(f) as arrays:
      if str(arrays["key"]) != key:
        logging.warning("%s was written for another key; tokenizing again", path)
        return None
      skipped_empty, skipped_long, *long_sides = arrays["skipped"].tolist()
      long_sides = [None if n < 0 else n for n in long_sides]
    local = _local_copy(path)
    mapped = {name: _mapped_member(local, name) for name in (
        "source_ids", "source_offsets", "target_ids", "target_offsets")}
    return TokenizedSplit(RaggedIds(mapped["source_ids"], mapped["source_offsets"]),
                          RaggedIds(mapped["target_ids"], mapped["target_offsets"]),
                          skipped_empty, skipped_long, *(long_sides or [None, None]))
  except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
    logging.warning("%s: unreadable tokenized cache (%s); tokenizing again", path, e)
    return None


def _local_copy(path: epath.Path) -> str:
  """path itself when on a local disk; a cloud cache (gs://) is copied once to this host's
  temporary folder, by name (the name holds the key's digest) and size, to be mapped there."""
  if os.path.exists(os.fspath(path)):
    return os.fspath(path)
  local = os.path.join(tempfile.gettempdir(), "aiayn_flax_tokenized", path.name)
  if not os.path.exists(local) or os.path.getsize(local) != path.stat().length:
    os.makedirs(os.path.dirname(local), exist_ok=True)
    partial = f"{local}.{os.getpid()}.partial"
    path.copy(epath.Path(partial), overwrite=True)
    os.replace(partial, local)
  return local


def _mapped_member(npz_path: str, name: str) -> np.ndarray:
  """Array `name` of an uncompressed .npz (np.savez's), memory-mapped read-only: the .npy
  member's data lies in the zip file as it is, after its zip and .npy headers."""
  with zipfile.ZipFile(npz_path) as archive:
    info = archive.getinfo(f"{name}.npy")
  if info.compress_type != zipfile.ZIP_STORED:
    raise ValueError(f"{npz_path}: {name} is compressed; cannot be memory-mapped")
  with open(npz_path, "rb") as f:
    f.seek(info.header_offset)
    local_header = f.read(30)  # the zip local file header; its name and extra field follow
    name_length, extra_length = int.from_bytes(local_header[26:28], "little"), int.from_bytes(
        local_header[28:30], "little")
    f.seek(info.header_offset + 30 + name_length + extra_length)
    version = np.lib.format.read_magic(f)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, fortran_order, dtype = read_header(f)
    offset = f.tell()
  if fortran_order or not shape[0]:  # np.savez writes neither; an empty array cannot be mapped
    with np.load(npz_path) as arrays:
      return arrays[name]
  return np.memmap(npz_path, dtype=dtype, mode="r", offset=offset, shape=shape)


_failed_cache = []  # why the first cache that could not be written was not: warned about once


def _write_tokenized(path: epath.Path, key: str, tokenized: TokenizedSplit) -> bool:
  """Writes the cache through a temporary file (a reader never sees half of one); whether it
  was written. On one host a failure to write only costs the next run a tokenization: one
  warning, the first time."""
  def write(f):
    np.savez(f, key=np.array(key), source_ids=tokenized.sources.flat,
             source_offsets=tokenized.sources.offsets, target_ids=tokenized.targets.flat,
             target_offsets=tokenized.targets.offsets,
             # -1: the long pairs' sides were not counted (a split read from an older cache)
             skipped=np.array([tokenized.skipped_empty, tokenized.skipped_long,
                               *(-1 if n is None else n
                                 for n in (tokenized.long_sources, tokenized.long_targets))]))
  try:
    paths.write_atomically(path, write)
    logging.info("token ids cached in %s", path)
    return True
  except OSError as e:
    reason = storage_errors.cause(e)
    if not _failed_cache:
      logging.warning("%s: cannot cache token ids (%s); training goes on, and the next start "
                      "tokenizes again", path, reason[0] if reason else e)
    _failed_cache.append(reason[0] if reason else str(e))
    return False
