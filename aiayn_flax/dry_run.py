"""`train.py --dry_run`: the run's plan, computed from the config alone (nothing allocated)."""
import jax

from aiayn_flax import flops, sharding
from aiayn_flax.data import bucketing


def plan(config) -> dict:
  boundaries = bucketing.bucket_boundaries(config.dataset.bucket_min_length,
                                           config.dataset.max_length, config.dataset.bucket_growth,
                                           config.dataset.bucket_quantum)
  mesh = sharding.parse_mesh(config.mesh, jax.device_count())
  # A representative batch: the bucket nearest 32 tokens (typical WMT/Multi30k sentence length).
  length = min(boundaries, key=lambda b: abs(b - 32))
  batch = bucketing.batch_size_for(length, config.tokens_per_batch, mesh["data"])
  return {
      "config": config.name,
      "parameters": flops.parameter_count(config.model),
      "tokens_per_optimizer_step": config.tokens_per_batch,
      "devices": f"{jax.device_count()} x {jax.devices()[0].platform}",
      "mesh": ",".join(f"{k}:{v}" for k, v in mesh.items()),
      "flops_per_step": flops.train_flops(config.model, batch, length, length),
      "flops_batch_shape": f"{batch}x{length}",
      "bucket_boundaries": ",".join(map(str, boundaries)),
      "num_train_steps": config.num_train_steps,
  }


def plan_text(config) -> str:
  return "\n".join(f"{k}: {v}" for k, v in plan(config).items())
