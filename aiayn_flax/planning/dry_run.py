"""`train.py --dry_run`: the run's plan, computed from the config alone (nothing allocated).

By default the plan is for the local devices. `--config.device=KIND` plans for one of the
kinds in `aiayn_flax/devices.py` (tpu_v3, tpu_v4, v100, a100, h100, p100, ...) on its standard
host, or on `--config.num_devices` of them. The model FLOPs utilisation (MFU) that turns FLOPs
into time is `--config.mfu` when given, else the one measured for that model and device where
there is one (MEASURED_STEPS: base on one H200), else 0.4 assumed; the plan says which
(`mfu_source`).

Memory, per device:
- state: f32 parameters, f32 gradients and Adam's two f32 moments (16 bytes per parameter),
  plus an f32 gradient accumulator when accumulating and a 16-bit copy of the parameters in
  bf16 runs, divided by the size of the mesh's `model` axis;
- activations: micro-batch tokens x `activation_bytes_per_token` (the model stated there),
  counted at the longest bucket, the worst case: a batch holds a fixed number of tokens
  whatever its length, and only the attention probabilities grow with the length.
Tokens here are padded slots: `tokens_per_batch` real tokens per side are batched within
bucketing.padded_budget(tokens_per_batch) slots (1.25x), and memory is planned for that budget.
The micro-batch is the most slots that fit in (usable memory - state); accumulation steps
make up the rest of the budget (an estimate: the trainer compiles the step at start and
chooses the accumulation that fits, planning/fit.py, trying this one first):
  data-parallel devices x micro_batch_tokens x accumulation_steps >= padded budget.

`python -m aiayn_flax.planning.dry_run --table` prints docs/SCALE.md's table (base and big on
TPU v3-8, v4-8, v5e-8, 8 x V100, 8 x A100, 8 and 1 x H100, beside the paper's 8 x P100), with
the memory XLA reported for the rows compiled with `train.py --dry_run --target=...`
(compiled_plan.py). `--target` also prints this plan for the target's devices.
"""
import math

import jax

from aiayn_flax import devices, sharding
from aiayn_flax.planning import flops, kernel_census
from aiayn_flax.data import bucketing
from aiayn_flax.model import head_dims

ADAM_MOMENTS = 2  # optax.adam keeps mu and nu, both f32
F32_BYTES = 4

# Section 5.2: "each training step took about 0.4 seconds ... 100,000 steps or 12 hours"
# (base); "step time was 1.0 seconds ... 300,000 steps (3.5 days)" (big); 8 NVIDIA P100.
PAPER_STEP_SECONDS = {"base": 0.4, "big": 1.0}
PAPER_TRAINING_TIME = {"base": "12 h", "big": "3.5 days"}


def compute_bytes(dtype: str) -> int:
  return 2 if dtype in ("bfloat16", "float16") else 4


def activation_bytes_per_token(model, length: int, model_shards: int = 1) -> int:
  """Bytes a training step keeps for the backward pass per token of its micro-batch (one
  source and one target token, in rows padded to `length`). An estimate, not a measurement:

  - per encoder layer and source token, in the compute dtype: the layer input, Q, K and V,
    the attention context, both LayerNorm inputs and the first one's output, the FFN hidden
    layer; f32 attention probabilities (heads x length); 1-byte dropout masks on the two
    sublayer outputs;
  - per decoder layer and target token: the same for self-attention and the FFN, plus
    cross-attention's query, context, LayerNorm input and output, f32 probabilities and
    mask, and the keys and values it computes from each source token;
  - embeddings + positions after dropout (and masks) on both sides, the decoder output, and
    f32 logits with their gradient (8 x vocab bytes per target token: the largest term for
    the paper's models at short lengths).
  Tensor parallelism divides the head-, d_ff- and vocabulary-sized tensors by the `model`
  axis size; the d_model-sized ones stay whole on every device.
  """
  d, f, h, n, vocab = model.d_model, model.d_ff, model.num_heads, model.num_layers, model.vocab_size
  k, v = head_dims(model)
  b = compute_bytes(model.dtype)
  qkv, context = h * (2 * k + v), h * v
  encoder_whole = b * 4 * d + 2 * d
  encoder_split = b * (qkv + context + f) + F32_BYTES * h * length
  decoder_whole = b * 6 * d + 3 * d
  decoder_split = (b * (qkv + context + h * k + context + f + h * (k + v))
                   + 2 * F32_BYTES * h * length)
  embeddings_and_output = 2 * (b * d + d) + b * d
  logits = 2 * F32_BYTES * vocab
  whole = n * (encoder_whole + decoder_whole) + embeddings_and_output
  split = n * (encoder_split + decoder_split) + logits
  return whole + math.ceil(split / model_shards)


