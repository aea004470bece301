"""Every field of every config is read by the code: a field nothing reads would let
`--config.key=value` silently change nothing (and still take part in the resume check)."""
import copy
import json
import os
import re

import numpy as np
import pytest

from aiayn_flax import config_checks
from conftest import REPO, run_script
from configs import base, big, big_enfr, multi30k, parsing, parsing_sample, toy

# Where a field may be read: the library, the entry points and the benchmarks (not configs/,
# which only set fields, nor tests/).
READERS = sorted([*REPO.glob("aiayn_flax/**/*.py"), *REPO.glob("*.py"), *REPO.glob("bench/*.py")])

CONFIGS = {"base": base.get_config(), "big": big.get_config(), "big_enfr": big_enfr.get_config(),
           "multi30k": multi30k.get_config(), "toy": toy.get_config(),
           "parsing": parsing.get_config(), "parsing_sample": parsing_sample.get_config(),
           **{f"base:{row}": base.get_config(row) for row in base.TABLE3_ROWS}}


def leaf_fields(config, prefix=""):
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from leaf_fields(value, f"{prefix}{key}.")
    else:
      yield prefix + key


def read_pattern(field: str) -> re.Pattern:
  """How code reads a field: on a config object (a name ending in `config`, `cfg`, or the
  field's section, `dataset` or `model`, as in `config.model.d_model`), as an attribute,
  with .get("key"...), ["key"] or getattr(obj, "key"). A `.key` on anything else (`path.name`,
  `x.shape`) is not a read of the config."""
  *section, key = field.split(".")
  receiver = rf"\b(?:\w*config|cfg{''.join('|' + s for s in section)})"
  k = re.escape(key)
  return re.compile(rf"{receiver}\s*\.\s*{k}\b|{receiver}\.get\(\s*[\"']{k}[\"']"
                    rf"|{receiver}\[\s*[\"']{k}[\"']\s*\]"
                    rf"|getattr\(\s*{receiver}\s*,\s*[\"']{k}[\"']")


def unread_fields(config, source_text: str) -> list[str]:
  return [field for field in leaf_fields(config) if not read_pattern(field).search(source_text)]


