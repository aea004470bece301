"""A CTranslate2 model folder: model.bin, config.json, shared_vocabulary.json, and the
SentencePiece model that makes its pieces (sentencepiece.model).

Written through CTranslate2's own Converter (its `_load` returns a TransformerSpec that we fill),
not its Marian converter, which starts the decoder from a zero embedding: ours starts from
BOS's. What the spec is told (ctranslate2/specs/transformer_spec.py, model_spec.py):
  * post-LN or pre-LN layers, ReLU, embeddings scaled by sqrt(d_model) (its default), one
    embedding matrix for the encoder, the decoder and the output projection (aliased once);
  * the position table as we compute it (sin on even dimensions, cos on odd), stored: the
    engine adds its row t at position t, the decoder's BOS at 0 as ours;
  * the layer norm's epsilon, model.py's (1e-6), in its config's layer_norm_epsilon;
  * add_source_eos: the engine appends </s> to the pieces a user passes, as our input does,
    and starts decoding from <s> (BOS, id 3).
"""
import os
import tempfile

import numpy as np

from aiayn_flax import model as model_lib
from aiayn_flax.data import vocabulary
from aiayn_flax.export import vocabulary as export_vocabulary

# Rows of the stored position table: inputs up to 1024 pieces (CTranslate2's default
# max_input_length) and outputs of 1024 + decode_extra_length.
POSITIONS = 2048


def _linear(spec, w_b):
  """Our (W [in, out], b) into a LinearSpec, whose weight is [out, in]."""
  spec.weight = np.ascontiguousarray(w_b[0].T)
  spec.bias = w_b[1]


def _fused(spec, parts):
  spec.weight = np.ascontiguousarray(np.concatenate([w.T for w, _ in parts], axis=0))
  spec.bias = np.concatenate([b for _, b in parts])


def _norm(spec, scale_bias):
  spec.gamma, spec.beta = scale_bias


def transformer_spec(weights: dict, config, pieces: list[str]):
  """The TransformerSpec of the plain weights (weights.plain_weights), its config and
  vocabulary set."""
  from ctranslate2.specs import transformer_spec as specs
  m = config.model
  pre_norm = bool(m.pre_layer_norm)
  encoder = specs.TransformerEncoderSpec(m.num_layers, m.num_heads, pre_norm=pre_norm)
  decoder = specs.TransformerDecoderSpec(m.num_layers, m.num_heads, pre_norm=pre_norm)
  table = model_lib.sinusoidal_positions(POSITIONS, m.d_model)
  for side, plain in ((encoder, weights["encoder"]), (decoder, weights["decoder"])):
    side.position_encodings.encodings = table
    if pre_norm:
      _norm(side.layer_norm, weights["encoder_norm" if side is encoder else "decoder_norm"])
    for layer, w in zip(side.layer, plain):
      _fused(layer.self_attention.linear[0], [w["self_q"], w["self_k"], w["self_v"]])
      _linear(layer.self_attention.linear[1], w["self_out"])
      _norm(layer.self_attention.layer_norm, w["self_norm"])
      if side is decoder:
        _linear(layer.attention.linear[0], w["cross_q"])
        _fused(layer.attention.linear[1], [w["cross_k"], w["cross_v"]])
        _linear(layer.attention.linear[2], w["cross_out"])
        _norm(layer.attention.layer_norm, w["cross_norm"])
      _linear(layer.ffn.linear_0, w["ffn_in"])
      _linear(layer.ffn.linear_1, w["ffn_out"])
      _norm(layer.ffn.layer_norm, w["ffn_norm"])
  encoder.embeddings[0].weight = weights["embedding"]
  decoder.embeddings.weight = weights["embedding"]
  decoder.projection.weight = weights["embedding"]  # 3.4: tied, no bias
  spec = specs.TransformerSpec(encoder, decoder)
  spec.config.layer_norm_epsilon = model_lib.LAYER_NORM_EPSILON
  spec.config.unk_token = pieces[vocabulary.UNK_ID]
  spec.config.bos_token = pieces[vocabulary.BOS_ID]
  spec.config.eos_token = pieces[vocabulary.EOS_ID]
  spec.config.decoder_start_token = pieces[vocabulary.BOS_ID]
  spec.config.add_source_bos = False
  spec.config.add_source_eos = True
  spec.register_source_vocabulary(pieces)
  spec.register_target_vocabulary(pieces)
  return spec


def write(weights: dict, config, proto: bytes, out: str) -> str:
  """The model folder `out` (exporter.write_export: a new folder), float32: CTranslate2
  quantizes when it loads (compute_type="int8")."""
  from ctranslate2.converters.converter import Converter
  spec = transformer_spec(weights, config, export_vocabulary.pieces(proto))

  class RunConverter(Converter):
    def _load(self):
      return spec

  with tempfile.TemporaryDirectory() as scratch:
    spm_path = os.path.join(scratch, "sentencepiece.model")
    with open(spm_path, "wb") as f:
      f.write(proto)
    spec.register_file(spm_path)
    return RunConverter().convert(out, force=True)