def state_bytes(parameters: int, dtype: str, accumulating: bool) -> dict[str, int]:
  """Bytes of the training state (whole, before any tensor-parallel split): f32 parameters,
  Adam's moments, f32 gradients (twice when an accumulator sums micro-batches), and the
  16-bit copy of the parameters that a bf16 step computes with."""
  return {"parameter_bytes": F32_BYTES * parameters,
          "optimizer_state_bytes": ADAM_MOMENTS * F32_BYTES * parameters,
          "gradient_bytes": F32_BYTES * parameters * (2 if accumulating else 1),
          "compute_copy_bytes": 2 * parameters if compute_bytes(dtype) == 2 else 0}


def target_devices(config) -> tuple[devices.DeviceKind, int]:
  """(kind, count) the plan is for: config.device (on its standard host unless
  config.num_devices says otherwise), or the local devices."""
  name = config.get("device", "")
  count = config.get("num_devices", 0)
  if name:
    kind = devices.kind(name)
    return kind, count or kind.host_devices
  local = jax.devices()
  return devices.local_kind(local[0], jax.local_device_count()), count or len(local)


def memory_plan(config, kind: devices.DeviceKind, mesh: dict[str, int],
                longest_bucket: int) -> dict:
  """Per-device memory and the micro-batch: `config.micro_batch_tokens_per_device` when set
  (what the trainer will use), else the most tokens that fit beside the state at the longest
  bucket; accumulation (with its second f32 gradient buffer) only when one micro-batch is not
  enough. Parameters, gradients and moments are split over the `model` axis, and over `data`
  too with `config.fsdp`."""
  data_shards = mesh["data"]
  model_shards = math.prod(size for axis, size in mesh.items() if axis != "data")
  state_shards = model_shards * (data_shards if config.get("fsdp", False) else 1)
  parameters = flops.parameter_count(config.model)
  per_token = activation_bytes_per_token(config.model, longest_bucket, model_shards)
  usable = int(kind.memory_bytes * kind.usable_memory_fraction)
  # Padded tokens per device per step: the budget every shape is sized for.
  needed = math.ceil(bucketing.padded_budget(config.tokens_per_batch) / data_shards)
  configured = config.get("micro_batch_tokens_per_device", 0)
  for accumulating in (False, True):
    state = state_bytes(parameters, config.model.dtype, accumulating)
    state_per_device = math.ceil(sum(state.values()) / state_shards)
    max_micro = max(usable - state_per_device, 0) // per_token
    limit = configured or max_micro
    # As train_step.accumulation_steps: ceil(padded budget / (micro-batch x data shards)).
    accumulation = math.ceil(needed / limit) if limit else 0
    if accumulation <= 1 or accumulating:
      break
  micro = math.ceil(needed / accumulation) if accumulation else 0
  if micro and micro <= max_micro and max_micro >= longest_bucket:
    fits = "yes"
  else:
    fits = (f"no: {max_micro} tokens per device fit beside {state_per_device / devices.GIB:.1f} "
            f"GiB of state (the longest bucket needs {longest_bucket})")
  return {
      "device_memory_bytes": kind.memory_bytes,
      "usable_memory_bytes": usable,
      **state,
      "state_bytes_per_device": state_per_device,
      "activation_bytes_per_token": per_token,
      "activation_model_length": longest_bucket,
      "max_micro_batch_tokens": max_micro,
      "micro_batch_tokens": micro,
      "accumulation_steps": accumulation,
      "activation_bytes_per_device": micro * per_token,
      "fits_in_memory": fits,
  }


# Steps measured on an accelerator (docs/RESULTS.md, "On an accelerator"): (config name, device
# kind, devices, compute dtype) -> (batch shape, seconds per step). The plan's MFU for that run
# is its FLOPs over that time, where the plan's representative batch is the one measured.
MEASURED_STEPS = {
    ("base", "h200", 1, "bfloat16"): ("976x32",
                                      kernel_census.MEASURED_H200_BASE["step_ms"] / 1e3),
}
ASSUMED_MFU = 0.4


