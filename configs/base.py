"""Transformer base on WMT14 EN->DE: Vaswani et al. (2017), Table 3 row "base".

Every hyper-parameter of the run lives here; override any of them on the command line with
`--config.key=value` (e.g. `--config.model.dropout_rate=0.2`). Table 3's variations (A)-(E)
are selectable by name: `--config=configs/base.py:B16` (see `TABLE3_ROWS`).
"""
import ml_collections

# Table 3 rows: name -> overrides of the base model (and label smoothing for row D).
# Paper's parameter counts (x10^6) are in the trailing comments, for docs/TRAIN.md's table.
TABLE3_ROWS = {
    "A1": dict(num_heads=1, qk_dim=512, v_dim=512),  # 65M
    "A4": dict(num_heads=4, qk_dim=128, v_dim=128),  # 65M
    "A16": dict(num_heads=16, qk_dim=32, v_dim=32),  # 65M
    "A32": dict(num_heads=32, qk_dim=16, v_dim=16),  # 65M
    "B16": dict(qk_dim=16),  # 58M
    "B32": dict(qk_dim=32),  # 60M
    "C2": dict(num_layers=2),  # 36M
    "C4": dict(num_layers=4),  # 50M
    "C8": dict(num_layers=8),  # 80M
    "C256": dict(d_model=256, qk_dim=32, v_dim=32),  # 28M
    "C1024": dict(d_model=1024, qk_dim=128, v_dim=128),  # 168M
    "C1024ff": dict(d_ff=1024),  # 53M
    "C4096ff": dict(d_ff=4096),  # 90M
    "D0.0": dict(dropout_rate=0.0),
    "D0.2": dict(dropout_rate=0.2),
    "Dls0.0": dict(label_smoothing=0.0),
    "Dls0.2": dict(label_smoothing=0.2),
    "E": dict(positions="learned"),
}
PAPER_PARAMS_MILLIONS = {
    "base": 65, "big": 213, "A1": 65, "A4": 65, "A16": 65, "A32": 65, "B16": 58, "B32": 60,
    "C2": 36, "C4": 50, "C8": 80, "C256": 28, "C1024": 168, "C1024ff": 53, "C4096ff": 90,
}


def model_config(**overrides):
  """The paper's base model (section 3). `qk_dim`/`v_dim` are per-head d_k/d_v (0: d_model/h)."""
  model = ml_collections.ConfigDict(dict(
      vocab_size=37000,  # one shared SentencePiece vocabulary for EN and DE (section 5.1)
      d_model=512,
      d_ff=2048,
      num_heads=8,
      qk_dim=0,
      v_dim=0,
      num_layers=6,  # N, for the encoder and the decoder stacks alike
      dropout_rate=0.1,  # P_drop: sublayer outputs and embeddings + positions (5.4)
      attention_dropout_rate=0.0,  # not in the paper; tensor2tensor's option
      # training's attention (aiayn_flax/attention/backends.py; docs/TRAIN.md's table of
      # forms): "auto" (per call, the best form that serves it: Pallas's Triton kernels on one
      # GPU of compute capability >= 8.0 where its shared memory suffices, else written out),
      # "written_out" (equation 1 as jnp ops, on every backend), "pallas", or
      # jax.nn.dot_product_attention with implementation "cudnn" (a fused kernel, GPUs only,
      # to be decided on a GPU) or "xla"; inference and decoding always write it out
      attention_implementation="auto",
      # the residual blocks' layer norm: "auto" (its backward written out on a GPU,
      # flax.linen.LayerNorm's operations elsewhere), "flax" or "one_pass" everywhere
      layer_norm_implementation="auto",
      # not in the paper: the share of source tokens replaced by <unk> in training (word
      # dropout on the input, as parsers trained on small treebanks use it)
      source_token_dropout_rate=0.0,
      positions="sinusoidal",  # or "learned" (Table 3 row E)
      max_positions=1024,  # size of the learned position table (row E only)
      pre_layer_norm=False,  # the paper is post-LN: LayerNorm(x + Dropout(Sublayer(x)))
      # compute dtype: "auto" is bfloat16 (f32 parameters, softmax and loss) where the device
      # has bf16 units (TPU, A100, L4, H100), float32 elsewhere (CPU, V100, T4); or say which
      dtype="auto",
  ))
  model.update(overrides)
  return model


