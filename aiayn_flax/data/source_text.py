"""Stage 1 of the data flow (see pipeline.py): the source text of a split, as sentence pairs.

Datasets: "toy_reverse" (synthetic), "multi30k", "parallel_text" (files named in the config),
and any tfds translation builder such as wmt14_translate/de-en or /fr-en. (A task with text of
its own, such as parsing, hands the pipeline its text itself: aiayn_flax/tasks/.) A tfds dataset is
read by language (`source_lang`, `target_lang`), whatever its supervised keys say: tfds' WMT14
builders are keyed (xx, "en"), and the paper translates EN->DE and EN->FR. It is streamed in
chunks (`text_pair_chunks`), never held whole as Python strings.
"""
from collections.abc import Iterable

from aiayn_flax.runtime import process_zero
from aiayn_flax.data import toy

CHUNK_PAIRS = 50_000  # sentence pairs read and tokenized at a time
_LOCAL_DATASETS = ("toy_reverse", "multi30k", "parallel_text")

TextChunks = Iterable[tuple[list[str], list[str]]]


def is_tfds(dataset) -> bool:
  """Whether config.dataset names a tfds builder (anything but our local datasets)."""
  return dataset.name not in _LOCAL_DATASETS


def text_pairs(config, split: str) -> tuple[list[str], list[str]]:
  """(source lines, target lines) of a split, in file order, nothing dropped. On process 0 of a
  multi-host run only (process_zero.read_once gives the others the same lines)."""
  dataset = config.dataset
  name = dataset.name
  if name == "toy_reverse":  # generated, not read: the same on every process
    sizes = {"train": dataset.toy_train_examples}
    seed = {"train": 0, "validation": 1, "test": 2}.get(split)
    if seed is None:
      raise ValueError(f"config.dataset: toy_reverse has splits train/validation/test, not {split!r}")
    return toy.reversal_pairs(sizes.get(split, dataset.toy_eval_examples),
                              config.model.vocab_size, dataset.toy_min_symbols,
                              dataset.max_length - 1, seed)
  process_zero.require_process_zero(f"{name}/{split}")
  if name == "multi30k":
    from aiayn_flax.data import multi30k
    return multi30k.read_split_pairs(split)
  if name == "parallel_text":
    from aiayn_flax.data import text_files
    if split not in dataset.files:
      raise ValueError(f"config.dataset.files has no {split!r} entry (has {sorted(dataset.files)})")
    return text_files.read_parallel_lines(*dataset.files[split])
  return _tfds_pairs(dataset, split)


def text_pair_chunks(config, split: str, chunk_pairs: int = CHUNK_PAIRS) -> TextChunks:
  """text_pairs(config, split) as consecutive (sources, targets) chunks of at most
  `chunk_pairs` pairs; a tfds dataset is streamed rather than read whole."""
  if is_tfds(config.dataset):
    process_zero.require_process_zero(f"{config.dataset.name}/{split}")
    yield from _tfds_pair_chunks(config.dataset, split, chunk_pairs)
    return
  sources, targets = text_pairs(config, split)
  for start in range(0, len(sources), chunk_pairs):
    yield sources[start:start + chunk_pairs], targets[start:start + chunk_pairs]


def prepare(dataset) -> str:
  """Downloads and prepares a tfds dataset into its data_dir unless it is there already (the
  local datasets need nothing), and says which. A multi-host run calls it on process 0 alone,
  before the others read the dataset (pipeline.vocabulary_for, tokenized.split_ids);
  `train.py --prepare_data` alone."""
  if not is_tfds(dataset):
    return f"{dataset.name}: read from its files, nothing to prepare"
  process_zero.require_process_zero(f"{dataset.name} (download and prepare)")
  import tensorflow_datasets as tfds
  builder = tfds.builder(dataset.name, data_dir=dataset.data_dir or None)
  if builder.is_prepared():
    return f"{dataset.name}: prepared already in {builder.data_dir}"
  builder.download_and_prepare()
  return f"{dataset.name}: prepared in {builder.data_dir}"


def _tfds_pairs(dataset, split):
  sources, targets = [], []
  for chunk_sources, chunk_targets in _tfds_pair_chunks(dataset, split, CHUNK_PAIRS):
    sources += chunk_sources
    targets += chunk_targets
  return sources, targets


def _tfds_pair_chunks(dataset, split, chunk_pairs):
  """Pairs from a tfds translation builder, in file order, `chunk_pairs` at a time.

  Features are picked by language: wmt14_translate/de-en (supervised keys ("de", "en")) is read
  EN->DE with source_lang "en", target_lang "de". In tfds' WMT14 builders (tensorflow_datasets/
  translate/wmt14.py, `_subsets`), split "validation" is newstest2013 (its other subset,
  newsdev2014, exists only for Hindi) and "test" is newstest2014, for de-en and fr-en alike.
  """
  import tensorflow_datasets as tfds
  ds = tfds.load(dataset.name, split=split, data_dir=dataset.data_dir or None,
                 shuffle_files=False)
  source_lang, target_lang = dataset.source_lang, dataset.target_lang
  missing = sorted({source_lang, target_lang} - set(ds.element_spec))
  if missing:
    raise ValueError(f"{dataset.name} has features {sorted(ds.element_spec)}; "
                     f"config.dataset.source_lang/target_lang {missing} are not among them")
  # Batched before anything else: a per-example map costs ~40 us an example (measured).
  for examples in tfds.as_numpy(ds.batch(chunk_pairs).prefetch(1)):
    yield ([s.decode("utf-8") for s in examples[source_lang]],
           [t.decode("utf-8") for t in examples[target_lang]])
