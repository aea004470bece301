"""Every field of every config is read by the code: a field nothing reads would let
`--config.key=value` silently change nothing (and still take part in the resume check)."""
import pathlib
import re

import pytest

from configs import base, big, big_enfr, multi30k, toy

REPO = pathlib.Path(__file__).resolve().parents[1]
# Where a field may be read: the library, the entry points and the benchmarks (not configs/,
# which only set fields, nor tests/).
READERS = sorted([*REPO.glob("aiayn_flax/**/*.py"), *REPO.glob("*.py"), *REPO.glob("bench/*.py")])

CONFIGS = {"base": base.get_config(), "big": big.get_config(), "big_enfr": big_enfr.get_config(),
           "multi30k": multi30k.get_config(), "toy": toy.get_config(),
           **{f"base:{row}": base.get_config(row) for row in base.TABLE3_ROWS}}


def leaf_fields(config, prefix=""):
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from leaf_fields(value, f"{prefix}{key}.")
    else:
      yield prefix + key


def read_patterns(key: str) -> re.Pattern:
  """How code reads a field: config.key, config.get("key"...), config["key"]."""
  k = re.escape(key)
  return re.compile(rf"\.{k}\b|get\(\s*[\"']{k}[\"']|\[\s*[\"']{k}[\"']\s*\]")


@pytest.fixture(scope="module")
def source_text():
  return "\n".join(path.read_text(encoding="utf-8") for path in READERS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_config_field_is_read_by_the_code(name, source_text):
  unread = [field for field in leaf_fields(CONFIGS[name])
            if not read_patterns(field.rsplit(".", 1)[-1]).search(source_text)]
  assert not unread, f"configs {name}: fields nothing reads: {unread}"


def test_the_check_sees_an_unread_field(source_text):
  config = toy.get_config()
  config.dataset.never_read_anywhere = 1
  assert "dataset.never_read_anywhere" in [
      f for f in leaf_fields(config)
      if not read_patterns(f.rsplit(".", 1)[-1]).search(source_text)]


def test_removed_fields_are_ignored_and_added_fields_compare_with_their_old_value():
  from aiayn_flax import trainer
  current = trainer.config_dict(toy.get_config())
  saved = {**current, "weight_decay": 0.0,
           "dataset": {**current["dataset"], "shuffle_buffer": 1000}}
  assert trainer.resume_conflicts(saved, current) == []
  del saved["dataset"]["vocab_character_coverage"]  # saved before the field existed: 1.0
  assert trainer.resume_conflicts(saved, current) == [
      "dataset.vocab_character_coverage: 1.0 -> 0.9995"]
  saved["dataset"]["vocab_character_coverage"] = 0.9995
  saved["dataset"]["max_length"] += 1
  assert trainer.resume_conflicts(saved, current) == [
      f"dataset.max_length: {current['dataset']['max_length'] + 1} -> "
      f"{current['dataset']['max_length']}"]


@pytest.mark.parametrize("override,message", [
    ("--config.num_train_steps=0", "config.num_train_steps=0: must be a positive integer"),
    ("--config.model.num_heads=3",
     "config.model.d_model=64: must be a multiple of model.num_heads=3 while model.qk_dim is 0 "
     "(d_model / num_heads per head); or set model.qk_dim"),
])
def test_a_bad_config_value_stops_train_py_with_one_line_naming_the_key(override, message,
                                                                        tmp_path):
  import subprocess
  import sys
  result = subprocess.run([sys.executable, "train.py", "--config=configs/toy.py", override,
                           f"--workdir={tmp_path / 'run'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == f"train.py: error: {message}"
  assert not (tmp_path / "run").exists()  # stopped before anything was written


def test_config_checks_accept_every_shipped_config():
  from aiayn_flax import config_checks
  for config in CONFIGS.values():
    config_checks.check_config(config)  # raises on a bad value


def test_table3_rows_are_scored_as_section_6_2_did():
  """newstest2013 (tfds' "validation" split), beam search, no checkpoint averaging; the base
  and big runs themselves on newstest2014 with the last 5 / 20 averaged (section 6.1)."""
  for row in base.TABLE3_ROWS:
    config = base.get_config(row)
    assert (config.dataset.test_split, config.beam_size, config.average_last_checkpoints) == (
        "validation", 4, 1), row
  assert (CONFIGS["base"].dataset.test_split, CONFIGS["base"].average_last_checkpoints) == (
      "test", 5)
  assert (CONFIGS["big"].dataset.test_split, CONFIGS["big"].average_last_checkpoints) == (
      "test", 20)