def get_config(row: str = ""):
  c = ml_collections.ConfigDict()
  c.name = "base" + (f":{row}" if row else "")

  # Data: WMT14 EN->DE through tfds (section 5.1): wmt14_translate/de-en is read EN->DE by
  # feature name. Its train split is Europarl v7 + Common Crawl + News Commentary v9 (4.5M
  # pairs), "validation" is newstest2013 (3000) and "test" newstest2014 (3003).
  c.dataset = ml_collections.ConfigDict(dict(
      name="wmt14_translate/de-en",
      source_lang="en",
      target_lang="de",
      train_split="train",
      eval_split="validation",
      test_split="test",
      data_dir="",  # tfds data_dir; "" uses tfds' default
      vocab_model_type="bpe",
      # Sentences (both sides) the vocabulary is trained on, drawn uniformly from all of them
      # (WMT14 EN-DE has 9M): a few million settle the pieces of every frequent word, while
      # SentencePiece's time and memory grow with the sample (docs/PERFORMANCE.md, start-up).
      vocab_sample_sentences=4_000_000,
      # Common Crawl brings stray characters of many scripts: the rarest 0.05% of character
      # occurrences are spelled in byte pieces rather than each taking a vocabulary slot.
      vocab_character_coverage=0.9995,
      max_length=256,  # training pairs longer than this (in subwords, either side) are filtered
      bucket_min_length=8,  # boundaries grow geometrically from here to max_length
      bucket_growth=1.25,
      bucket_quantum=8,  # boundaries are multiples of this
      # Both sides padded to the bucket's boundary (translation: sentence pairs of similar
      # lengths); True pads each side to its own (data/bucketing.py; parsing's trees are
      # about twice their sentences).
      pad_each_side=False,
      # A second split of the dataset mixed into training (parsing: "silver", trees from a
      # teacher; data/bucketing.Mix): mix_ratio of its examples per training example in each
      # epoch, for the first mix_epochs epochs (0: all of them), then the training split alone.
      mix_split="",
      mix_ratio=0.0,
      mix_epochs=0,
      # Subword regularization (data/subword_sampling.py; Kudo 2018): each training epoch's
      # pairs segmented anew, sampled from the unigram vocabulary's whole lattice with
      # probability P(segmentation)^alpha, a function of (seed, epoch); 0 is off, the plain
      # segmentation (the paper's). Lower alpha samples more widely (0.1-0.5 in Kudo's paper).
      # nbest: -1 samples a word's whole lattice, n > 1 among its n most probable
      # segmentations. sides: "both", "source" or "target". docs/TRAIN.md.
      subword_sampling_alpha=0.0,
      subword_sampling_nbest=-1,
      subword_sampling_sides="both",
      # Parsing's silver trees (python -m aiayn_flax.parsing.silver), the split "silver" that
      # configs/parsing_silver.py mixes in: comma-separated .silver.jsonl files, and the
      # confidences a tree needs (0 / -100: no threshold; chosen on validation). Here so that
      # every run's config has them (a resumed run compares its fields with the saved ones).
      silver_files="",
      silver_min_agreement=0.0,
      silver_min_log_prob_per_word=-100.0,
  ))

  c.model = model_config()
  label_smoothing = 0.1  # epsilon_ls (section 5.4)

  # Optimizer (section 5.3): Adam(0.9, 0.98, 1e-9), lr = scale * d^-0.5 * min(s^-0.5, s*w^-1.5).
  c.learning_rate_scale = 1.0
  c.warmup_steps = 4000
  c.adam_b1 = 0.9
  c.adam_b2 = 0.98
  c.adam_eps = 1e-9
  c.label_smoothing = label_smoothing

  # The training step's GPU forms (docs/TRAIN.md's table): "auto" takes each where it is
  # compiled for a GPU and the plain form on a CPU or TPU. A form that fails to compile on the
  # local GPU falls back to its plain form with one warning (programs.py). The loss: "fused"
  # (one pass over the logits) or "reductions"; the optimizer's finite check and gradient norm:
  # "one_vector" (over all gradients at once) or "per_array" (optax's); empty rows appended to
  # a batch on one GPU so that rows x length is a multiple of this many tokens (0: never).
  c.loss_implementation = "auto"
  c.optimizer_implementation = "auto"
  c.aligned_row_tokens = 256

  # Batching (5.1): about 25000 source and 25000 target tokens per optimizer step.
  c.tokens_per_batch = 25000
  c.num_train_steps = 100_000  # 12 hours on 8 P100 (5.2)

  # The paper's scale: train.py refuses to train it on the CPU backend (a TPU VM or GPU host
  # with CPU-only jax) unless --config.device=cpu says that is intended.
  c.needs_accelerator = True
  c.seed = 0
  c.max_consecutive_nonfinite_steps = 20  # skipped NaN/Inf updates in a row before stopping
  c.log_every_steps = 100
  c.eval_every_steps = 5000  # and at the end; 0: none while training (evaluate.py afterwards)
  # "Checkpoints written at 10-minute intervals" (6.1), by the clock: a step count would save
  # every few seconds on a fast accelerator (600 steps of big are 14 s on a v4-32). Steps
  # instead: --config.checkpoint_every_minutes=0 --config.checkpoint_every_steps=N (both set:
  # a checkpoint when either is due). The kept checkpoints' bytes: train.py --dry_run --workdir.
  c.checkpoint_every_minutes = 10.0
  c.checkpoint_every_steps = 0  # 0: not by steps
  c.checkpoint_asynchronously = True  # training goes on while orbax writes
  c.keep_checkpoints = 5
  # Validation sentences greedy-decoded at each evaluation for the task's metric (BLEU; a
  # parser's F1). Was eval_bleu_sentences.
  c.eval_decode_sentences = 1000

  # Decoding and scoring (section 6.1): beam 4, alpha 0.6, max length input + 50, last 5 averaged.
  c.beam_size = 4
  c.length_penalty_alpha = 0.6
  c.decode_extra_length = 50
  c.average_last_checkpoints = 5
  # Sentences per decoding batch on each device (a batch holds this x the devices' sentences,
  # as Flax WMT's eval_per_device_batch_size and MaxText's per_device_batch_size count):
  # training's validation BLEU, evaluate.py and translate.py (their --batch_size too).
  c.decode_batch_size = 64
  # A parser's decoder writes only trees over the input's words (aiayn_flax/parsing/
  # constrained.py); False: plain beam search, the output repaired into a tree afterwards, as
  # the paper and Vinyals et al. (2015) did. Translation has no constraint.
  c.decode_constrained = True

  c.mesh = "data:-1"  # mesh axes and sizes, e.g. "data:4,model:2"; -1: the remaining devices
  # Several slices (TPU multislice; GPU nodes, each its own slice for XLA) joined by a slower
  # network (DCN, InfiniBand): how many slices each mesh axis spans, e.g. "data:2" (data
  # parallel across 2 slices, config.mesh's sizes being the whole run's); "": the data axis
  # across every slice there is. Only the gradient all-reduce then crosses the slower network.
  c.dcn_mesh = ""
  c.fsdp = False  # also shard every parameter's d_model axis over `data`
  # Gradient accumulation: each device processes at most this many tokens per side per
  # micro-batch; the number of micro-batches per optimizer step follows from tokens_per_batch
  # and the number of data-parallel devices. 0: the trainer chooses at start, compiling the
  # step for its devices: the whole batch where it fits, else the fewest micro-batches that
  # fit (one log line says which; aiayn_flax/planning/fit.py). A value given here wins.
  c.micro_batch_tokens_per_device = 0
  # The memory per device that choice may fill, in bytes: 0 is what jax's allocator may hold
  # on each (75% of a GPU); CPU devices report none, so nothing is chosen there without it.
  c.device_memory_bytes = 0
  # Optimizer steps per call of the compiled step (needs micro_batch_tokens_per_device = 0).
  # Above 1, each length bucket's batches come in runs of this many, shuffled as runs, and a
  # run is trained in one loop on the device: on CPU that reuses XLA's temporaries instead of
  # fresh memory at every step (base steps 9-13% faster on 2 cores), but it changes the batch
  # order. On Multi30k that order cost no BLEU (configs/multi30k.py uses 4; its control run
  # with 1 scored the same, docs/RESULTS.md); at WMT scale it is not measured, so 1 (the
  # plain shuffle) stays the default here.
  c.steps_per_call = 1
  # Training batches assembled ahead on a background thread (0: on the training thread); the
  # same batches either way (bench/input_pipeline.py measures the assembly).
  c.prefetch_batches = 2
  # Several hosts: each builds only the rows of a batch that its own devices hold (False:
  # every host builds every row and keeps its share, as before; the same batches either way,
  # a multiple of the host memory and time, kept to check that both agree).
  c.host_local_batches = True
  # JAX's persistent compilation cache (aiayn_flax/runtime/compilation_cache.py): "" is
  # $JAX_COMPILATION_CACHE_DIR when set, else WORKDIR/xla_cache; a folder or gs:// path;
  # "off" compiles everything at every start.
  c.compilation_cache_dir = ""

  # Planning only (train.py --dry_run, python -m aiayn_flax.planning.dry_run --table;
  # docs/SCALE.md):
  # the hardware the plan is for and the model FLOPs utilisation assumed for its step time.
  c.device = ""  # "": the local devices; or a kind of devices.py: tpu_v3, tpu_v4, v100, h100...
  c.num_devices = 0  # 0: all local devices, or the device kind's standard host (tpu_v3: 8)
  # 0: measured for this model and device where there is a measurement (base on one H200,
  # docs/RESULTS.md), else 0.4 assumed; the plan says which (mfu_source)
  c.mfu = 0.0

  if row:
    if row not in TABLE3_ROWS:
      raise ValueError(f"configs/base.py: unknown Table 3 row {row!r}; known: {sorted(TABLE3_ROWS)}")
    overrides = dict(TABLE3_ROWS[row])
    if "label_smoothing" in overrides:
      c.label_smoothing = overrides.pop("label_smoothing")
    c.model.update(overrides)
    # Section 6.2 scores the rows on newstest2013 with beam search and no checkpoint
    # averaging: evaluate.py's defaults for a row's workdir.
    c.dataset.test_split = "validation"
    c.average_last_checkpoints = 1
  return c
