"""export.py: a run written for CTranslate2 and for transformers' Marian classes computes what
ours computes (the same log-probabilities; the same greedy translations), in folders that each
engine's own loaders open, and a model a format cannot hold is refused naming the config field.

The exporters' packages come with the `export` extra, which `make test` installs."""
import copy
import json

import numpy as np
import pytest

from aiayn_flax.export import weights as weights_lib
from conftest import run_script

# Greedy translations of the toy run's test sentences identical to ours through both engines:
# all of them with toy runs of seeds 0, 1 and 2 (2026-12-07: 300 short sentences and 100 of
# 12-40 symbols; the test's 350 with seed 0, the toy run's). Any single weight mapped wrong (a
# transposed projection, q and k or k and v swapped, a layer norm's scale and bias swapped,
# Marian's positions left interleaved) gave 0 to 1 of 300.
MIN_IDENTICAL = 0.99


def require_the_engines():
  """The engines' packages, which the `export` extra installs: `make test` leaves the extra out,
  saying so, where torch's CPU build cannot be had (Linux x86-64 without PyTorch's CPU index)."""
  for module in ("ctranslate2", "transformers", "torch"):
    pytest.importorskip(module, reason=f"{module} is not installed: the export extra "
                        "(docs/INSTALL.md)")


def toy_config(**model_fields):
  from configs import toy
  config = toy.get_config()
  config.model.update(model_fields)
  return config


@pytest.mark.parametrize("fields, output_format, field_named", [
    ({"qk_dim": 8}, "ctranslate2", "model.qk_dim=8, model.v_dim=0"),
    ({"qk_dim": 8, "v_dim": 8}, "marian", "model.qk_dim=8"),
    ({"positions": "learned"}, "ctranslate2", "model.positions='learned'"),
    ({"pre_layer_norm": True}, "marian", "model.pre_layer_norm=True"),
])
def test_a_model_the_format_cannot_hold_is_refused_naming_the_field(fields, output_format,
                                                                     field_named):
  with pytest.raises(ValueError) as refusal:
    weights_lib.check_exportable(toy_config(**fields), output_format)
  message = str(refusal.value)
  assert message.startswith(f"cannot export to {output_format}: {field_named}:")
  assert "\n" not in message
  weights_lib.check_exportable(toy_config(), output_format)  # the paper's model: exported
  weights_lib.check_exportable(toy_config(pre_layer_norm=True), "ctranslate2")


def teacher_forced_log_probs(model, params, sources, targets):
  """Ours: log P(target token | prefix, source) for each real target token, per sentence."""
  import jax
  import jax.numpy as jnp
  inputs = np.zeros((len(sources), max(map(len, sources))), np.int32)
  outputs = np.zeros((len(targets), max(map(len, targets))), np.int32)
  for i, (s, t) in enumerate(zip(sources, targets)):
    inputs[i, :len(s)], outputs[i, :len(t)] = s, t
  log_probs = np.asarray(jax.nn.log_softmax(model.apply({"params": params}, jnp.asarray(inputs),
                                                        jnp.asarray(outputs))))
  return inputs, outputs, [log_probs[i, np.arange(len(t)), t] for i, t in enumerate(targets)]


