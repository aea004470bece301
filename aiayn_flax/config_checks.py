"""Config values checked before anything is built: a bad value stops the run at once with one
line naming its key, instead of training silently on something else (a `d_model` that
`num_heads` does not divide used to give heads of d_model // h, dropping the remainder)."""


# Fields renamed since: a config (or a --config.OLD=... flag) that still names one stops with
# the new name, instead of setting a field nothing reads.
RENAMED_FIELDS = {"eval_bleu_sentences": "eval_decode_sentences"}
# Fields added since, with the value that runs saved before them had in effect (a saved run
# is read, and resumed, as if it had them).
ADDED_FIELDS = {"dataset.vocab_character_coverage": 1.0, "host_local_batches": False,
                "model.source_token_dropout_rate": 0.0, "decode_constrained": True,
                "dataset.pad_each_side": False, "dataset.mix_split": "",
                "dataset.mix_ratio": 0.0, "dataset.mix_epochs": 0, "dataset.silver_files": "",
                "dataset.silver_min_agreement": 0.0,
                "dataset.silver_min_log_prob_per_word": -100.0,
                "model.attention_implementation": "written_out", "device_memory_bytes": 0,
                "dataset.subword_sampling_alpha": 0.0, "dataset.subword_sampling_nbest": -1,
                "dataset.subword_sampling_sides": "both",
                # the GPU forms as they were before they became fields (2026-12-07)
                "model.layer_norm_implementation": "auto", "loss_implementation": "auto",
                "optimizer_implementation": "auto", "aligned_row_tokens": 256}
# The values of each GPU form's field (attention's: backends.requestable()).
FORM_VALUES = {"model.layer_norm_implementation": ("auto", "flax", "one_pass"),
               "loss_implementation": ("auto", "reductions", "fused"),
               "optimizer_implementation": ("auto", "per_array", "one_vector")}


def with_added_fields(saved: dict) -> dict:
  """A saved config (nested dicts, changed in place) with the ADDED_FIELDS it lacks."""
  for name, value in ADDED_FIELDS.items():
    *parents, key = name.split(".")
    block = saved
    for parent in parents:
      block = block[parent]
    block.setdefault(key, value)
  return saved


def renamed_field_message(name: str) -> str | None:
  if name in RENAMED_FIELDS:
    return f"config.{name} was renamed config.{RENAMED_FIELDS[name]}: set that instead"
  return None


def _check(ok: bool, key: str, value, requirement: str) -> None:
  if not ok:
    raise ValueError(f"config.{key}={value!r}: {requirement}")


