"""Transformer big on WMT14 EN->DE: Table 3 row "big" (213M parameters, 28.4 BLEU)."""
from configs import base


def get_config():
  c = base.get_config()
  c.name = "big"
  c.model.update(d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3)
  c.num_train_steps = 300_000  # 3.5 days on 8 P100 (5.2)
  # Every 10 minutes by the clock, as base (6.1); was 600 steps, the paper's 1.0 s/step.
  c.keep_checkpoints = 20
  c.average_last_checkpoints = 20  # the last 20 (6.1)
  return c
