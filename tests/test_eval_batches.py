"""Evaluation batches respect the micro-batch budget: a run whose device holds only a
micro-batch must not run out of memory at its first evaluation."""
import numpy as np
import pytest

from aiayn_flax.training import trainer
from configs import toy


@pytest.mark.slow  # trains two toy steps
def test_eval_batches_hold_no_more_than_a_micro_batch_and_cover_every_pair(tmp_path, monkeypatch):
  config = toy.get_config()
  config.num_train_steps = config.eval_every_steps = config.checkpoint_every_steps = 2
  config.dataset.toy_eval_examples = 100
  config.micro_batch_tokens_per_device = 64  # 512 tokens per step: 8 micro-batches
  seen = []
  evaluate_loss = trainer.evaluate_loss

  def recording_evaluate_loss(eval_fn, params, batches, batch_sharding):
    seen.extend(batch for _, batch in batches.iterate(num_epochs=1))
    return evaluate_loss(eval_fn, params, batches, batch_sharding)
  monkeypatch.setattr(trainer, "evaluate_loss", recording_evaluate_loss)
  summary = trainer.train_and_evaluate(config, str(tmp_path))
  assert np.isfinite(summary["valid/loss"])
  for batch in seen:
    for side in ("inputs", "targets"):
      assert batch[side].size <= config.micro_batch_tokens_per_device  # one device here
  real_rows = sum(int(np.count_nonzero(batch["targets"].any(axis=1))) for batch in seen)
  assert real_rows == config.dataset.toy_eval_examples  # every validation pair, once
