"""Attention maps and training curves drawn from the toy run (its vocabulary's pieces are the
space-separated symbols)."""
import os

import matplotlib.image
import numpy as np
import pytest

from aiayn_flax import attention_maps, plot, run_dir
from aiayn_flax.translator import Translator
from conftest import run_script

SOURCE = "4 9 15 6 11 7"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def toy_model(toy_run):
  config, workdir, _ = toy_run
  model, params, _ = run_dir.load_model_and_params(workdir, config, 1)
  return config, model, params, run_dir.load_vocabulary(workdir, config)


@pytest.fixture(scope="module")
def maps(toy_model):
  config, model, params, vocab = toy_model
  return attention_maps.attention_maps(model, params, vocab, SOURCE,
                                       extra_length=config.decode_extra_length)


def pixel_size(path) -> tuple[int, int]:
  """(width, height) of a PNG, read back with matplotlib."""
  with open(path, "rb") as f:
    assert f.read(8) == PNG_SIGNATURE
  height, width = matplotlib.image.imread(path).shape[:2]
  return width, height


def test_maps_are_labelled_with_pieces_and_padding_is_stripped(maps, toy_model):
  config, model, params, vocab = toy_model
  greedy = Translator(model, params, vocab, beam_size=1, extra_length=config.decode_extra_length)
  assert maps.target == greedy.translate([SOURCE])[0]
  assert maps.source_pieces == SOURCE.split() + ["</s>"]
  assert maps.decoder_input_pieces == ["<s>"] + maps.target.split()
  assert maps.target_pieces == maps.target.split() + ["</s>"]
  assert maps.num_layers == config.model.num_layers and maps.num_heads == config.model.num_heads
  s, t, h = len(SOURCE.split()) + 1, len(maps.target_pieces), config.model.num_heads
  for layer in range(maps.num_layers):
    assert maps.encoder[layer].shape == (h, s, s)
    assert maps.decoder[layer].shape == (h, t, t)
    assert maps.cross[layer].shape == (h, t, s)


def test_every_attention_row_sums_to_one(maps):
  for kind in attention_maps.KINDS:
    for weights in maps.weights(kind):
      assert weights.dtype == np.float32
      np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-5, err_msg=kind)


def test_decoder_self_attention_is_zero_above_the_diagonal(maps):
  for weights in maps.decoder:
    above = np.triu(np.ones(weights.shape[-2:], dtype=bool), k=1)
    assert np.all(weights[:, above] == 0.0)


def test_a_given_target_is_teacher_forced(toy_model):
  config, model, params, vocab = toy_model
  maps = attention_maps.attention_maps(model, params, vocab, SOURCE, "7 11 6")
  assert maps.target_pieces == ["7", "11", "6", "</s>"]
  assert maps.cross[0].shape == (config.model.num_heads, 4, 7)


def test_heat_maps_have_the_promised_pixel_size(maps, tmp_path):
  heads = maps.num_heads  # 4: a 2 x 2 grid
  assert attention_maps.grid_shape(heads) == (2, 2)
  grid = attention_maps.draw_attention(maps, str(tmp_path / "grid.png"), "cross", -1,
                                       panel_inches=3.5, dpi=80)
  assert pixel_size(grid) == (2 * 280, 2 * 280)
  one = attention_maps.draw_attention(maps, str(tmp_path / "one.png"), "encoder", 0, head=1)
  side = round(attention_maps.default_panel_inches(7, 7) * 100)
  assert pixel_size(one) == (side, side)
  paths = attention_maps.draw_attention_files(maps, str(tmp_path / "all"))
  assert [os.path.basename(p) for p in paths] == [
      f"{kind}_layer{maps.num_layers - 1}_heads.png" for kind in attention_maps.KINDS]
  for kind, path in zip(attention_maps.KINDS, paths):
    side = round(attention_maps.default_panel_inches(*maps.weights(kind)[-1].shape[-2:]) * 100)
    assert pixel_size(path) == (2 * side, 2 * side), kind


def test_a_layer_or_head_out_of_range_says_what_exists(maps, tmp_path):
  with pytest.raises(ValueError, match="the model has 2 layers"):
    attention_maps.draw_attention(maps, str(tmp_path / "x.png"), "encoder", layer=2)
  with pytest.raises(ValueError, match="the model has 4 heads"):
    attention_maps.draw_attention(maps, str(tmp_path / "x.png"), "encoder", head=4)
  with pytest.raises(ValueError, match="unknown attention kind"):
    attention_maps.draw_attention(maps, str(tmp_path / "x.png"), "self")


def test_visualize_attention_writes_pngs_and_prints_their_paths(toy_run, tmp_path):
  _, workdir, _ = toy_run
  result = run_script("visualize_attention.py", f"--workdir={workdir}", f"--sentence={SOURCE}",
                      "--kind=all", "--layer=0", "--head=all", f"--out={tmp_path}")
  assert result.returncode == 0, result.stderr[-2000:]
  paths = result.stdout.split()
  assert sorted(os.path.basename(p) for p in paths) == [
      "cross_layer0_heads.png", "decoder_layer0_heads.png", "encoder_layer0_heads.png"]
  for path in paths:
    assert os.path.dirname(path) == str(tmp_path)
    width, height = pixel_size(path)
    assert width == height > 0


@pytest.mark.slow
def test_visualize_attention_without_checkpoint_says_what_to_do(tmp_path):
  result = run_script("visualize_attention.py", f"--workdir={tmp_path}", "--sentence=a b")
  assert result.returncode != 0
  last_line = result.stderr.strip().splitlines()[-1]
  assert last_line.startswith("visualize_attention.py: error:")
  assert "no checkpoint; train first" in last_line


def test_training_curves_are_read_from_the_event_files(toy_run):
  config, workdir, _ = toy_run
  scalars = plot.read_scalars(workdir)
  steps, losses = scalars["train/loss"]
  assert list(steps) == list(range(config.log_every_steps, config.num_train_steps + 1,
                                   config.log_every_steps))
  assert losses[-1] < losses[0]
  assert list(scalars["valid/bleu"][0]) == [config.num_train_steps]


def test_plot_command_writes_a_png_of_the_training_curves(toy_run, tmp_path):
  _, workdir, _ = toy_run
  out = tmp_path / "curves.png"
  result = run_script("-m", "aiayn_flax.plot", f"--workdir={workdir}", f"--out={out}")
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == str(out)
  assert pixel_size(out) == (1100, 400)


@pytest.mark.slow
def test_plot_command_without_metrics_says_so(tmp_path):
  result = run_script("-m", "aiayn_flax.plot", f"--workdir={tmp_path}")
  assert result.returncode != 0
  assert "no TensorBoard event files" in result.stderr.strip().splitlines()[-1]


def test_plot_of_a_cloud_workdir_says_how_to_read_it():
  from aiayn_flax import plot
  with pytest.raises(FileNotFoundError, match=r"gs://bucket/run/: plot reads a local folder.*"
                     r"gs://bucket/run/events\.out\.tfevents\.\*.*tensorboard --logdir gs://"):
    plot.read_scalars("gs://bucket/run/")
