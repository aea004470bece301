"""Your own parallel corpus: plain-text files, one sentence a line, line i of a source file aligned
with line i of its target file (UTF-8; gzip where named *.gz). The paper's base recipe over
them, with a shared SentencePiece vocabulary trained on the training files:

  python train.py --workdir=runs/mine \
    --config=configs/parallel_text.py:train.en,train.de,dev.en,dev.de
  python train.py --workdir=runs/mine \
    --config=configs/parallel_text.py:train.en,train.de,dev.en,dev.de,test.en,test.de
  python evaluate.py --workdir=runs/mine          # the test files (else the dev files)

The argument names the training pair, the validation pair, and optionally a test pair, as
SOURCE,TARGET paths (relative to where train.py runs). The languages are the files' last
suffixes (train.en, train.de: en -> de; before a .gz), or --config.dataset.source_lang and
target_lang where they are not language codes (they name the Moses tokenizer of the paper's
tokenized BLEU). On several hosts, only process 0 reads the files: the other hosts' disks need
not hold them (docs/MULTI_HOST.md).

Everything else is configs/base.py's, and can be changed with flags as usual: a small corpus
on a CPU wants a smaller model and vocabulary (e.g. configs/multi30k.py's sizes:
--config.model.d_model=128 --config.model.d_ff=512 --config.model.num_heads=4
--config.model.vocab_size=8000 --config.device=cpu), docs/TRAIN.md.
"""
import os

from configs import base


def get_config(files: str = ""):
  paths = [path.strip() for path in files.split(",") if path.strip()]
  if len(paths) not in (4, 6):
    raise ValueError(
        f"configs/parallel_text.py:{files}: expected TRAIN_SOURCE,TRAIN_TARGET,DEV_SOURCE,"
        "DEV_TARGET[,TEST_SOURCE,TEST_TARGET] after the colon, e.g. "
        "--config=configs/parallel_text.py:train.en,train.de,dev.en,dev.de")
  splits = ["train", "validation", "test"][:len(paths) // 2]
  source_lang, target_lang = (_language(p) for p in paths[:2])
  c = base.get_config()
  c.name = "parallel_text"
  c.dataset.update(
      name="parallel_text",
      source_lang=source_lang if source_lang != target_lang else "source",
      target_lang=target_lang if source_lang != target_lang else "target",
      test_split=splits[-1],
  )
  # Absolute paths: the token cache's key names the files (process 0's view of them).
  c.dataset.files = {split: (os.path.abspath(paths[2 * i]), os.path.abspath(paths[2 * i + 1]))
                     for i, split in enumerate(splits)}
  return c


def _language(path: str) -> str:
  """"train.en" -> "en", "train.de.gz" -> "de"; "" without a suffix."""
  name = os.path.basename(path).removesuffix(".gz")
  return os.path.splitext(name)[1].lstrip(".")
