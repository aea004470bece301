"""Which runs can be exported, and their parameters in a layout both exporters read.

The plain layout (`plain_weights`): numpy float32 arrays, every projection as `x @ W + b` with W
[in, out], the heads' outputs in head-major order (head h's feature k at h * d_k + k), which is
the order in which both engines split a projection into heads:

  embedding [V, D]: shared by the encoder, the decoder and the pre-softmax projection (3.4)
  encoder[i]: self_q, self_k, self_v, self_out, self_norm, ffn_in, ffn_out, ffn_norm
  decoder[i]: the same, and cross_q, cross_k, cross_v, cross_out, cross_norm between them
  encoder_norm, decoder_norm: the final layer norms of a pre-LN model (None otherwise)

A projection is (W, b), a layer norm (scale, bias).
"""
import numpy as np
from flax import traverse_util

from aiayn_flax import model as model_lib


def refusals(config, output_format: str) -> list[str]:
  """One line per reason the run cannot be exported to `output_format`, each naming the config
  field: what neither engine's layers compute, or what the target lacks."""
  m = config.model
  d_k, d_v = model_lib.head_dims(m)
  per_head = m.d_model // m.num_heads
  problems = []
  if d_k != d_v:
    problems.append(f"model.qk_dim={m.qk_dim}, model.v_dim={m.v_dim}: d_k {d_k} != d_v {d_v}; "
                    f"{output_format} has one head size for queries, keys and values")
  elif d_k != per_head or per_head * m.num_heads != m.d_model:
    problems.append(f"model.qk_dim={m.qk_dim}: heads of {d_k} x {m.num_heads} are not "
                    f"d_model={m.d_model}; {output_format}'s heads split d_model")
  if m.positions != "sinusoidal":
    problems.append(f"model.positions={m.positions!r}: the export writes sinusoidal positions "
                    "only")
  if m.pre_layer_norm and output_format == "marian":
    problems.append("model.pre_layer_norm=True: Marian's layers are post-LN only "
                    "(export --format=ctranslate2, which has pre-LN layers)")
  return problems


def check_exportable(config, output_format: str) -> None:
  """Raises ValueError with the first refusal, one line (export.py prints it)."""
  problems = refusals(config, output_format)
  if problems:
    raise ValueError(f"cannot export to {output_format}: {problems[0]}")


def _projection(kernel, bias):
  """A DenseGeneral's [D, H, K] kernel and [H, K] bias -> ([D, H*K], [H*K]); an output
  projection's [H, V, D] kernel -> [H*V, D]."""
  kernel, bias = np.asarray(kernel, np.float32), np.asarray(bias, np.float32)
  if kernel.ndim == 3 and bias.ndim == 2:
    return kernel.reshape(kernel.shape[0], -1), bias.reshape(-1)
  return kernel.reshape(-1, kernel.shape[-1]), bias


def _norm(params):
  return (np.asarray(params["scale"], np.float32), np.asarray(params["bias"], np.float32))


def _split_columns(w_b, sizes):
  """(W [D, H, a+b+...], b [H, a+b+...]) split per head along the last axis -> one
  (W [D, H*a], b [H*a]) per size: our fused kernels keep each head's q, k, v together."""
  kernel, bias = (np.asarray(x, np.float32) for x in w_b)
  bounds = np.cumsum(sizes)[:-1]
  return [_projection(k, b) for k, b in zip(np.split(kernel, bounds, axis=-1),
                                             np.split(bias, bounds, axis=-1))]


def _attention(params, names, d_k, d_v):
  if "qkv" in params:
    q, k, v = _split_columns((params["qkv"]["kernel"], params["qkv"]["bias"]), [d_k, d_k, d_v])
  else:
    q = _projection(params["query"]["kernel"], params["query"]["bias"])
    k, v = _split_columns((params["key_value"]["kernel"], params["key_value"]["bias"]),
                          [d_k, d_v])
  out = _projection(params["out"]["kernel"], params["out"]["bias"])
  return dict(zip(names, (q, k, v, out)))


def _only_norm(residual):
  """The one layer norm inside a Residual block, whatever Flax named it."""
  (norm,) = residual.values()
  return _norm(norm)


def _ffn(params):
  return {"ffn_in": _projection(params["inner"]["kernel"], params["inner"]["bias"]),
          "ffn_out": _projection(params["outer"]["kernel"], params["outer"]["bias"])}


def plain_weights(params, config) -> dict:
  """The plain layout (module docstring) of a run's parameters (the `params` collection)."""
  d_k, d_v = model_lib.head_dims(config.model)
  params = traverse_util.unflatten_dict(traverse_util.flatten_dict(params))  # plain dicts
  self_names = ("self_q", "self_k", "self_v", "self_out")
  encoder, decoder = [], []
  for i in range(config.model.num_layers):
    layer = params["encoder"][f"layer_{i}"]
    encoder.append({**_attention(layer["self_attention"], self_names, d_k, d_v),
                    "self_norm": _only_norm(layer["attention_residual"]),
                    **_ffn(layer["ffn"]), "ffn_norm": _only_norm(layer["ffn_residual"])})
    layer = params["decoder"][f"layer_{i}"]
    decoder.append({**_attention(layer["self_attention"], self_names, d_k, d_v),
                    "self_norm": _only_norm(layer["self_attention_residual"]),
                    **_attention(layer["cross_attention"],
                                 ("cross_q", "cross_k", "cross_v", "cross_out"), d_k, d_v),
                    "cross_norm": _only_norm(layer["cross_attention_residual"]),
                    **_ffn(layer["ffn"]), "ffn_norm": _only_norm(layer["ffn_residual"])})
  final = lambda side: (_norm(params[side]["final_norm"])  # noqa: E731
                        if config.model.pre_layer_norm else None)
  return {"embedding": np.asarray(params["shared_embedding"]["embedding"], np.float32),
          "encoder": encoder, "decoder": decoder,
          "encoder_norm": final("encoder"), "decoder_norm": final("decoder")}


def interleaved_to_halves(d_model: int) -> np.ndarray:
  """The order of the model dimension that puts our positions' sines (even dimensions) first
  and their cosines (odd) second, Marian's layout: halves[j] is our dimension at Marian's j."""
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def permute_model_dimension(weights: dict, order: np.ndarray) -> dict:
  """The same network with its model dimension (the residual stream) reordered: every array's
  axes of size D that carry it are taken in `order`. An exact symmetry: a layer norm's
  statistics and the tied output projection's dot products do not depend on the order, and
  the attention heads and FFN units are untouched."""
  def projection(name, w_b):
    w, b = w_b
    if name in ("ffn_in",) or name.endswith(("_q", "_k", "_v")):
      return w[order, :], b  # reads the residual stream
    return w[:, order], b[order]  # ffn_out and *_out write it
  def layer(params):
    return {name: ((value[0][order], value[1][order]) if name.endswith("_norm")
                   else projection(name, value)) for name, value in params.items()}
  norm = lambda n: None if n is None else (n[0][order], n[1][order])  # noqa: E731
  return {"embedding": weights["embedding"][:, order],
          "encoder": [layer(p) for p in weights["encoder"]],
          "decoder": [layer(p) for p in weights["decoder"]],
          "encoder_norm": norm(weights["encoder_norm"]),
          "decoder_norm": norm(weights["decoder_norm"])}
