"""Config values checked before anything is built: a bad value stops the run at once with one
line naming its key, instead of training silently on something else (a `d_model` that
`num_heads` does not divide used to give heads of d_model // h, dropping the remainder).

FIELDS is the one registry of config fields: for each, its allowed values, the value that runs
saved before it existed had in effect, and whether it may change when a run resumes (and why).
Its default is the config's (configs/base.py, or the task's config for a task's own fields).
check_config, ADDED_FIELDS and training/resume.py's resume rules are derived from it, and
tests/test_config_fields.py checks it against every shipped config and against configs saved by
older commits (tests/saved_configs.json): a field added without its old-run default, or
not registered at all, fails there."""
import dataclasses
from typing import Any, Callable

# Where a field may be set when a run resumes: FIXED (the saved value, else the run refuses to
# resume), FREE (any value: it changes neither the model, the optimizer nor the batches), or
# SAME_BATCHES (any value where the batch plan saved with the checkpoint is the same).
FIXED, FREE, SAME_BATCHES = "fixed", "free", "same_batches"
IN_EVERY_RUN = object()  # old_run_default of a field that every saved run has
ANY = object()  # a removed field's value that resumes: any (it was never read)


@dataclasses.dataclass(frozen=True)
class Check:
  """ok(value, config) or the run stops with "config.KEY=VALUE: requirement"; KEY is the
  field's own unless `key` names another (a rule between two fields names the one to change)."""
  ok: Callable[[Any, Any], bool]
  requirement: str | Callable[[Any, Any], str]
  key: str = ""
  values: Callable[[], tuple] | None = None  # where the field takes one of a list of values


@dataclasses.dataclass(frozen=True)
class Field:
  name: str  # dotted: "model.d_model"
  checks: tuple[Check, ...] = ()
  old_run_default: Any = IN_EVERY_RUN  # the value runs saved before the field existed had
  on_resume: str = FIXED
  why: str = ""  # why it may change on resume, and what that depends on
  # FREE only where this is False of the saved config (a dict): e.g. a schedule that reads
  # num_train_steps makes that field FIXED in the runs that use it
  fixed_when: Callable[[dict], bool] | None = None
  removed: Any = None  # a field saved by older runs and gone: the value that resumes (or ANY)


def _one_of(values) -> Check:
  """The value is one of `values` (a tuple, or a function giving it, read when checked)."""
  listed = values if callable(values) else lambda: values
  return Check(lambda v, c: v in listed(), lambda v, c: f"must be one of {', '.join(listed())}",
               values=listed)


POSITIVE = Check(lambda v, c: v >= 1, "must be a positive integer")
UNIT = Check(lambda v, c: 0 <= v < 1, "must be in [0, 1)")


def _attention_requestable():
  from aiayn_flax.attention import backends  # the attention package imports this one's layer
  return backends.requestable()


def _fused(config) -> bool:
  return config.model.get("attention_implementation", "written_out") not in ("auto",
                                                                              "written_out")


def _head_size_of(config, key: str) -> int:
  return config.model[key] or config.model.d_model // config.model.num_heads  # head_dims


_MIX = lambda c: c.dataset.get("mix_split")  # noqa: E731
_DECODING = "how a run is decoded and scored, not how it trains"
_BOOKKEEPING = "when the run logs, evaluates or saves, not what it trains"
_WHERE = "where and how the same computation runs, not what it computes"
_FORM = ("the same function in other kernels (tests/test_gpu_step.py); a run that fell back from "
         "one (programs.py) resumes with either")
# The values of each GPU form's field (attention's: backends.requestable()).
FORM_VALUES = {"model.layer_norm_implementation": ("auto", "flax", "one_pass"),
               "loss_implementation": ("auto", "reductions", "fused"),
               "optimizer_implementation": ("auto", "per_array", "one_vector")}


