"""Bad input to the command-line tools ends with one line that says what to do, not a
traceback, and before anything is written."""
import os

import pytest

from aiayn_flax.training import trainer
from conftest import run_script


@pytest.mark.slow
def test_evaluate_names_both_files_when_line_counts_differ(shared_data):
  hyp, ref = shared_data / "wmt14/newstest2013.de", shared_data / "wmt14/newstest2014.de"
  result = run_script("evaluate.py", f"--hyp_file={hyp}", f"--ref_file={ref}")
  assert result.returncode != 0
  message = result.stderr.strip().splitlines()[-1]
  assert str(hyp) in message and str(ref) in message and "3000" in message and "3003" in message


@pytest.mark.slow
def test_evaluate_without_checkpoint_says_what_to_do(tmp_path):
  result = run_script("evaluate.py", f"--workdir={tmp_path}", "--testset=multi30k/test2016")
  assert result.returncode != 0
  assert "no checkpoint; train first" in result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_evaluate_with_a_missing_workdir_names_it(tmp_path):
  result = run_script("evaluate.py", f"--workdir={tmp_path / 'nowhere'}",
                      "--testset=multi30k/test2016")
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      f"evaluate.py: error: --workdir={tmp_path / 'nowhere'}: no such directory")


@pytest.mark.slow
def test_unknown_config_key_is_a_one_line_error():
  result = run_script("train.py", "--config=configs/toy.py", "--config.model.d_modle=64",
                      "--dry_run")
  assert result.returncode != 0
  assert result.stderr.strip().splitlines() == [
      "train.py: error: --config.model.d_modle=64: the config has no field 'd_modle' (did you "
      "mean 'd_model'?); run with --dry_run, or read the config file, for the fields it has"]


def test_several_steps_per_call_with_micro_batches_is_refused_naming_both_keys(tmp_path):
  from configs import toy
  config = toy.get_config()
  # 420 real tokens, 525 padded slots: 9 micro-batches of at most 64 slots a step
  config.steps_per_call, config.micro_batch_tokens_per_device = 2, 64
  with pytest.raises(ValueError, match=r"steps_per_call=2: .*9 here.*micro_batch_tokens_per"):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert not os.path.exists(tmp_path / "checkpoints")  # refused before anything was trained


@pytest.mark.slow
def test_missing_data_folder_is_a_one_line_error(tmp_path):
  env_dir = tmp_path / "no_data_here"
  result = run_script("train.py", "--config=configs/multi30k.py", f"--workdir={tmp_path / 'w'}",
                      env={"AIAYN_DATA_DIR": str(env_dir)})
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1].startswith(
      f"train.py: error: AIAYN_DATA_DIR={env_dir}: no such folder;")


def test_vocabulary_that_does_not_match_the_checkpoint_is_refused(shared_data, tmp_path):
  from aiayn_flax import run_dir
  from aiayn_flax.data import text_files, vocabulary
  from configs import multi30k as multi30k_config
  english, _ = text_files.read_parallel_lines(str(shared_data / "wmt14/newstest2013.en"),
                                              str(shared_data / "wmt14/newstest2013.de"))
  vocabulary.train_vocabulary(english[:300], str(tmp_path / "vocab.model"), 400)
  config = multi30k_config.get_config()  # a checkpoint's embedding of 8000 rows
  with pytest.raises(ValueError) as refused:
    run_dir.load_vocabulary(str(tmp_path), config)
  assert str(refused.value).startswith(f"{tmp_path / 'vocab.model'} has 400 pieces but "
                                       "config.model.vocab_size is 8000")


@pytest.mark.slow
def test_a_paper_scale_config_is_refused_on_the_cpu_in_one_line(tmp_path):
  result = run_script("train.py", "--config=configs/base.py", f"--workdir={tmp_path / 'run'}")
  assert result.returncode == 1
  assert "backend: cpu; " in result.stdout
  assert result.stderr.strip().splitlines()[-1] == (
      "train.py: error: base is a paper-scale run and jax sees only the CPU: on a TPU VM pip "
      "install -e '.[tpu]' -c requirements.lock, on an NVIDIA GPU host pip install -e "
      "'.[cuda12]' -c requirements.lock; to train on the CPU anyway add --config.device=cpu")
  assert not (tmp_path / "run").exists()


def test_config_device_cpu_lets_a_paper_scale_config_train_on_the_cpu():
  import train
  from configs import base, multi30k
  config = base.get_config()
  assert train.check_backend(config).startswith("base is a paper-scale run")
  config.device = "cpu"
  assert train.check_backend(config) is None
  assert train.check_backend(multi30k.get_config()) is None  # made for the CPU