@pytest.mark.slow
def test_both_engines_score_a_sentence_as_ours(tmp_path):
  """Teacher-forced log-probabilities of a random model (post-LN for both engines, pre-LN for
  CTranslate2) agree to 1e-5; Marian's only with its layer norms at our epsilon; one weight
  mapped wrong (a transposed output projection) is seen at once."""
  require_the_engines()
  import ctranslate2
  import torch
  from aiayn_flax import train_step
  from aiayn_flax.export import to_ctranslate2, to_marian, vocabulary
  rng = np.random.default_rng(0)
  sources = [list(rng.integers(4, 20, size=n)) + [1] for n in (5, 9, 11)]
  targets = [list(rng.integers(4, 20, size=n)) + [1] for n in (7, 4, 10)]
  proto = vocabulary.symbols_model(20)
  pieces = vocabulary.pieces(proto)

  def ctranslate2_log_probs(weights, config, folder):
    to_ctranslate2.write(weights, config, proto, str(tmp_path / folder))
    scores = ctranslate2.Translator(str(tmp_path / folder)).score_batch(
        [[pieces[i] for i in s[:-1]] for s in sources],  # the engine appends EOS
        [[pieces[i] for i in t[:-1]] for t in targets])
    return [np.array(s.log_probs) for s in scores]

  def worst(theirs, ours):
    return max(np.max(np.abs(a - b)) for a, b in zip(theirs, ours))

  for pre_layer_norm in (True, False):  # the post-LN model's last: Marian's test reads it
    config = toy_config(pre_layer_norm=pre_layer_norm)
    model = train_step.make_model(config)
    params = train_step.init_params(model, 0)
    inputs, outputs, ours = teacher_forced_log_probs(model, params, sources, targets)
    weights = weights_lib.plain_weights(params, config)
    assert worst(ctranslate2_log_probs(weights, config, f"ct2_{pre_layer_norm}"), ours) < 1e-5
  wrong = copy.deepcopy(weights)
  kernel, bias = wrong["encoder"][0]["self_out"]
  wrong["encoder"][0]["self_out"] = (np.ascontiguousarray(kernel.T), bias)
  assert worst(ctranslate2_log_probs(wrong, config, "ct2_wrong"), ours) > 1e-2

  marian = to_marian.marian_model(weights, config)
  decoder_inputs = np.where(outputs == 0, 0, np.concatenate(
      [np.full((len(targets), 1), 3), outputs[:, :-1]], axis=1))

  def marian_log_probs():
    with torch.no_grad():
      logits = marian(input_ids=torch.tensor(inputs, dtype=torch.long),
                      attention_mask=torch.tensor(inputs != 0),
                      decoder_input_ids=torch.tensor(decoder_inputs, dtype=torch.long)).logits
    log_probs = torch.log_softmax(logits, -1).numpy()
    return [log_probs[i, np.arange(len(t)), t] for i, t in enumerate(targets)]

  # 2026-12-07: 7.2e-6 with torch's LayerNorm epsilon (1e-5), 9.5e-7 with ours (1e-6)
  assert worst(marian_log_probs(), ours) > 2e-6
  to_marian.set_layer_norm_epsilon(marian)
  assert worst(marian_log_probs(), ours) < 2e-6


def test_the_position_layout_permutation_is_marians():
  """Our table with its model dimension reordered is the one Marian computes (sin halves)."""
  from aiayn_flax import model as model_lib
  ours = model_lib.sinusoidal_positions(50, 16)[:, weights_lib.interleaved_to_halves(16)]
  position, j = np.arange(50)[:, None], np.arange(16)[None, :]
  angle = position / np.power(10000, 2 * (j // 2) / 16)
  marian = np.concatenate([np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])], axis=1)
  np.testing.assert_allclose(ours, marian, atol=1e-6)


def test_an_export_replaces_an_export_and_nothing_else(tmp_path):
  """--out is replaced where it is an earlier export (it has the record) or an empty folder;
  a folder holding anything else, a file, or a folder holding the run is refused, untouched."""
  from aiayn_flax.export import exporter
  workdir = tmp_path / "runs" / "toy"
  workdir.mkdir(parents=True)
  earlier, empty, other, a_file = (tmp_path / name for name in ("earlier", "empty", "other",
                                                                 "model.bin"))
  earlier.mkdir(), empty.mkdir(), other.mkdir()
  (earlier / exporter.RECORD).write_text("{}")
  (other / "notes.txt").write_text("mine")
  a_file.write_text("")
  for out in (earlier, empty, tmp_path / "absent", workdir / "export"):
    exporter.check_replaceable(str(out), str(workdir))
  for out, refusal in ((other, f"a folder that is not an export (no {exporter.RECORD}); not "
                               "replaced: remove it or choose another --out"),
                       (a_file, "exists and is not a folder; not replaced"),
                       (workdir, f"holds the run {workdir}; not replaced"),
                       (tmp_path / "runs", f"holds the run {workdir}; not replaced")):
    with pytest.raises(ValueError) as refused:
      exporter.check_replaceable(str(out), str(workdir))
    assert str(refused.value) == f"--out={out}: {refusal}"
  assert (other / "notes.txt").read_text() == "mine"