def check_config(config) -> None:
  """Raises ValueError("config.KEY=VALUE: what it must be") for the first bad value."""
  for name in RENAMED_FIELDS:
    if name in config:
      raise ValueError(renamed_field_message(name))
  for key in ("num_train_steps", "tokens_per_batch", "warmup_steps", "log_every_steps",
              "keep_checkpoints",
              "average_last_checkpoints", "beam_size", "decode_batch_size", "steps_per_call"):
    _check(config[key] >= 1, key, config[key], "must be a positive integer")
  _check(config.eval_every_steps >= 0, "eval_every_steps", config.eval_every_steps,
         "must be 0 (no evaluation while training: evaluate.py afterwards) or positive")
  _check(config.checkpoint_every_steps >= 0, "checkpoint_every_steps",
         config.checkpoint_every_steps, "must be 0 (not by steps) or positive")
  minutes = config.get("checkpoint_every_minutes", 0)
  _check(minutes >= 0 and (minutes > 0 or config.checkpoint_every_steps > 0),
         "checkpoint_every_minutes", minutes,
         "must be >= 0, and positive where checkpoint_every_steps is 0 (else no checkpoint "
         "would be saved before the last step)")
  _check(config.prefetch_batches >= 0, "prefetch_batches", config.prefetch_batches,
         "must be 0 (no prefetching) or positive")
  _check(config.micro_batch_tokens_per_device >= 0, "micro_batch_tokens_per_device",
         config.micro_batch_tokens_per_device, "must be 0 (no limit) or positive")
  _check(config.get("device_memory_bytes", 0) >= 0, "device_memory_bytes",
         config.get("device_memory_bytes", 0), "must be 0 (what the devices report) or a "
         "positive number of bytes per device")
  _check(0 <= config.get("mfu", 0.0) <= 1, "mfu", config.get("mfu", 0.0),
         "must be in [0, 1] (0: measured where there is a measurement, else 0.4)")
  _check(config.learning_rate_scale > 0, "learning_rate_scale", config.learning_rate_scale,
         "must be positive")
  _check(0 <= config.label_smoothing < 1, "label_smoothing", config.label_smoothing,
         "must be in [0, 1)")
  _check(config.decode_extra_length >= 0, "decode_extra_length", config.decode_extra_length,
         "must be >= 0")

  model = config.model
  for key in ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers"):
    _check(model[key] >= 1, f"model.{key}", model[key], "must be a positive integer")
  for key in ("qk_dim", "v_dim"):
    _check(model[key] >= 0, f"model.{key}", model[key], "must be 0 (d_model / num_heads) or "
           "positive")
    _check(model[key] or model.d_model % model.num_heads == 0, "model.d_model", model.d_model,
           f"must be a multiple of model.num_heads={model.num_heads} while model.{key} is 0 "
           f"(d_model / num_heads per head); or set model.{key}")
  for key in ("dropout_rate", "attention_dropout_rate", "source_token_dropout_rate"):
    _check(0 <= model[key] < 1, f"model.{key}", model[key], "must be in [0, 1)")
  from aiayn_flax.attention import backends
  implementation = model.get("attention_implementation", "written_out")
  requestable = backends.requestable()
  _check(implementation in requestable, "model.attention_implementation", implementation,
         f"must be one of {', '.join(requestable)}")
  fused = implementation not in ("auto", "written_out")
  _check(not fused or model.attention_dropout_rate == 0,
         "model.attention_dropout_rate", model.attention_dropout_rate,
         f"must be 0 with model.attention_implementation={implementation} (no attention dropout "
         "in the fused kernels)")
  per_head = model.d_model // model.num_heads  # what 0 means (attention.head_dims)
  _check(not fused or (model.qk_dim or per_head) == (model.v_dim or per_head),
         "model.v_dim", model.v_dim, f"must give the head size model.qk_dim={model.qk_dim} "
         f"gives with model.attention_implementation={implementation} (its kernels take one "
         "head size)")
  for key, values in FORM_VALUES.items():
    value = config.model.get(key[6:]) if key.startswith("model.") else config.get(key)
    value = ADDED_FIELDS[key] if value is None else value
    _check(value in values, key, value, f"must be one of {', '.join(values)}")
  _check(config.get("aligned_row_tokens", 256) >= 0, "aligned_row_tokens",
         config.get("aligned_row_tokens", 256), "must be 0 (never) or a positive number of tokens")
  _check(model.positions in ("sinusoidal", "learned"), "model.positions", model.positions,
         "must be 'sinusoidal' or 'learned'")
  _check(model.positions != "sinusoidal" or model.d_model % 2 == 0, "model.d_model",
         model.d_model, "must be even for sinusoidal positions (sin and cos pairs)")

  dataset = config.dataset
  _check(dataset.max_length >= 2, "dataset.max_length", dataset.max_length, "must be >= 2")
  _check(1 <= dataset.bucket_min_length <= dataset.max_length, "dataset.bucket_min_length",
         dataset.bucket_min_length, f"must be in [1, dataset.max_length={dataset.max_length}]")
  _check(dataset.bucket_growth > 1, "dataset.bucket_growth", dataset.bucket_growth,
         "must be > 1")
  _check(0 < dataset.vocab_character_coverage <= 1, "dataset.vocab_character_coverage",
         dataset.vocab_character_coverage, "must be in (0, 1]")
  _check(dataset.bucket_quantum >= 1, "dataset.bucket_quantum", dataset.bucket_quantum,
         "must be a positive integer")
  if alpha := dataset.get("subword_sampling_alpha", 0.0):
    _check(alpha > 0, "dataset.subword_sampling_alpha", alpha, "must be 0 (off) or positive")
    _check(dataset.subword_sampling_nbest == -1 or dataset.subword_sampling_nbest > 1,
           "dataset.subword_sampling_nbest", dataset.subword_sampling_nbest,
           "must be -1 (a word's whole lattice) or above 1")
    _check(dataset.subword_sampling_sides in ("both", "source", "target"),
           "dataset.subword_sampling_sides", dataset.subword_sampling_sides,
           "must be 'both', 'source' or 'target'")
    _check(dataset.vocab_model_type == "unigram" and dataset.name != "toy_reverse",
           "dataset.vocab_model_type", dataset.vocab_model_type, "must be 'unigram' (a "
           "SentencePiece lattice to sample from) with dataset.subword_sampling_alpha="
           f"{alpha}")
  if dataset.get("mix_split"):
    _check(dataset.mix_ratio > 0, "dataset.mix_ratio", dataset.mix_ratio,
           f"must be > 0 with dataset.mix_split={dataset.mix_split!r}")
    _check(dataset.mix_epochs >= 0, "dataset.mix_epochs", dataset.mix_epochs,
           "must be >= 0 (0: every epoch)")
    _check(dataset.mix_split not in (dataset.train_split, dataset.eval_split),
           "dataset.mix_split", dataset.mix_split, "must differ from the train and eval splits")