def planned_mfu(config, kind: devices.DeviceKind, num_devices: int, flops_per_step: float,
                batch_shape: str) -> tuple[float, str]:
  """(MFU, where it comes from): --config.mfu when given; else the measured one for this
  model, device and count (MEASURED_STEPS); else ASSUMED_MFU."""
  if config.get("mfu", 0.0):
    return config.mfu, "given (--config.mfu)"
  peak = kind.peak_flops(config.model.dtype)
  measured = MEASURED_STEPS.get((config.name, kind.name, num_devices, config.model.dtype))
  if measured and measured[0] == batch_shape and peak:
    seconds = measured[1]
    return (flops_per_step / (num_devices * peak * seconds),
            f"measured: {config.name} on {num_devices} x {kind.name}, {1e3 * seconds:.1f} ms a "
            f"step at {batch_shape} (docs/RESULTS.md)")
  return ASSUMED_MFU, ("assumed (measured only for base on 1 x h200: docs/RESULTS.md; set "
                       "--config.mfu to yours)")


def plan(config) -> dict:
  boundaries = bucketing.boundaries_for(config.dataset)
  kind, num_devices = target_devices(config)
  config = config.copy_and_resolve_references()
  config.model.dtype = devices.compute_dtype(config.model.dtype, kind)  # "auto" for this kind
  mesh = sharding.parse_mesh(config.mesh, num_devices)
  memory = memory_plan(config, kind, mesh, boundaries[-1])
  # A representative batch: the bucket nearest 32 tokens (typical WMT/Multi30k sentence length).
  length = min(boundaries, key=lambda b: abs(b - 32))
  batch = bucketing.batch_size_for(length, bucketing.padded_budget(config.tokens_per_batch),
                                   mesh["data"])
  flops_per_step = flops.train_flops(config.model, batch, length, length)
  mfu, mfu_source = planned_mfu(config, kind, num_devices, flops_per_step,
                                f"{batch}x{length}")
  peak = kind.peak_flops(config.model.dtype)
  step_time = flops_per_step / (num_devices * peak * mfu) if peak else 0.0
  plan_ = {
      "config": config.name,
      "parameters": flops.parameter_count(config.model),
      "tokens_per_batch": config.tokens_per_batch,  # real tokens asked for, per side
      "padded_tokens_per_batch": bucketing.padded_budget(config.tokens_per_batch),
      # the padded slots the plan holds: data shards x micro-batch x accumulation steps
      "padded_tokens_per_optimizer_step": (mesh["data"] * memory["micro_batch_tokens"]
                                           * memory["accumulation_steps"]),
      "devices": f"{num_devices} x {kind.name}",
      "device": kind.description,
      "mesh": ",".join(f"{k}:{v}" for k, v in mesh.items()),
      "compute_dtype": config.model.dtype,
      "peak_flops_per_device": peak,
      **memory,
      "flops_per_step": flops_per_step,
      "flops_batch_shape": f"{batch}x{length}",
      "mfu": mfu,
      "mfu_source": mfu_source,
      "step_time_s": step_time,
      "training_time_h": step_time * config.num_train_steps / 3600,
      "bucket_boundaries": ",".join(map(str, boundaries)),
      "num_train_steps": config.num_train_steps,
  }
  if memory["accumulation_steps"] > 1 and not config.get("micro_batch_tokens_per_device", 0):
    plan_["accumulation_chosen_by"] = ("train.py at start, compiling the step for its devices "
                                       "(this estimate is its first try; nothing to pass)")
  return plan_


def _value_text(key: str, value) -> str:
  if key.endswith("_bytes") or key.endswith("_bytes_per_device"):
    return f"{value} ({value / devices.GIB:.2f} GiB)"
  if key == "peak_flops_per_device":
    return f"{value:.4g}" if value else "unknown (set --config.device=KIND)"
  if key in ("step_time_s", "training_time_h"):
    return f"{value:.4g}" if value else "unknown (set --config.device=KIND)"
  if key == "mfu":
    return f"{value:.2f}"
  if isinstance(value, float):
    return f"{value:.4g}"
  return str(value)


def plan_text(config, compiled_fit: bool = False) -> str:
  """The plan, one `key: value` a line; `compiled_fit`: the config's accumulation was chosen
  by compiling the step (planning/fit.py), which decides whether it fits, not the estimate."""
  plan_ = plan(config)
  if compiled_fit and plan_["fits_in_memory"] != "yes":
    plan_["fits_in_memory"] = (f"yes, compiled (the fit: line); the estimate alone says "
                               f"{plan_['fits_in_memory']}")
  return "\n".join(f"{k}: {_value_text(k, v)}" for k, v in plan_.items())