F = Field
FIELDS = (
    F("name", on_resume=FREE, why="a label"),
    # the schedule (optimizer.learning_rate_schedule) does not read it: a schedule that does
    # makes this FIXED (tests/test_config_fields.py compares the schedule under two values)
    F("num_train_steps", (POSITIVE,), on_resume=FREE,
      why="the run's length: the learning-rate schedule does not read it"),
    F("tokens_per_batch", (POSITIVE,)),
    F("warmup_steps", (POSITIVE,)),
    F("log_every_steps", (POSITIVE,), on_resume=FREE, why=_BOOKKEEPING),
    F("keep_checkpoints", (POSITIVE,), on_resume=FREE, why=_BOOKKEEPING),
    F("average_last_checkpoints", (POSITIVE,), on_resume=FREE, why=_DECODING),
    F("beam_size", (POSITIVE,), on_resume=FREE, why=_DECODING),
    F("decode_batch_size", (POSITIVE,), on_resume=FREE, why=_DECODING),
    F("steps_per_call", (POSITIVE,), old_run_default=1),
    F("eval_every_steps", (Check(lambda v, c: v >= 0, "must be 0 (no evaluation while "
                                 "training: evaluate.py afterwards) or positive"),),
      on_resume=FREE, why=_BOOKKEEPING),
    F("checkpoint_every_steps", (Check(lambda v, c: v >= 0,
                                       "must be 0 (not by steps) or positive"),),
      on_resume=FREE, why=_BOOKKEEPING),
    F("checkpoint_every_minutes", (Check(
        lambda v, c: v >= 0 and (v > 0 or c.checkpoint_every_steps > 0),
        "must be >= 0, and positive where checkpoint_every_steps is 0 (else no checkpoint "
        "would be saved before the last step)"),), old_run_default=0.0,  # by steps only
      on_resume=FREE, why=_BOOKKEEPING),
    F("prefetch_batches", (Check(lambda v, c: v >= 0, "must be 0 (no prefetching) or "
                                 "positive"),), old_run_default=0,
      on_resume=FREE, why="the same batches, assembled on another thread"),
    F("micro_batch_tokens_per_device", (Check(lambda v, c: v >= 0,
                                              "must be 0 (no limit) or positive"),),
      old_run_default=0),  # the whole batch at once, as before accumulation existed
    F("device_memory_bytes", (Check(lambda v, c: v >= 0, "must be 0 (what the devices report) "
                                    "or a positive number of bytes per device"),),
      old_run_default=0, on_resume=FREE, why="planning only"),
    F("mfu", (Check(lambda v, c: 0 <= v <= 1, "must be in [0, 1] (0: measured where there is "
                    "a measurement, else 0.4)"),), old_run_default=0.0,
      on_resume=FREE, why="planning only"),
    F("learning_rate_scale", (Check(lambda v, c: v > 0, "must be positive"),)),
    F("label_smoothing", (UNIT,)),
    F("decode_extra_length", (Check(lambda v, c: v >= 0, "must be >= 0"),),
      on_resume=FREE, why=_DECODING),
    F("adam_b1"), F("adam_b2"), F("adam_eps"), F("seed"),
    F("max_consecutive_nonfinite_steps", old_run_default=20, on_resume=FREE,
      why="when a run gives up, not what it trains"),
    F("needs_accelerator", old_run_default=False, on_resume=FREE,
      why="a guard at start, read nowhere else"),
    F("device", old_run_default="", on_resume=FREE, why="planning only"),
    F("num_devices", old_run_default=0, on_resume=FREE, why="planning only"),
    F("checkpoint_asynchronously", old_run_default=False, on_resume=FREE, why=_BOOKKEEPING),
    F("eval_decode_sentences", on_resume=FREE, why=_DECODING),
    F("length_penalty_alpha", on_resume=FREE, why=_DECODING),
    F("decode_constrained", old_run_default=True, on_resume=FREE, why=_DECODING),
    F("compilation_cache_dir", old_run_default="off", on_resume=FREE,
      why="where compiled programs are kept"),
    F("host_local_batches", old_run_default=False, on_resume=FREE,
      why="the same batches, built by other hosts"),
    F("mesh"), F("fsdp", old_run_default=False),
    F("dcn_mesh", old_run_default="", on_resume=FREE, why="where devices sit, not what they do"),

    F("model.vocab_size", (POSITIVE,)),
    F("model.d_model", (POSITIVE,)),
    F("model.d_ff", (POSITIVE,)),
    F("model.num_heads", (POSITIVE,)),
    F("model.num_layers", (POSITIVE,)),
    *(F(f"model.{key}", (
        Check(lambda v, c: v >= 0, "must be 0 (d_model / num_heads) or positive"),
        Check(lambda v, c: v or c.model.d_model % c.model.num_heads == 0,
              lambda v, c, key=key: f"must be a multiple of model.num_heads={c.model.num_heads} "
              f"while model.{key} is 0 (d_model / num_heads per head); or set model.{key}",
              key="model.d_model")))
      for key in ("qk_dim", "v_dim")),
    F("model.dropout_rate", (UNIT,)),
    F("model.attention_dropout_rate", (UNIT,)),
    F("model.source_token_dropout_rate", (UNIT,), old_run_default=0.0),
    # How attention is computed, not what; "auto" resolves per device anyway, so a run saved
    # before "auto" became the default resumes
    F("model.attention_implementation", (
        _one_of(_attention_requestable),
        Check(lambda v, c: not _fused(c) or c.model.attention_dropout_rate == 0,
              lambda v, c: f"must be 0 with model.attention_implementation="
              f"{c.model.attention_implementation} (no attention dropout in the fused kernels)",
              key="model.attention_dropout_rate"),
        Check(lambda v, c: not _fused(c) or _head_size_of(c, "qk_dim") == _head_size_of(c,
                                                                                       "v_dim"),
              lambda v, c: f"must give the head size model.qk_dim={c.model.qk_dim} gives with "
              f"model.attention_implementation={c.model.attention_implementation} (its "
              "kernels take one head size)", key="model.v_dim")),
      old_run_default="written_out", on_resume=FREE, why=_FORM),
    # the GPU forms as they were before they became fields (2026-12-07)
    F("model.layer_norm_implementation", (_one_of(FORM_VALUES[
        "model.layer_norm_implementation"]),),
      old_run_default="auto", on_resume=FREE, why=_FORM),
    F("loss_implementation", (_one_of(FORM_VALUES["loss_implementation"]),),
      old_run_default="auto", on_resume=FREE, why=_FORM),
    F("optimizer_implementation", (_one_of(FORM_VALUES["optimizer_implementation"]),),
      old_run_default="auto", on_resume=FREE, why=_FORM),
    F("aligned_row_tokens", (Check(lambda v, c: v >= 0, "must be 0 (never) or a positive "
                                   "number of tokens"),),
      old_run_default=256, on_resume=FREE, why=_FORM),
    F("model.positions", (
        Check(lambda v, c: v in ("sinusoidal", "learned"), "must be 'sinusoidal' or 'learned'",
              values=lambda: ("sinusoidal", "learned")),
        Check(lambda v, c: v != "sinusoidal" or c.model.d_model % 2 == 0,
              "must be even for sinusoidal positions (sin and cos pairs)",
              key="model.d_model"))),
    F("model.max_positions"), F("model.pre_layer_norm"), F("model.dtype"),

    F("dataset.name"), F("dataset.source_lang"), F("dataset.target_lang"),
    F("dataset.train_split"), F("dataset.eval_split"),
    F("dataset.test_split", on_resume=FREE, why=_DECODING),
    F("dataset.data_dir", on_resume=SAME_BATCHES,
      why="where the prepared tfds data lives (a bucket in place of process 0's boot disk)"),
    F("dataset.vocab_model_type"), F("dataset.vocab_sample_sentences"),
    F("dataset.max_length", (Check(lambda v, c: v >= 2, "must be >= 2"),)),
    F("dataset.bucket_min_length", (Check(
        lambda v, c: 1 <= v <= c.dataset.max_length,
        lambda v, c: f"must be in [1, dataset.max_length={c.dataset.max_length}]"),)),
    F("dataset.bucket_growth", (Check(lambda v, c: v > 1, "must be > 1"),)),
    F("dataset.vocab_character_coverage", (Check(lambda v, c: 0 < v <= 1,
                                                 "must be in (0, 1]"),),
      old_run_default=1.0),
    F("dataset.bucket_quantum", (POSITIVE,)),
    F("dataset.subword_sampling_alpha", (
        Check(lambda v, c: not v or v > 0, "must be 0 (off) or positive"),
        Check(lambda v, c: not v or c.dataset.subword_sampling_nbest == -1
              or c.dataset.subword_sampling_nbest > 1,
              "must be -1 (a word's whole lattice) or above 1",
              key="dataset.subword_sampling_nbest"),
        Check(lambda v, c: not v or c.dataset.subword_sampling_sides in ("both", "source",
                                                                        "target"),
              "must be 'both', 'source' or 'target'", key="dataset.subword_sampling_sides"),
        Check(lambda v, c: not v or (c.dataset.vocab_model_type == "unigram"
                                     and c.dataset.name != "toy_reverse"),
              lambda v, c: "must be 'unigram' (a SentencePiece lattice to sample from) with "
              f"dataset.subword_sampling_alpha={v}", key="dataset.vocab_model_type")),
      old_run_default=0.0),
    F("dataset.subword_sampling_nbest", old_run_default=-1),
    F("dataset.subword_sampling_sides", old_run_default="both"),
    F("dataset.pad_each_side", old_run_default=False),
    F("dataset.mix_split", (
        Check(lambda v, c: not v or c.dataset.mix_ratio > 0,
              lambda v, c: f"must be > 0 with dataset.mix_split={v!r}", key="dataset.mix_ratio"),
        Check(lambda v, c: not v or c.dataset.mix_epochs >= 0, "must be >= 0 (0: every epoch)",
              key="dataset.mix_epochs"),
        Check(lambda v, c: not v or v not in (c.dataset.train_split, c.dataset.eval_split),
              "must differ from the train and eval splits")),
      old_run_default=""),
    F("dataset.mix_ratio", old_run_default=0.0), F("dataset.mix_epochs", old_run_default=0),
    F("dataset.silver_files", old_run_default=""),
    F("dataset.silver_min_agreement", old_run_default=0.0),
    F("dataset.silver_min_log_prob_per_word", old_run_default=-100.0),
    # a task's own (configs/toy.py, configs/parsing.py)
    F("dataset.toy_train_examples"), F("dataset.toy_eval_examples"),
    F("dataset.toy_min_symbols"), F("dataset.tree_leaves"), F("dataset.treebank_dir"),

    # gone: never read, or renamed
    F("weight_decay", removed=ANY), F("dataset.shuffle_buffer", removed=ANY),
    F("eval_bleu_sentences", removed=ANY),  # renamed eval_decode_sentences
    # a linear cooldown, reverted the same day (08334c6): a run saved with it off resumes
    F("cooldown_steps", removed=0),
)
FIELDS_BY_NAME = {field.name: field for field in FIELDS}
# The fields that take one of a list of values: name -> a function giving them
VALUES = {f.name: check.values for f in FIELDS for check in f.checks if check.values}

