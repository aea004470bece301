"""A tensorflow-datasets builder for a user's own parallel corpus: two plain-text files per split.

    config = ParallelTextConfig(
        name="my_corpus", source_lang="en", target_lang="de",
        files={"train": ("train.en", "train.de"), "validation": ("dev.en", "dev.de")})
    builder = ParallelText(config=config, data_dir=...)
    builder.download_and_prepare()
    train = builder.as_dataset(split="train")  # {"en": ..., "de": ...}

or, with a check that the name was not used before for other files, in one call:

    builder = parallel_text_builder("my_corpus", "en", "de", files, data_dir=...)

Files are UTF-8, one segment per line (gzip if named *.gz); line i of the source file is
aligned with line i of the target file. Every line is kept and file order is preserved.
"""
import dataclasses
import json
import os

from etils import epath
import tensorflow_datasets as tfds

from aiayn_flax.data.text_files import read_parallel_lines


@dataclasses.dataclass(eq=False)
class ParallelTextConfig(tfds.core.BuilderConfig):
  """A corpus: its languages and, per split name, a (source file, target file) pair.

  The prepared data lives under <data_dir>/parallel_text/<name>/; a different corpus needs a
  different name (parallel_text_builder refuses data prepared under that name from other files).
  """
  source_lang: str = "en"
  target_lang: str = "de"
  files: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


def _describe_files(config: ParallelTextConfig) -> str:
  """A description that names every file, stored with the prepared data to detect reuse."""
  lines = [f"Parallel text {config.source_lang}-{config.target_lang}:"]
  for split, (source_path, target_path) in sorted(config.files.items()):
    lines.append(f"{split}: {os.path.abspath(source_path)} | {os.path.abspath(target_path)}")
  return "\n".join(lines)


def _check_config(config) -> ParallelTextConfig:
  if not isinstance(config, ParallelTextConfig):
    raise ValueError(f"ParallelText needs config=ParallelTextConfig(...), got {config!r}")
  if config.source_lang == config.target_lang:
    raise ValueError(f"source and target language are both {config.source_lang!r}")
  if not config.files:
    raise ValueError(f"ParallelTextConfig {config.name!r} names no files")
  return config


class ParallelText(tfds.core.GeneratorBasedBuilder):
  """Any parallel corpus given as pairs of aligned plain-text files (see ParallelTextConfig)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "One example per line pair, every line kept, in file order."}

  def _info(self) -> tfds.core.DatasetInfo:
    config = _check_config(self.builder_config)
    languages = (config.source_lang, config.target_lang)
    return tfds.core.DatasetInfo(
        builder=self,
        description=_describe_files(config),
        features=tfds.features.FeaturesDict({lang: tfds.features.Text() for lang in languages}),
        supervised_keys=languages,
        # Keep file order: tfds would otherwise shuffle examples by key when writing.
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # local files only
    return {
        split: self._generate_examples(source_path, target_path)
        for split, (source_path, target_path) in self.builder_config.files.items()
    }

  def _generate_examples(self, source_path: str, target_path: str):
    source_lang, target_lang = self.builder_config.source_lang, self.builder_config.target_lang
    source_lines, target_lines = read_parallel_lines(source_path, target_path)
    for index, (source, target) in enumerate(zip(source_lines, target_lines)):
      yield index, {source_lang: source, target_lang: target}


def _check_prepared_from_same_files(builder: ParallelText) -> None:
  """Refuses data prepared earlier under the same name from other files (tfds would reuse it)."""
  info_path = epath.Path(builder.data_dir) / "dataset_info.json"
  if not info_path.exists():
    return
  # builder.info.description comes from the code, so read what was stored at preparation.
  stored = json.loads(info_path.read_text()).get("description")
  expected = _describe_files(builder.builder_config)
  if stored != expected:
    raise ValueError(
        f"{builder.data_dir} was prepared from other files:\n{stored}\n"
        f"but this config names:\n{expected}\nUse another config name or delete that folder.")


def parallel_text_builder(
    name: str,
    source_lang: str,
    target_lang: str,
    files: dict[str, tuple[str, str]],
    data_dir: str | None = None,
) -> ParallelText:
  """A ParallelText builder with its data prepared in data_dir (tfds' default if None).

  Call `.as_dataset(split=..., shuffle_files=False)` on it to read a split in file order.
  """
  config = ParallelTextConfig(
      name=name, source_lang=source_lang, target_lang=target_lang, files=dict(files))
  builder = ParallelText(config=config, data_dir=data_dir)
  _check_prepared_from_same_files(builder)
  builder.download_and_prepare()
  return builder
