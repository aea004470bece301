"""Analytic parameter and FLOP counts, for --dry_run, MFU and docs/TRAIN.md's Table 3 column."""
from aiayn_flax.model import head_dims


def parameter_count(model) -> int:
  """Parameters of the Transformer built from the `model` config block (weights and biases)."""
  d, f, h, n = model.d_model, model.d_ff, model.num_heads, model.num_layers
  k, v = head_dims(model)
  layer_norm = 2 * d
  self_attention = d * h * (2 * k + v) + h * (2 * k + v) + h * v * d + d
  cross_attention = (d * h * k + h * k) + (d * h * (k + v) + h * (k + v)) + h * v * d + d
  ffn = d * f + f + f * d + d
  encoder_layer = self_attention + ffn + 2 * layer_norm
  decoder_layer = self_attention + cross_attention + ffn + 3 * layer_norm
  total = model.vocab_size * d + n * (encoder_layer + decoder_layer)
  if model.positions == "learned":
    total += 2 * model.max_positions * d  # one table each for the encoder and the decoder
  if model.pre_layer_norm:
    total += 2 * layer_norm
  return total


def forward_flops(model, batch: int, source_length: int, target_length: int) -> int:
  """Multiply-adds x2 of one forward pass on a [batch, length] pair, padding included."""
  d, f, h, n, vocab = model.d_model, model.d_ff, model.num_heads, model.num_layers, model.vocab_size
  k, v = head_dims(model)
  s, t = source_length, target_length
  projections = d * h * (2 * k + v) + h * v * d  # fused QKV + output, per token
  ffn = 2 * d * f
  encoder_layer = s * (projections + ffn) + s * s * h * (k + v)
  decoder_layer = (t * (projections + ffn) + t * t * h * (k + v)  # self-attention, FFN
                   + t * (d * h * k + h * v * d) + s * d * h * (k + v) + t * s * h * (k + v))
  output_projection = t * d * vocab  # tied to the embedding
  return 2 * batch * (n * (encoder_layer + decoder_layer) + output_projection)


def train_flops(model, batch: int, source_length: int, target_length: int) -> int:
  """Forward + backward (twice the forward's FLOPs)."""
  return 3 * forward_flops(model, batch, source_length, target_length)
