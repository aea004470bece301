"""The batches both sides of bench/train_speed.py train on, from numpy alone (the PyTorch peer
runs in a venv without jax): random ids in [4, vocab) with the last quarter of every row padded
(id 0), so both sides see the same shapes, the same ids and the same padding."""
import numpy as np

NUM_BATCHES = 4  # cycled through, so no step reuses the previous step's batch


def synthetic_batches(rows: int, length: int, vocab_size: int) -> list[dict]:
  rng = np.random.default_rng(0)
  batches = []
  for _ in range(NUM_BATCHES):
    batch = {k: rng.integers(4, vocab_size, (rows, length)).astype(np.int32)
             for k in ("inputs", "targets")}
    for ids in batch.values():
      ids[:, length - length // 4:] = 0
    batches.append(batch)
  return batches


def real_tokens(rows: int, length: int) -> int:
  """Real (non-padding) source + target tokens in one batch."""
  return 2 * rows * (length - length // 4)
