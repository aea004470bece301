"""The command-line tools on a trained toy run give what the library gives in-process: the
Translator on the same checkpoint, with the same recipe, is the expected output, so these tests
hold however well the toy learned (tests/test_learning.py bounds that)."""
import json

import jax
import pytest

from aiayn_flax import run_dir, scoring
from aiayn_flax.translator import Translator
from conftest import run_script


@pytest.fixture(scope="module")
def toy_translator(toy_run):
  """A Translator for the toy run's newest checkpoint: translator(beam_size) -> Translator."""
  config, workdir, _ = toy_run
  model, params, _ = run_dir.load_model_and_params(workdir, config, 1)
  vocab = run_dir.load_vocabulary(workdir, config)
  return lambda beam_size, **kwargs: Translator(
      model, params, vocab, beam_size=beam_size, alpha=config.length_penalty_alpha,
      extra_length=config.decode_extra_length, **kwargs)


def test_translate_keeps_line_count_and_empty_lines(toy_run, toy_translator):
  _, workdir, _ = toy_run
  lines = ["5 6 7 8", "", "9 10 11 12 13"]
  result = run_script("translate.py", f"--workdir={workdir}", "--beam_size=1",
                      stdin="".join(line + "\n" for line in lines))
  assert result.returncode == 0, result.stderr[-2000:]
  expected = toy_translator(1).translate(lines)
  assert expected[1] == "" and all(expected[::2])
  assert result.stdout.split("\n") == [*expected, ""]


def test_evaluate_scores_a_run_on_files(toy_run, toy_translator, tmp_path):
  _, workdir, _ = toy_run
  sources, references = ["5 6 7 8", "9 10 11 12 13"], ["8 7 6 5", "13 12 11 10 9"]
  (tmp_path / "src").write_text("".join(s + "\n" for s in sources))
  (tmp_path / "ref").write_text("".join(r + "\n" for r in references))
  result = run_script("evaluate.py", f"--workdir={workdir}", f"--src_file={tmp_path / 'src'}",
                      f"--ref_file={tmp_path / 'ref'}", "--beam_size=4", "--average_last=1",
                      f"--output_dir={tmp_path}")
  assert result.returncode == 0, result.stderr[-2000:]
  hypotheses = toy_translator(4).translate(sources)
  assert (tmp_path / "src.beam4_avg1_step1000.hyp").read_text() == "".join(
      h + "\n" for h in hypotheses)
  expected = scoring.score_translations(hypotheses, references, "de")
  assert result.stdout.splitlines()[0] == expected["sacrebleu_line"]
  scores = json.loads((tmp_path / "src.beam4_avg1_step1000.json").read_text())
  assert scores["tokenized_bleu"] == expected["tokenized_bleu"]


def test_evaluate_without_a_testset_scores_the_runs_test_split(toy_run, tmp_path):
  config, workdir, _ = toy_run
  result = run_script("evaluate.py", f"--workdir={workdir}", "--average_last=1",
                      f"--output_dir={tmp_path}")
  assert result.returncode == 0, result.stderr[-2000:]
  hypotheses = (tmp_path / "split_test.beam1_avg1_step1000.hyp").read_text().splitlines()
  assert len(hypotheses) == config.dataset.toy_eval_examples  # the toy's test split
  scores = json.loads((tmp_path / "split_test.beam1_avg1_step1000.json").read_text())
  assert scores["versions"]["jax"] == jax.__version__


def test_translation_is_the_same_alone_and_inside_a_batch(toy_translator):
  sentence = "4 9 15 6 11 7"
  others = ["5 6 7 8", "19 18 17 16 15 14 13 12 11 10 9", "12 4", "8 8 8 8 8 8 8"]
  for beam_size in (1, 4):
    translator = toy_translator(beam_size, batch_size=8)
    alone = translator.translate([sentence])[0]
    batched = translator.translate(others + [sentence])
    assert batched[-1] == alone
    assert len(set(batched)) == len(batched)  # five sentences, five translations


def test_evaluate_step_scores_that_checkpoint_and_the_json_names_it(toy_run, toy_translator,
                                                                     tmp_path):
  config, workdir, _ = toy_run  # checkpoints of steps 500 and 1000
  sources, references = ["5 6 7 8", "9 10 11 12 13"], ["8 7 6 5", "13 12 11 10 9"]
  (tmp_path / "src").write_text("".join(s + "\n" for s in sources))
  (tmp_path / "ref").write_text("".join(r + "\n" for r in references))
  result = run_script("evaluate.py", f"--workdir={workdir}", f"--src_file={tmp_path / 'src'}",
                      f"--ref_file={tmp_path / 'ref'}", "--step=500", "--average_last=1",
                      f"--output_dir={tmp_path}")
  assert result.returncode == 0, result.stderr[-2000:]
  scores = json.loads((tmp_path / "src.beam1_avg1_step500.json").read_text())
  assert scores["checkpoint_steps"] == [500]
  model, params, steps = run_dir.load_model_and_params(workdir, config, 1, step=500)
  vocab = run_dir.load_vocabulary(workdir, config)
  expected = Translator(model, params, vocab, beam_size=1, alpha=config.length_penalty_alpha,
                        extra_length=config.decode_extra_length).translate(sources)
  assert steps == [500]
  assert (tmp_path / "src.beam1_avg1_step500.hyp").read_text().splitlines() == expected
  # --average_last=K with --step: the K stored checkpoints ending at that step.
  assert run_dir.load_model_and_params(workdir, config, 2, step=1000)[2] == [500, 1000]


def test_evaluate_step_that_was_not_saved_lists_the_steps_there_in_one_line(toy_run):
  config, workdir, _ = toy_run
  result = run_script("evaluate.py", f"--workdir={workdir}", "--step=700", "--average_last=1")
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f"evaluate.py: error: {workdir}/checkpoints: no checkpoint of step 700; "
      "the steps there: 500, 1000")
  with pytest.raises(ValueError, match=r"2 checkpoints up to step 1000, fewer than "
                     r"--average_last=3; the steps there: 500, 1000$"):
    run_dir.load_model_and_params(workdir, config, 3, step=1000)