# Fields renamed since: a config (or a --config.OLD=... flag) that still names one stops with
# the new name, instead of setting a field nothing reads.
RENAMED_FIELDS = {"eval_bleu_sentences": "eval_decode_sentences"}
# Fields added since, with the value that runs saved before them had in effect (a saved run
# is read, and resumed, as if it had them).
ADDED_FIELDS = {f.name: f.old_run_default for f in FIELDS
                if f.old_run_default is not IN_EVERY_RUN and f.removed is None}


def names_on_resume(rule: str, saved: dict | None = None) -> frozenset[str]:
  """The fields that resume under `rule` (FREE, SAME_BATCHES); training/resume.py's sets.
  With `saved` (a saved config), less those its values make FIXED (Field.fixed_when)."""
  return frozenset(f.name for f in FIELDS if f.on_resume == rule and f.removed is None
                   and not (saved is not None and f.fixed_when and f.fixed_when(saved)))


def removed_fields() -> dict:
  """Fields older runs saved that are gone: name -> the saved value that resumes (or ANY)."""
  return {f.name: f.removed for f in FIELDS if f.removed is not None}


def with_added_fields(saved: dict) -> dict:
  """A saved config (nested dicts, changed in place) with the ADDED_FIELDS it lacks."""
  for name, value in ADDED_FIELDS.items():
    *parents, key = name.split(".")
    block = saved
    for parent in parents:
      block = block[parent]
    block.setdefault(key, value)
  return saved