@pytest.fixture(scope="module")
def source_text():
  return "\n".join(path.read_text(encoding="utf-8") for path in READERS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_config_field_is_read_by_the_code(name, source_text):
  unread = unread_fields(CONFIGS[name], source_text)
  assert not unread, f"configs {name}: fields nothing reads: {unread}"


@pytest.mark.parametrize("field", ["never_read_anywhere", "shape", "path", "dataset.size",
                                   "model.shape"])
def test_the_check_sees_an_unread_field_even_with_a_common_name(field, source_text):
  config = toy.get_config()
  *section, key = field.split(".")
  (config[section[0]] if section else config)[key] = 1
  assert [f for f in unread_fields(config, source_text) if f.endswith(key)] == [field]
  if key != "never_read_anywhere":  # the name is read all over the code, but not from a config
    assert re.search(rf"\.{key}\b", source_text)


# configs/toy.py as saved by older commits (at each change of its fields): commit -> config
SAVED_CONFIGS = {commit: saved for commit, saved in json.loads(
    (REPO / "tests/saved_configs.json").read_text(encoding="utf-8")).items()
                 if commit != "_about"}


def lacking_an_old_run_default(saved: dict, current: dict) -> list[str]:
  """Fields of `current` that a run saved as `saved` lacks and that have no old-run value."""
  lacking = set(leaf_fields(current)) - set(leaf_fields(saved))
  return sorted(lacking - set(config_checks.ADDED_FIELDS)
                - set(config_checks.RENAMED_FIELDS.values()))


def unregistered_fields(config) -> list[str]:
  return sorted(set(leaf_fields(config)) - set(config_checks.FIELDS_BY_NAME))


def test_every_field_of_every_config_is_registered_once():
  names = [field.name for field in config_checks.FIELDS]
  assert len(names) == len(set(names))
  in_configs = set().union(*(leaf_fields(config) for config in CONFIGS.values()))
  assert unregistered_fields(CONFIGS["toy"]) == []
  assert sorted(in_configs - set(names)) == []
  live = {f.name for f in config_checks.FIELDS if f.removed is None}
  assert sorted(live - in_configs) == []  # nothing registered that no config has
  assert all(f.why for f in config_checks.FIELDS if f.on_resume != config_checks.FIXED)


def test_a_new_field_without_registration_or_old_run_default_fails_these_checks():
  from aiayn_flax.training import resume
  config = toy.get_config()
  config.model.a_field_added_today = 1
  assert unregistered_fields(config) == ["model.a_field_added_today"]
  newest = SAVED_CONFIGS[max(SAVED_CONFIGS, key=lambda commit: commit.split()[1])]
  assert lacking_an_old_run_default(newest, resume.config_dict(config)) == [
      "model.a_field_added_today"]


@pytest.mark.parametrize("commit", sorted(SAVED_CONFIGS))
def test_a_config_saved_by_an_older_commit_reads_and_resumes(commit):
  import ml_collections
  from aiayn_flax.training import resume
  saved = SAVED_CONFIGS[commit]
  current = resume.config_dict(toy.get_config())
  assert lacking_an_old_run_default(saved, current) == []
  # read as evaluate.py and translate.py read it (run_dir.load_config): every field, checked
  read = config_checks.read_saved(copy.deepcopy(saved))
  assert set(leaf_fields(read)) >= set(leaf_fields(current))
  config_checks.check_config(ml_collections.ConfigDict(read))
  # resumed with the values it had (its own command line today): no conflict
  own = {k: v for k, v in copy.deepcopy(read).items() if k not in resume.REMOVED_FIELDS}
  assert resume.resume_conflicts(copy.deepcopy(saved), own) == []
  # resumed with today's configs/toy.py: only values both have and differ, never a missing one
  conflicts = resume.resume_conflicts(copy.deepcopy(saved), current)
  assert not [c for c in conflicts if "None" in c], conflicts
  if commit.startswith("714fa3f"):  # the oldest: configs/toy.py's values changed since
    assert conflicts == [
        "dataset.bucket_min_length: 8 -> 12", "dataset.vocab_character_coverage: 1.0 -> 0.9995",
        "dataset.vocab_sample_sentences: 10000000 -> 4000000",
        "learning_rate_scale: 0.5 -> 0.125", "model.dtype: 'float32' -> 'auto'",
        "tokens_per_batch: 512 -> 420"]
  if commit.startswith("d62bca5"):  # saved with cooldown_steps=0, since removed
    assert saved["cooldown_steps"] == 0
    assert resume.resume_conflicts({**saved, "cooldown_steps": 100}, own) == [
        "cooldown_steps: 100 -> removed (resumes only where it was 0)"]


def test_fields_free_on_resume_leave_the_learning_rate_schedule_alone():
  """Under every value of every field with a list of values (a `schedule` field's too): a
  schedule that reads num_train_steps (a cosine decay) must make it FIXED (Field.fixed_when)."""
  from aiayn_flax import optimizer
  from aiayn_flax.training import resume
  for name, values in config_checks.VALUES.items():
    for value in values():
      config = toy.get_config()
      # in the warmup, after it, half way and near the end
      steps = np.array([1, config.warmup_steps + 1, config.num_train_steps // 2,
                        config.num_train_steps - 1])
      *section, key = name.split(".")
      (config[section[0]] if section else config)[key] = value
      before = optimizer.learning_rate_schedule(config)(steps)
      for free in sorted(config_checks.names_on_resume(config_checks.FREE,
                                                       resume.config_dict(config))):
        *section, key = free.split(".")
        block = config[section[0]] if section else config
        if isinstance(block[key], (int, float)) and not isinstance(block[key], bool):
          changed = copy.deepcopy(config)
          (changed[section[0]] if section else changed)[key] = 2 * block[key] + 3
          np.testing.assert_array_equal(optimizer.learning_rate_schedule(changed)(steps),
                                        before, err_msg=f"{free} with {name}={value!r}")


def test_a_field_fixed_when_the_saved_run_says_so(monkeypatch):
  """Field.fixed_when: FREE on resume, except in runs whose saved values make it matter."""
  import dataclasses
  from aiayn_flax.training import resume
  fields = tuple(dataclasses.replace(f, fixed_when=lambda saved: saved["seed"] == 7)
                 if f.name == "num_train_steps" else f for f in config_checks.FIELDS)
  monkeypatch.setattr(config_checks, "FIELDS", fields)
  saved = resume.config_dict(toy.get_config())
  longer = {**saved, "num_train_steps": saved["num_train_steps"] + 1}
  assert resume.resume_conflicts(saved, longer) == []
  saved_7, longer_7 = {**saved, "seed": 7}, {**longer, "seed": 7}
  assert resume.resume_conflicts(saved_7, longer_7) == [
      f"num_train_steps: {saved['num_train_steps']} -> {saved['num_train_steps'] + 1}"]


def test_removed_fields_are_ignored_and_added_fields_compare_with_their_old_value():
  from aiayn_flax.training import resume
  current = resume.config_dict(toy.get_config())
  saved = {**copy.deepcopy(current), "weight_decay": 0.0,
           "dataset": {**current["dataset"], "shuffle_buffer": 1000}}
  assert resume.resume_conflicts(saved, current) == []
  del saved["dataset"]["vocab_character_coverage"]  # saved before the field existed: 1.0
  assert resume.resume_conflicts(saved, current) == [
      "dataset.vocab_character_coverage: 1.0 -> 0.9995"]
  saved["dataset"]["vocab_character_coverage"] = 0.9995
  del saved["model"]["source_token_dropout_rate"]  # saved before the field existed: 0.0
  assert resume.resume_conflicts(saved, current) == []
  assert resume.resume_conflicts(saved, {**current, "model": {
      **current["model"], "source_token_dropout_rate": 0.1}}) == [
          "model.source_token_dropout_rate: 0.0 -> 0.1"]
  # evaluate.py and translate.py read such a run with the value it had in effect
  assert config_checks.with_added_fields(copy.deepcopy(saved))["model"] == current["model"]
  before_constraint = {k: v for k, v in copy.deepcopy(saved).items() if k != "decode_constrained"}
  assert config_checks.with_added_fields(before_constraint)["decode_constrained"] is True
  # how attention is computed may change (a run saved when "written_out" was the default)
  assert resume.resume_conflicts({**saved, "model": {
      **saved["model"], "attention_implementation": "written_out"}}, {**current, "model": {
          **current["model"], "attention_implementation": "auto"}}) == []
  saved["dataset"]["max_length"] += 1
  assert resume.resume_conflicts(saved, current) == [
      f"dataset.max_length: {current['dataset']['max_length'] + 1} -> "
      f"{current['dataset']['max_length']}"]


def test_data_dir_may_change_on_resume_only_where_the_batches_are_the_same():
  from aiayn_flax.training import resume
  saved = resume.config_dict(toy.get_config())
  current = {**saved, "dataset": {**saved["dataset"], "data_dir": "gs://bucket/tfds"}}
  assert resume.resume_conflicts(saved, current, same_batches=True) == []
  [conflict] = resume.resume_conflicts(saved, current)
  assert conflict.startswith("dataset.data_dir: '' -> 'gs://bucket/tfds' (may change where ")
  changed = {**current, "dataset": {**current["dataset"], "max_length": 7}}
  assert resume.resume_conflicts(saved, changed, same_batches=True) == [
      f"dataset.max_length: {saved['dataset']['max_length']} -> 7"]


@pytest.mark.slow
@pytest.mark.parametrize("override,message", [
    ("--config.num_train_steps=0", "config.num_train_steps=0: must be a positive integer"),
    ("--config.model.num_heads=3",
     "config.model.d_model=64: must be a multiple of model.num_heads=3 while model.qk_dim is 0 "
     "(d_model / num_heads per head); or set model.qk_dim"),
])
def test_a_bad_config_value_stops_train_py_with_one_line_naming_the_key(override, message,
                                                                        tmp_path):
  result = run_script("train.py", "--config=configs/toy.py", override,
                      f"--workdir={tmp_path / 'run'}")
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == f"train.py: error: {message}"
  assert not (tmp_path / "run").exists()  # stopped before anything was written


def test_config_checks_accept_every_shipped_config():
  from aiayn_flax import config_checks
  for config in CONFIGS.values():
    config_checks.check_config(config)  # raises on a bad value


def test_the_parallel_text_config_names_its_files_splits_and_languages():
  from aiayn_flax import config_checks
  from configs import parallel_text
  config = parallel_text.get_config("corpus/train.en.gz,corpus/train.de.gz,dev.en,dev.de")
  config_checks.check_config(config)
  assert (config.dataset.source_lang, config.dataset.target_lang) == ("en", "de")
  assert sorted(config.dataset.files) == ["train", "validation"]
  assert config.dataset.test_split == "validation"  # without test files: evaluate.py on dev
  assert config.dataset.files["train"] == (os.path.abspath("corpus/train.en.gz"),
                                           os.path.abspath("corpus/train.de.gz"))
  config = parallel_text.get_config("a.txt,b.txt,c.txt,d.txt,e.txt,f.txt")
  assert config.dataset.test_split == "test"
  assert (config.dataset.source_lang, config.dataset.target_lang) == ("source", "target")
  with pytest.raises(ValueError, match=r"expected TRAIN_SOURCE,TRAIN_TARGET,DEV_SOURCE,"
                                       r"DEV_TARGET\[,TEST_SOURCE,TEST_TARGET\] after the colon"):
    parallel_text.get_config("train.en,train.de")


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
