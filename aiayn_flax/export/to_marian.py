"""A Hugging Face MarianMTModel folder: config.json, generation_config.json, model.safetensors,
and its tokenizer's source.spm, target.spm, vocab.json and tokenizer_config.json.

What transformers' Marian classes compute (models/marian/modeling_marian.py) and how we meet it:
  * sinusoidal positions computed at load time, never saved, with sin in the first half of the
    model dimension and cos in the second; ours interleave them (sin even, cos odd), so every
    weight is written with its model dimension permuted (weights.permute_model_dimension);
  * post-LN layers (pre-LN runs are refused), ReLU, embeddings scaled by sqrt(d_model)
    (scale_embedding), one embedding shared by encoder, decoder and lm_head, a zero
    final_logits_bias;
  * nn.LayerNorm with torch's default epsilon, 1e-5, fixed in the code; ours is 1e-6. The
    config cannot say it: after loading, one line sets ours (set_layer_norm_epsilon);
  * generation: decoder start BOS (3), EOS 1, PAD 0; EOS forbidden at the first step and forced
    at the last (min_new_tokens, forced_eos_token_id), as our greedy search does. Our limit is
    per sentence (source pieces + EOS + decode_extra_length); generate's is per call: the config
    says max_new_tokens = dataset.max_length + decode_extra_length, the longest training input's.
"""
import json
import os
import tempfile

import numpy as np

from aiayn_flax import model as model_lib
from aiayn_flax.data import vocabulary
from aiayn_flax.export import vocabulary as export_vocabulary
from aiayn_flax.export import weights as weights_lib

MAX_POSITIONS = 1024  # MarianConfig's default table


def set_layer_norm_epsilon(model) -> None:
  """Every torch LayerNorm of `model` at our epsilon: docs/EXPORT.md's one line, which a user
  runs after from_pretrained."""
  import torch
  for module in model.modules():
    if isinstance(module, torch.nn.LayerNorm):
      module.eps = model_lib.LAYER_NORM_EPSILON


def marian_config(config):
  from transformers import MarianConfig
  m = config.model
  return MarianConfig(
      vocab_size=m.vocab_size, decoder_vocab_size=m.vocab_size, d_model=m.d_model,
      encoder_layers=m.num_layers, decoder_layers=m.num_layers,
      encoder_attention_heads=m.num_heads, decoder_attention_heads=m.num_heads,
      encoder_ffn_dim=m.d_ff, decoder_ffn_dim=m.d_ff, activation_function="relu",
      max_position_embeddings=MAX_POSITIONS, scale_embedding=True,
      share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
      dropout=m.dropout_rate, attention_dropout=m.attention_dropout_rate,
      pad_token_id=vocabulary.PAD_ID, eos_token_id=vocabulary.EOS_ID,
      bos_token_id=vocabulary.BOS_ID, decoder_start_token_id=vocabulary.BOS_ID,
      forced_eos_token_id=vocabulary.EOS_ID)


def generation_config(config):
  from transformers import GenerationConfig
  return GenerationConfig(
      decoder_start_token_id=vocabulary.BOS_ID, bos_token_id=vocabulary.BOS_ID,
      eos_token_id=vocabulary.EOS_ID, pad_token_id=vocabulary.PAD_ID,
      forced_eos_token_id=vocabulary.EOS_ID, min_new_tokens=1, num_beams=1, do_sample=False,
      max_new_tokens=min(MAX_POSITIONS - 1, config.dataset.max_length + config.decode_extra_length))


def _state_dict(weights: dict) -> dict:
  """MarianMTModel's parameter names -> float32 arrays (torch Linear weights are [out, in])."""
  state = {"model.shared.weight": weights["embedding"]}

  def linear(prefix, w_b):
    state[f"{prefix}.weight"] = np.ascontiguousarray(w_b[0].T)
    state[f"{prefix}.bias"] = w_b[1]

  def norm(prefix, scale_bias):
    state[f"{prefix}.weight"], state[f"{prefix}.bias"] = scale_bias

  for side in ("encoder", "decoder"):
    for i, w in enumerate(weights[side]):
      prefix = f"model.{side}.layers.{i}"
      attentions = [("self_attn", "self")] + ([("encoder_attn", "cross")]
                                              if side == "decoder" else [])
      for theirs, ours in attentions:
        for projection in ("q", "k", "v"):
          linear(f"{prefix}.{theirs}.{projection}_proj", w[f"{ours}_{projection}"])
        linear(f"{prefix}.{theirs}.out_proj", w[f"{ours}_out"])
        norm(f"{prefix}.{theirs}_layer_norm", w[f"{ours}_norm"])
      linear(f"{prefix}.fc1", w["ffn_in"])
      linear(f"{prefix}.fc2", w["ffn_out"])
      norm(f"{prefix}.final_layer_norm", w["ffn_norm"])
  return state


def marian_model(weights: dict, config):
  """A MarianMTModel holding the plain weights (in our layout: permuted here)."""
  import torch
  from transformers import MarianMTModel
  permuted = weights_lib.permute_model_dimension(
      weights, weights_lib.interleaved_to_halves(config.model.d_model))
  model = MarianMTModel(marian_config(config))
  model.generation_config = generation_config(config)
  parameters = model.state_dict()
  ours = _state_dict(permuted)
  with torch.no_grad():
    for name, value in ours.items():
      if parameters[name].shape != value.shape:
        raise ValueError(f"{name}: ours {value.shape}, Marian's {tuple(parameters[name].shape)}")
      parameters[name].copy_(torch.from_numpy(np.array(value, np.float32)))
    model.final_logits_bias.zero_()
  # Every parameter is ours but the tied copies of the embedding and the computed positions.
  unset = {name for name, _ in model.named_parameters()} - set(ours) - {
      "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
      "lm_head.weight"}
  unset = {name for name in unset if "embed_positions" not in name}
  if unset:
    raise ValueError(f"Marian parameters the export does not set: {sorted(unset)}")
  return model.eval()


def write(weights: dict, config, proto: bytes, out: str) -> str:
  """The model folder `out`, written by transformers' own save_pretrained."""
  from transformers import MarianTokenizer
  os.makedirs(out, exist_ok=True)
  marian_model(weights, config).save_pretrained(out)
  pieces = export_vocabulary.pieces(proto)
  with tempfile.TemporaryDirectory() as scratch:
    spm_path, vocab_path = os.path.join(scratch, "vocab.model"), os.path.join(scratch, "v.json")
    with open(spm_path, "wb") as f:
      f.write(proto)
    with open(vocab_path, "w", encoding="utf-8") as f:
      json.dump({piece: i for i, piece in enumerate(pieces)}, f, ensure_ascii=False)
    tokenizer = MarianTokenizer(spm_path, spm_path, vocab_path,
                                source_lang=config.dataset.get("source_lang", None),
                                target_lang=config.dataset.get("target_lang", None),
                                bos_token=pieces[vocabulary.BOS_ID],
                                model_max_length=MAX_POSITIONS)
    tokenizer.save_pretrained(out)
  return out