# The table of docs/SCALE.md: (row label, device kind, device count, compiled target). The
# compute dtype is "auto": bf16 where the kind has bf16 units, f32 on V100 and P100.
TABLE_HARDWARE = [
    ("TPU v3-8", "tpu_v3", 8, ""),
    ("TPU v4-8", "tpu_v4", 4, "tpu-v4-8"),
    ("TPU v5e-8", "tpu_v5e", 8, "tpu-v5e-8"),
    ("8 x V100 16 GB", "v100", 8, "gpu-v100x8"),
    ("8 x A100 40 GB", "a100", 8, "gpu-a100x8"),
    ("8 x H100 80 GB", "h100", 8, "gpu-h100x8"),
    ("1 x H100 80 GB", "h100", 1, "gpu-h100x1"),
    ("8 x P100 16 GB", "p100", 8, ""),
]

# compiled_memory_per_device (bytes) that `train.py --config=configs/NAME.py --dry_run
# --target=TARGET` printed (jax 0.10.2, libtpu 0.0.42.1, jax-cuda12-plugin 0.10.2; the
# commands are in docs/SCALE.md): the largest of the train, eval and beam-search programs.
COMPILED_MEMORY = {
    ("base", "tpu-v4-8"): 5709098496,
    ("base", "tpu-v5e-8"): 3098574336,
    ("base", "gpu-v100x8"): 4847582929,
    ("base", "gpu-a100x8"): 3198921425,
    ("base", "gpu-h100x8"): 3055679433,
    ("base", "gpu-h100x1"): 18359994313,
    ("big", "tpu-v4-8"): 10539005952,
    ("big", "tpu-v5e-8"): 6096195072,
    ("big", "gpu-v100x8"): 9731327953,
    ("big", "gpu-a100x8"): 6763925713,
    ("big", "gpu-h100x8"): 6412919241,
    ("big", "gpu-h100x1"): 32019224521,
}


def _duration(hours: float) -> str:
  return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} days"


def scale_table(named_configs, mfu: float = 0.4) -> str:
  """Markdown: each (name, config) on each TABLE_HARDWARE row at `mfu`, beside the paper's
  8 x P100 measurement with the MFU it implies."""
  lines = [
      "| model | hardware | devices | dtype | memory / device (GiB): state + activations "
      "of usable | compiled memory / device (GiB) | micro-batch tokens / device | accumulation "
      "| step (s) | training time | MFU |",
      "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
  ]
  for name, config in named_configs:
    config = config.copy_and_resolve_references()
    config.mfu = mfu
    for label, kind, count, target in TABLE_HARDWARE:
      config.device, config.num_devices, config.model.dtype = kind, count, "auto"
      p = plan(config)
      dtype = p["compute_dtype"]
      compiled = COMPILED_MEMORY.get((name, target))
      compiled = f"{compiled / devices.GIB:.1f}" if compiled else "—"
      memory = (f"{p['state_bytes_per_device'] / devices.GIB:.1f} + "
                f"{p['activation_bytes_per_device'] / devices.GIB:.1f} of "
                f"{p['usable_memory_bytes'] / devices.GIB:.1f}")
      if p["fits_in_memory"] != "yes":
        memory += " (does not fit)"
      lines.append(
          f"| {name} | {label} | {count} | {dtype} | {memory} | {compiled} "
          f"| {p['micro_batch_tokens']} "
          f"| {p['accumulation_steps']} | {p['step_time_s']:.3f} "
          f"| {_duration(p['training_time_h'])} | {mfu:.2f} (assumed) |")
    if name in PAPER_STEP_SECONDS:
      config.device, config.num_devices, config.model.dtype = "p100", 8, "float32"
      p = plan(config)
      seconds = PAPER_STEP_SECONDS[name]
      implied = p["flops_per_step"] / (8 * devices.kind("p100").peak_flops("float32") * seconds)
      lines.append(f"| {name} | 8 x P100 (paper, measured) | 8 | float32 | — | — | — | — "
                   f"| {seconds:.3f} | {PAPER_TRAINING_TIME[name]} | {implied:.2f} (implied) |")
  return "\n".join(lines)


def main(argv=None) -> None:
  import argparse
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--table", action="store_true",
                      help="print the Markdown table of docs/SCALE.md")
  parser.add_argument("--mfu", type=float, default=0.4)
  args = parser.parse_args(argv)
  if not args.table:
    parser.error("nothing to do: pass --table (or use train.py --config=... --dry_run)")
  from configs import base, big  # the repository's configs: run from the repository root
  print(scale_table([("base", base.get_config()), ("big", big.get_config())], args.mfu))


if __name__ == "__main__":
  main()
