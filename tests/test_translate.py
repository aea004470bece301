"""translate.py keeps line alignment for any UTF-8 input, streams, and lists the n best."""
import os
import select
import subprocess
import sys

import jax
import pytest

from aiayn_flax import run_dir
from aiayn_flax.translator import Translator, batch_rows
from conftest import REPO, run_script

LONG = " ".join(str(4 + i % 15) for i in range(300))
# The toy model reverses 4 to 11 symbols. Its vocabulary reads whitespace-separated ids, with
# str.split(), which treats \u2028, \x0b, \x1c and \x85 as spaces, where str.splitlines()
# would break a line at them.
AWKWARD_LINES = ["5 6 7 8", "", "   ", "9 10\u2028 11 12", "12\x0b13 14 15", "5 6 7 8\r",
                 "7\x1c8 9 10", "\x85", LONG, "4 5 6 7"]
AWKWARD_BYTES = "\n".join(AWKWARD_LINES).encode("utf-8")  # no final newline


def translate(*args, stdin=b""):
  return run_script("translate.py", *args, stdin=stdin)


@pytest.fixture(scope="module")
def greedy_translator(toy_run) -> Translator:
  """What translate.py should print for the toy run (its recipe: greedy, the last checkpoint),
  computed in-process on the same checkpoint."""
  config, workdir, _ = toy_run
  assert (config.beam_size, config.average_last_checkpoints) == (1, 1)
  model, params, _ = run_dir.load_model_and_params(workdir, config, 1)
  return Translator(model, params, run_dir.load_vocabulary(workdir, config), beam_size=1,
                    extra_length=config.decode_extra_length)


def test_one_output_line_per_input_line_from_stdin_and_from_a_file(toy_run, greedy_translator,
                                                                   tmp_path):
  _, workdir, _ = toy_run
  (tmp_path / "in.txt").write_bytes(AWKWARD_BYTES)
  from_stdin = translate(f"--workdir={workdir}", stdin=AWKWARD_BYTES)
  from_file = translate(f"--workdir={workdir}", f"--input={tmp_path / 'in.txt'}",
                        f"--output={tmp_path / 'out.txt'}")
  assert from_stdin.returncode == 0, from_stdin.stderr[-2000:]
  assert from_file.returncode == 0, from_file.stderr[-2000:]
  lines = from_stdin.stdout.decode("utf-8").split("\n")
  assert lines[-1] == "" and len(lines[:-1]) == len(AWKWARD_LINES)
  assert (tmp_path / "out.txt").read_bytes() == from_stdin.stdout
  assert lines[:-1] == greedy_translator.translate(AWKWARD_LINES)
  assert [i for i, line in enumerate(lines[:-1]) if not line] == [1, 2, 7]  # no symbols in


def test_a_typed_line_comes_back_before_the_next_is_typed(toy_run, greedy_translator):
  _, workdir, _ = toy_run
  typed = ["5 6 7 8", "9 10 11 12"]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  process = subprocess.Popen([sys.executable, "translate.py", f"--workdir={workdir}"], cwd=REPO,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env)
  try:
    for line, expected in zip(typed, greedy_translator.translate(typed)):
      process.stdin.write(line.encode() + b"\n")
      process.stdin.flush()  # stdin stays open: the translator must answer now
      # Generous: a loaded machine takes minutes to start jax and compile; the test's own
      # time limit (pytest-timeout) still bounds it.
      ready, _, _ = select.select([process.stdout], [], [], 600)
      assert ready, f"no translation of {line!r} while the input stayed open"
      assert process.stdout.readline().decode().rstrip("\n") == expected
    process.stdin.close()
    assert process.wait(timeout=60) == 0
  finally:
    process.kill()


def test_nbest_lists_the_best_n_with_scores_in_moses_format(toy_run, tmp_path):
  _, workdir, _ = toy_run
  result = translate(f"--workdir={workdir}", "--beam_size=3", "--nbest=2",
                     stdin=b"5 6 7 8\n\n9 10 11\n")
  assert result.returncode == 0, result.stderr[-2000:]
  entries = [line.split(" ||| ") for line in result.stdout.decode().splitlines()]
  assert [e[0] for e in entries] == ["0", "0", "2", "2"]  # the empty line 1 has no entry
  scores = [float(e[2]) for e in entries]
  assert scores[0] >= scores[1] and scores[2] >= scores[3] and max(scores) <= 0
  best = translate(f"--workdir={workdir}", "--beam_size=3", stdin=b"5 6 7 8\n\n9 10 11\n")
  assert best.stdout.decode().split("\n")[:3] == [entries[0][1], "", entries[2][1]]


def test_nbest_above_the_beam_size_is_refused_in_one_line(toy_run):
  _, workdir, _ = toy_run
  result = translate(f"--workdir={workdir}", "--beam_size=2", "--nbest=3", stdin=b"5 6\n")
  assert result.returncode != 0
  assert result.stderr.decode().strip().splitlines()[-1] == (
      "translate.py: error: --nbest=3: must lie in [1, beam size 2]")


def test_invalid_utf8_is_refused_naming_the_line(toy_run):
  _, workdir, _ = toy_run
  result = translate(f"--workdir={workdir}", stdin=b"5 6\n7 \xff 8\n")
  assert result.returncode != 0
  assert result.stderr.decode().strip().splitlines()[-1].startswith(
      "translate.py: error: <stdin>:2: invalid UTF-8")


@pytest.mark.parametrize("count,length,batch_size,max_tokens,rows", [
    (1, 16, 128, 0, 1), (3, 16, 128, 0, 4), (100, 32, 128, 0, 128), (200, 16, 128, 0, 128),
    (100, 32, 128, 1024, 32), (5, 4096, 128, 1024, 1)])
def test_batch_rows(count, length, batch_size, max_tokens, rows):
  assert batch_rows(count, length, batch_size, max_tokens) == rows


@pytest.mark.parametrize("beam_size", [1, 3])
def test_token_budgeted_batches_translate_as_full_batches(toy_run, beam_size):
  config, workdir, _ = toy_run
  model, params, _ = run_dir.load_model_and_params(workdir, config, 1)
  vocab = run_dir.load_vocabulary(workdir, config)
  sentences = [" ".join(str(4 + (i * j) % 15) for j in range(4 + i % 8)) for i in range(40)]
  full = Translator(model, params, vocab, beam_size=beam_size, batch_size=64)
  budgeted = Translator(model, params, vocab, beam_size=beam_size, batch_size=64,
                        max_tokens=64)  # 4 rows of 16 tokens per batch
  translations = full.translate(sentences)
  assert budgeted.translate(sentences) == translations
  assert len(set(translations)) > len(sentences) // 2  # not one answer for every sentence


def test_the_parameters_are_placed_on_every_device_once(toy_run):
  # Host arrays (as a checkpoint reads them) given to a jitted call would be copied to the
  # devices at every batch; the translator places them once, whole on each decoding device.
  config, workdir, _ = toy_run
  model, params, _ = run_dir.load_model_and_params(workdir, config)
  vocab = run_dir.load_vocabulary(workdir, config)
  translator = Translator(model, jax.device_get(params), vocab)
  assert all(isinstance(leaf, jax.Array) and leaf.devices() == set(jax.devices())
             and leaf.sharding.is_fully_replicated
             for leaf in jax.tree.leaves(translator.params))
  lines = ["5 6 7 8", "9 10 11 12 13", ""]
  assert translator.translate(lines) == Translator(model, params, vocab).translate(lines)
