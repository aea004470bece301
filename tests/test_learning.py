"""The model learns: the only tests that bound how well a trained run does. Every other test of a
trained run compares two ways of producing the same output, so it holds however well the run
learned on this CPU.

Each bound was set from `nice -n 19 python bench/learning_margin.py`, which trains these same
runs for several seeds and prints each seed's margin; the sweep is quoted beside each bound.
"""
import numpy as np
import pytest

from aiayn_flax import attention_maps, run_dir, tasks
from aiayn_flax.training import trainer
from aiayn_flax.data import pipeline, tokenized
from configs import multi30k

# Seeds 0-4 (2026-11-29, one bucket of 12 since then; an Intel Xeon, 2 cores): exact match
# 1.000, 1.000, 1.000, 0.980, 0.970; mirrored share 0.83, 1.00, 1.00, 1.00, 1.00; the same
# seeds on an AMD EPYC (2 cores, the same day and code): 0.905, 0.995, 1.000, 1.000, 0.985 and
# 1.00 for each (2026-11-25, buckets of 8 and 12: 0.995, 1.000, 0.980, 0.995, 0.990 and 1.00,
# 0.83, 1.00, 1.00, 1.00). Seed 0 differs by 0.095 between the two CPUs' rounding, so 0.80
# leaves 0.105 below the worst seed seen (the bound was 0.90, passed by 0.005 on the EPYC); a
# model that has not learned the reversal scores near 0.
TOY_MIN_EXACT_MATCH = 0.80
TOY_MIN_MIRRORED_SHARE = 0.5
# Seeds 0, 1, 2: 0.676, 0.671, 0.673 (the Xeon; 0.676, 0.671, 0.668 on the EPYC). 0.70 passed
# by 3%; 0.75 leaves 0.07, fourteen times the spread between seeds, and still asks for a quarter
# less NLL than word frequencies give.
MULTI30K_MAX_NLL_RATIO = 0.75
MIRROR_SOURCE = "4 9 15 6 11 7"


def toy_measures(config, workdir: str, summary: dict) -> tuple[float, float]:
  """(validation exact match, share of output pieces whose cross-attention, summed over layers
  and heads, peaks on the mirrored source piece) of a trained toy run."""
  model, params, _ = run_dir.load_model_and_params(workdir, config, 1)
  maps = attention_maps.attention_maps(model, params, run_dir.load_vocabulary(workdir, config),
                                       MIRROR_SOURCE, extra_length=config.decode_extra_length)
  n = len(MIRROR_SOURCE.split())
  total = sum(w.sum(axis=0) for w in maps.cross)[:n, :n]  # [T, S] without EOS
  mirrored = float(np.mean(total.argmax(axis=1) == np.arange(n)[::-1]))
  return summary["valid/exact_match"], mirrored


def toy_learning_measures(config, workdir: str) -> tuple[float, float]:
  return toy_measures(config, workdir, trainer.train_and_evaluate(config, workdir))


def small_multi30k_config():
  config = multi30k.get_config()  # dropout 0.1 and label smoothing 0.1 (configs/base.py)
  config.model.update(vocab_size=1000, d_model=64, d_ff=256, num_heads=4, num_layers=2)
  config.dataset.update(max_length=64, bucket_growth=2.0, bucket_quantum=8)
  config.tokens_per_batch = 1024
  config.warmup_steps, config.learning_rate_scale = 200, 2.0
  config.num_train_steps = config.eval_every_steps = config.checkpoint_every_steps = 500
  config.log_every_steps = 100
  config.eval_decode_sentences = 0
  return config


def multi30k_nll_ratio(config, workdir: str, summary: dict | None = None) -> float:
  """Validation NLL over that of a model that learned nothing but word frequencies: the
  training targets' unigram distribution (add-one smoothed), scored on the validation targets."""
  summary = summary or trainer.train_and_evaluate(config, workdir)
  task = tasks.for_config(config)
  vocab = pipeline.vocabulary_for(config, workdir, task)
  train = tokenized.split_ids(config, vocab, config.dataset.train_split, task)
  valid = tokenized.split_ids(config, vocab, config.dataset.eval_split, task)
  counts = np.bincount(np.asarray(train.targets.flat), minlength=config.model.vocab_size) + 1
  unigram_nll = -np.mean(np.log(counts / counts.sum())[np.asarray(valid.targets.flat)])
  return summary["valid/nll"] / unigram_nll


@pytest.mark.slow
def test_toy_task_is_learned(toy_run):
  config, workdir, summary = toy_run
  exact, _ = toy_measures(config, workdir, summary)
  assert exact >= TOY_MIN_EXACT_MATCH


@pytest.mark.slow
def test_the_toy_model_attends_to_the_mirrored_source(toy_run):
  # Predicting output piece i of a reversal needs source piece n-1-i (the paper's figures 3-5
  # show such alignments in real attention maps).
  _, mirrored = toy_measures(*toy_run)
  assert mirrored >= TOY_MIN_MIRRORED_SHARE


@pytest.mark.slow
@pytest.mark.timeout(1200)  # about two minutes alone; 2-3 times that beside another worker
def test_paper_regularisation_learns_multi30k_well_beyond_a_unigram_model(shared_data, tmp_path):
  config = small_multi30k_config()
  assert (config.model.dropout_rate, config.label_smoothing) == (0.1, 0.1)  # section 5.4
  summary = trainer.train_and_evaluate(config, str(tmp_path))
  assert multi30k_nll_ratio(config, str(tmp_path), summary) < MULTI30K_MAX_NLL_RATIO
  assert np.isfinite(summary["loss"]) and summary["loss"] > summary["nll"]  # smoothing's cost