@pytest.mark.timeout(600)
def test_the_exported_run_translates_as_ours_through_each_engines_own_loaders(toy_run,
                                                                               tmp_path):
  require_the_engines()
  from aiayn_flax import run_dir
  from aiayn_flax.data import toy
  from aiayn_flax.export import engines, exporter
  from aiayn_flax.translator import Translator
  config, workdir, _ = toy_run
  ct2_dir, marian_dir = tmp_path / "ct2", tmp_path / "marian"
  result = run_script("export.py", f"--workdir={workdir}", "--format=ctranslate2",
                      f"--out={ct2_dir}")
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == (f"export.py: wrote {ct2_dir} (ctranslate2; parameters of "
                                   "steps [1000])")
  assert exporter.export_run(workdir, "marian", str(marian_dir)) == [1000]
  # evaluate.py's averaging, as evaluate.py reads it: the stored checkpoints ending at --step
  averaged = tmp_path / "averaged"
  assert exporter.export_run(workdir, "ctranslate2", str(averaged), average_last=2,
                             step=1000) == [500, 1000]
  assert json.loads((averaged / exporter.RECORD).read_text())["checkpoint_steps"] == [500, 1000]
  # An export in its place replaces it whole; a folder that is not an export is refused.
  exporter.export_run(workdir, "marian", str(averaged))
  assert "model.bin" not in {p.name for p in averaged.iterdir()}
  assert json.loads((averaged / exporter.RECORD).read_text())["format"] == "marian"
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="a folder that is not an export"):
    exporter.export_run(workdir, "ctranslate2", str(tmp_path / "mine"))
  assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]

  # What each ecosystem looks for. CTranslate2: the vocabulary of pieces, EOS appended to the
  # source by the engine, decoding from <s>, our epsilon.
  ct2_config = json.loads((ct2_dir / "config.json").read_text())
  assert {key: ct2_config[key] for key in ("add_source_eos", "add_source_bos",
                                           "decoder_start_token", "eos_token",
                                           "layer_norm_epsilon")} == {
      "add_source_eos": True, "add_source_bos": False, "decoder_start_token": "<s>",
      "eos_token": "</s>", "layer_norm_epsilon": 1e-6}
  vocab = json.loads((ct2_dir / "shared_vocabulary.json").read_text())
  assert vocab[:4] == ["<pad>", "</s>", "<unk>", "<s>"] and vocab[7] == "\u25817"
  assert {p.name for p in ct2_dir.iterdir()} >= {"model.bin", "sentencepiece.model"}
  # Marian: config.json and generation_config.json with our special ids, the tokenizer's files.
  assert {p.name for p in marian_dir.iterdir()} >= {
      "config.json", "generation_config.json", "model.safetensors", "source.spm",
      "target.spm", "vocab.json", "tokenizer_config.json"}
  generation = json.loads((marian_dir / "generation_config.json").read_text())
  assert {key: generation[key] for key in ("decoder_start_token_id", "eos_token_id",
                                           "pad_token_id", "forced_eos_token_id",
                                           "min_new_tokens")} == {
      "decoder_start_token_id": 3, "eos_token_id": 1, "pad_token_id": 0,
      "forced_eos_token_id": 1, "min_new_tokens": 1}

  model, params, _ = run_dir.load_model_and_params(workdir, config, 1)
  # 300 like the training's (up to 11 symbols, but from 1), 50 longer than any it saw (12-15
  # symbols: the same padded shape; the model rambles, with <unk> among its outputs)
  sources = (toy.reversal_pairs(300, config.model.vocab_size, 1, 11, seed=12345)[0] +
             toy.reversal_pairs(50, config.model.vocab_size, 12, 15, seed=1)[0])
  ours = Translator(model, params, run_dir.load_vocabulary(workdir, config), beam_size=1,
                    extra_length=config.decode_extra_length).translate(sources)
  for engine in (engines.CTranslate2Engine(str(ct2_dir)),
                 engines.MarianEngine(str(marian_dir))):
    theirs = engine.translate(sources)
    identical = np.mean([a == b for a, b in zip(ours, theirs)])
    assert identical >= MIN_IDENTICAL, (type(engine).__name__, identical)
