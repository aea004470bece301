"""Training that learns, checkpoints that restore, and the command-line tools on a toy run."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from aiayn_flax import checkpoints, trainer
from conftest import REPO


def run_script(*args, stdin=None, timeout=300):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.run([sys.executable, *args], cwd=REPO, input=stdin, capture_output=True,
                        text=True, timeout=timeout, env=env)


def test_toy_task_is_learned(toy_run):
  config, _, summary = toy_run
  print(f"toy: {config.num_train_steps} steps, exact match {summary['valid/exact_match']:.3f}")
  assert summary["valid/exact_match"] >= 0.95


def test_checkpoint_round_trip_restores_an_identical_state(toy_run):
  config, workdir, _ = toy_run
  model = trainer.train_step.make_model(config)
  template = trainer.train_step.create_train_state(config, model)
  mngr = checkpoints.manager(workdir, read_only=True)
  state, meta = checkpoints.restore(mngr, mngr.latest_step(), checkpoints.abstract_of(template))
  assert int(state.step) == config.num_train_steps
  assert meta["config"]["num_train_steps"] == config.num_train_steps
  averaged = checkpoints.load_params(workdir, checkpoints.abstract_of(template.params),
                                     [config.num_train_steps])
  for restored, loaded in zip(jax.tree.leaves(state.params), jax.tree.leaves(averaged)):
    np.testing.assert_array_equal(np.asarray(restored), loaded)
  mngr.close()


def test_averaging_checkpoints_gives_the_elementwise_mean(toy_run):
  config, workdir, _ = toy_run
  model = trainer.train_step.make_model(config)
  abstract = checkpoints.abstract_of(trainer.train_step.create_train_state(config, model).params)
  steps = checkpoints.last_steps(workdir, 2)
  assert len(steps) == 2
  each = [checkpoints.load_params(workdir, abstract, [s]) for s in steps]
  mean = checkpoints.load_params(workdir, abstract, steps)
  for a, b, m in zip(*(jax.tree.leaves(t) for t in (*each, mean))):
    np.testing.assert_allclose(m, (a + b) / 2, rtol=1e-6, atol=1e-7)


def test_averaging_more_checkpoints_than_the_run_holds_is_refused(toy_run):
  config, workdir, _ = toy_run
  model = trainer.train_step.make_model(config)
  abstract = checkpoints.abstract_of(trainer.train_step.create_train_state(config, model).params)
  held = len(checkpoints.last_steps(workdir, 100))
  params, steps = checkpoints.load_newest_params(workdir, abstract, held)
  assert steps == checkpoints.last_steps(workdir, held)
  with pytest.raises(ValueError, match=f"holds {held} checkpoints, fewer than --average_last="
                                       f"{held + 1}$"):
    checkpoints.load_newest_params(workdir, abstract, held + 1)


def test_second_run_in_the_same_workdir_continues_from_the_last_step(toy_run, tmp_path):
  config, workdir, _ = toy_run
  import shutil
  continued = str(tmp_path / "continued")
  shutil.copytree(workdir, continued)
  config = config.copy_and_resolve_references()
  config.num_train_steps += 20
  config.checkpoint_every_steps = 10
  summary = trainer.train_and_evaluate(config, continued)
  assert summary["start_step"] == 1000 and summary["step"] == 1020  # not from scratch
  assert checkpoints.last_steps(continued, 10)[-2:] == [1010, 1020]
  assert summary["valid/exact_match"] >= 0.95


def test_translate_keeps_line_count_and_empty_lines(toy_run, tmp_path):
  _, workdir, _ = toy_run
  result = run_script("translate.py", f"--workdir={workdir}", "--beam_size=1",
                      stdin="5 6 7 8\n\n9 10 11 12 13\n")
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split("\n") == ["8 7 6 5", "", "13 12 11 10 9", ""]


def test_evaluate_scores_a_run_on_files(toy_run, tmp_path):
  _, workdir, _ = toy_run
  (tmp_path / "src").write_text("5 6 7 8\n9 10 11 12 13\n")
  (tmp_path / "ref").write_text("8 7 6 5\n13 12 11 10 9\n")
  result = run_script("evaluate.py", f"--workdir={workdir}", f"--src_file={tmp_path / 'src'}",
                      f"--ref_file={tmp_path / 'ref'}", "--beam_size=4", "--average_last=1",
                      f"--output_dir={tmp_path}")
  assert result.returncode == 0, result.stderr[-2000:]
  assert "= 100.00" in result.stdout
  assert (tmp_path / "src.beam4_avg1_step1000.hyp").read_text() == "8 7 6 5\n13 12 11 10 9\n"


def test_evaluate_without_a_testset_scores_the_runs_test_split(toy_run, tmp_path):
  config, workdir, _ = toy_run
  result = run_script("evaluate.py", f"--workdir={workdir}", "--average_last=1",
                      f"--output_dir={tmp_path}")
  assert result.returncode == 0, result.stderr[-2000:]
  hypotheses = (tmp_path / "split_test.beam1_avg1_step1000.hyp").read_text().splitlines()
  assert len(hypotheses) == config.dataset.toy_eval_examples  # the toy's test split
  scores = json.loads((tmp_path / "split_test.beam1_avg1_step1000.json").read_text())
  assert scores["versions"]["jax"] == jax.__version__


def test_checkpoints_record_the_software_versions(toy_run):
  import flax
  import orbax.checkpoint
  _, workdir, _ = toy_run
  mngr = checkpoints.manager(workdir, read_only=True)
  versions = checkpoints.restore_meta(mngr, mngr.latest_step())["versions"]
  mngr.close()
  assert (versions["jax"], versions["flax"], versions["orbax-checkpoint"]) == (
      jax.__version__, flax.__version__, orbax.checkpoint.__version__)


def test_evaluate_names_both_files_when_line_counts_differ(shared_data):
  hyp, ref = shared_data / "wmt14/newstest2013.de", shared_data / "wmt14/newstest2014.de"
  result = run_script("evaluate.py", f"--hyp_file={hyp}", f"--ref_file={ref}")
  assert result.returncode != 0
  message = result.stderr.strip().splitlines()[-1]
  assert str(hyp) in message and str(ref) in message and "3000" in message and "3003" in message


def test_evaluate_without_checkpoint_says_what_to_do(tmp_path):
  result = run_script("evaluate.py", f"--workdir={tmp_path}", "--testset=multi30k/test2016")
  assert result.returncode != 0
  assert "no checkpoint; train first" in result.stderr.strip().splitlines()[-1]


def test_evaluate_with_a_missing_workdir_names_it(tmp_path):
  result = run_script("evaluate.py", f"--workdir={tmp_path / 'nowhere'}",
                      "--testset=multi30k/test2016")
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      f"evaluate.py: error: --workdir={tmp_path / 'nowhere'}: no such directory")


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


def test_missing_data_folder_is_a_one_line_error(tmp_path):
  env_dir = tmp_path / "no_data_here"
  result = subprocess.run(
      [sys.executable, "train.py", "--config=configs/multi30k.py", f"--workdir={tmp_path / 'w'}"],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", AIAYN_DATA_DIR=str(env_dir)))
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
  try:
    run_dir.load_vocabulary(str(tmp_path), config)
  except ValueError as e:
    assert str(e).startswith(f"{tmp_path / 'vocab.model'} has 400 pieces but "
                             "config.model.vocab_size is 8000")
  else:
    raise AssertionError("a 400-piece vocabulary was accepted for an 8000-row embedding")


def test_translation_is_the_same_alone_and_inside_a_batch(toy_run):
  from aiayn_flax import run_dir
  from aiayn_flax.translator import Translator
  config, workdir, _ = toy_run
  model, params, _ = run_dir.load_model_and_params(workdir, config, 1)
  vocab = run_dir.load_vocabulary(workdir, config)
  sentence = "4 9 15 6 11 7"
  others = ["5 6 7 8", "19 18 17 16 15 14 13 12 11 10 9", "12 4", "8 8 8 8 8 8 8"]
  for beam_size in (1, 4):
    translator = Translator(model, params, vocab, beam_size=beam_size, batch_size=8)
    alone = translator.translate([sentence])[0]
    assert translator.translate(others + [sentence])[-1] == alone
    assert alone == "7 11 6 15 9 4"


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