def read_saved(saved: dict) -> dict:
  """A saved run's config (nested dicts, changed in place) as today's code reads it: renamed
  fields under their new names, added ones with the values the run had in effect."""
  for old, new in RENAMED_FIELDS.items():  # a run saved before the rename
    if old in saved:
      saved[new] = saved.pop(old)
  return with_added_fields(saved)


def renamed_field_message(name: str) -> str | None:
  if name in RENAMED_FIELDS:
    return f"config.{name} was renamed config.{RENAMED_FIELDS[name]}: set that instead"
  return None


def _value(config, name: str):
  """The field's value; its old-run default where the config lacks it (a saved run's); None
  where it has neither (a task's own field in another task's config)."""
  *parents, key = name.split(".")
  block = config
  for parent in parents:
    block = block.get(parent) or {}
  return block.get(key, ADDED_FIELDS.get(name))


def check_config(config) -> None:
  """Raises ValueError("config.KEY=VALUE: what it must be") for the first bad value, in
  FIELDS' order."""
  for name in RENAMED_FIELDS:
    if name in config:
      raise ValueError(renamed_field_message(name))
  for field in FIELDS:
    value = _value(config, field.name)
    if value is None:
      continue
    for check in field.checks:
      if not check.ok(value, config):
        key = check.key or field.name
        shown = value if not check.key else _value(config, key)
        requirement = check.requirement
        if callable(requirement):
          requirement = requirement(value, config)
        raise ValueError(f"config.{key}={shown!r}: {requirement}")
