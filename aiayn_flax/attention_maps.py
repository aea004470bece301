"""What the model attends to, for one sentence: the attention weights of every layer and head,
labelled with subword pieces, and heat maps of them like the paper's figures 3-5.

The model sows its attention weights (collection "intermediates", after the mask and the
softmax); a teacher-forced forward pass on (source, target) collects them. Without a target,
the target is the model's own greedy translation, so the maps show how it produced it.

Axis labels: encoder positions are the source's pieces and "</s>"; decoder self-attention is
labelled with the decoder's inputs ("<s>" and the target's pieces) on both axes, so the causal
mask shows as the zero upper triangle; encoder-decoder attention rows are labelled with the
piece each decoder position predicts (the target's pieces and "</s>"), so they read as an
alignment of each output piece with the source.
"""
import dataclasses
import math
import os

import jax
import numpy as np
from matplotlib.figure import Figure  # no pyplot: no global state, no display backend needed

from aiayn_flax.data.vocabulary import EOS_ID, PAD_ID
from aiayn_flax.translator import Translator, padded_source_length

KINDS = ("encoder", "decoder", "cross")
TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
          "cross": "encoder-decoder attention"}
AXIS_NAMES = {"encoder": ("source", "source"), "decoder": ("decoder input", "decoder input"),
              "cross": ("predicted target", "source")}  # (rows, columns)
EOS_LABEL, BOS_LABEL = "</s>", "<s>"


@dataclasses.dataclass(frozen=True)
class AttentionMaps:
  """Attention weights of one sentence pair, padding stripped: one [H, Q, L] float32 array per
  layer and kind (S source positions, T target positions; each row sums to 1)."""
  source_pieces: list[str]  # S labels: the source's pieces, "</s>"
  decoder_input_pieces: list[str]  # T labels: "<s>", the target's pieces
  target_pieces: list[str]  # T labels: the target's pieces, "</s>" (what each position predicts)
  target: str  # the text the decoder was fed (the greedy translation when none was given)
  encoder: list[np.ndarray]  # per layer [H, S, S]
  decoder: list[np.ndarray]  # per layer [H, T, T]
  cross: list[np.ndarray]  # per layer [H, T, S]

  @property
  def num_layers(self) -> int:
    return len(self.encoder)

  @property
  def num_heads(self) -> int:
    return self.encoder[0].shape[0]

  def weights(self, kind: str) -> list[np.ndarray]:
    return getattr(self, _check_kind(kind))

  def labels(self, kind: str) -> tuple[list[str], list[str]]:
    """(row labels, column labels): the queries' and the keys' pieces."""
    return {"encoder": (self.source_pieces, self.source_pieces),
            "decoder": (self.decoder_input_pieces, self.decoder_input_pieces),
            "cross": (self.target_pieces, self.source_pieces)}[_check_kind(kind)]


def _check_kind(kind: str) -> str:
  if kind not in KINDS:
    raise ValueError(f"unknown attention kind {kind!r}; expected one of {', '.join(KINDS)}")
  return kind


def _padded_row(ids: list[int]) -> np.ndarray:
  """[1, L] ids padded as the translator pads them, so few lengths compile."""
  row = np.full((1, padded_source_length(len(ids))), PAD_ID, np.int32)
  row[0, :len(ids)] = ids
  return row


class AttentionRecorder:
  """Records AttentionMaps for sentences with one model; compiled functions are reused."""

  def __init__(self, model, params, vocab, *, extra_length: int = 50):
    self.model, self.params, self.vocab = model, params, vocab
    self.extra_length = extra_length
    self._translator = None

    @jax.jit
    def forward(params, inputs, targets):
      # inputs: [1, S'], targets: [1, T'] (padded) -> the sown weights, each [1, H, Q, L]
      _, variables = model.apply({"params": params}, inputs, targets, mutable=["intermediates"])
      return variables["intermediates"]

    self._forward = forward

  def translate(self, source: str) -> str:
    if self._translator is None:
      self._translator = Translator(self.model, self.params, self.vocab, beam_size=1,
                                    extra_length=self.extra_length, batch_size=1)
    return self._translator.translate([source])[0]

  def record(self, source: str, target: str | None = None) -> AttentionMaps:
    """Attention weights for source, teacher-forced on target (default: greedy translation)."""
    source = source.strip()
    if not source:
      raise ValueError("the source sentence is empty")
    target = self.translate(source) if target is None else target.strip()
    source_ids, source_pieces = self._ids_and_pieces(source)
    target_ids, target_pieces = self._ids_and_pieces(target)
    intermediates = self._forward(self.params, _padded_row(source_ids), _padded_row(target_ids))
    s, t = len(source_ids), len(target_ids)
    layers = range(self.model.config.num_layers)
    return AttentionMaps(
        source_pieces=source_pieces,
        decoder_input_pieces=[BOS_LABEL] + target_pieces[:-1],  # shifted right, as in training
        target_pieces=target_pieces,
        target=target,
        encoder=[_sown(intermediates, "encoder", i, "self_attention")[:, :s, :s] for i in layers],
        decoder=[_sown(intermediates, "decoder", i, "self_attention")[:, :t, :t] for i in layers],
        cross=[_sown(intermediates, "decoder", i, "cross_attention")[:, :t, :s] for i in layers])

  def _ids_and_pieces(self, text: str) -> tuple[list[int], list[str]]:
    """Ids ending in EOS and their labels, ending in "</s>"."""
    ids, pieces = self.vocab.encode(text), self.vocab.pieces(text)
    if len(ids) != len(pieces):
      raise ValueError(f"{text!r}: {len(ids)} ids but {len(pieces)} pieces")
    return ids + [EOS_ID], pieces + [EOS_LABEL]


def _sown(intermediates, stack: str, layer: int, sublayer: str) -> np.ndarray:
  """[H, Q', L'] weights of one attention sublayer (the last value sown, first batch row)."""
  return np.asarray(intermediates[stack][f"layer_{layer}"][sublayer]["attention_weights"][-1][0])


def attention_maps(model, params, vocab, source: str, target: str | None = None, *,
                   extra_length: int = 50) -> AttentionMaps:
  """AttentionMaps of one sentence; see AttentionRecorder to record several."""
  return AttentionRecorder(model, params, vocab, extra_length=extra_length).record(source, target)


def resolve_layer(maps: AttentionMaps, layer: int) -> int:
  """A layer index in [0, num_layers), from one that may count from the end (-1: the last)."""
  n = maps.num_layers
  if not -n <= layer < n:
    raise ValueError(f"layer {layer}: the model has {n} layers (0 to {n - 1}, or -1 for the last)")
  return layer % n


def _check_head(maps: AttentionMaps, head: int) -> int:
  if not 0 <= head < maps.num_heads:
    raise ValueError(f"head {head}: the model has {maps.num_heads} heads "
                     f"(0 to {maps.num_heads - 1})")
  return head


def grid_shape(num_panels: int) -> tuple[int, int]:
  """(rows, columns) of panels: square up to 4 panels, then 4 columns."""
  columns = math.ceil(math.sqrt(num_panels)) if num_panels <= 4 else 4
  return math.ceil(num_panels / columns), columns


def default_panel_inches(num_rows: int, num_columns: int) -> float:
  """Side of one head's panel: room for about 4 labels an inch, at least 3 inches."""
  return max(3.0, 0.25 * max(num_rows, num_columns) + 1.0)


def _tick_labels(pieces: list[str]) -> list[str]:
  """Pieces as matplotlib shows them literally: a "$" would otherwise start math mode."""
  return [piece.replace("$", r"\$") for piece in pieces]


def draw_attention(maps: AttentionMaps, path: str, kind: str = "encoder", layer: int = -1,
                   head: int | None = None, *, panel_inches: float | None = None,
                   dpi: int = 100) -> str:
  """Writes a PNG heat map of one head, or of every head in a grid (head=None), of one layer.

  The image is exactly (columns x panel_inches x dpi) by (rows x panel_inches x dpi) pixels,
  with grid_shape(number of heads drawn) panels. All panels share one colour scale, from 0 to
  the largest weight drawn. Returns path.
  """
  layer = resolve_layer(maps, layer)
  weights = maps.weights(kind)[layer]  # [H, Q, L]
  heads = range(maps.num_heads) if head is None else [_check_head(maps, head)]
  rows, columns = (_tick_labels(labels) for labels in maps.labels(kind))
  grid_rows, grid_columns = grid_shape(len(heads))
  panel = panel_inches or default_panel_inches(len(rows), len(columns))
  fig = Figure(figsize=(grid_columns * panel, grid_rows * panel), dpi=dpi, layout="constrained")
  axes = fig.subplots(grid_rows, grid_columns, squeeze=False)
  vmax = float(max(weights[h].max() for h in heads)) or 1.0
  fontsize = float(np.clip(panel * 72 * 0.55 / max(len(rows), len(columns)), 4, 9))
  for ax, h in zip(axes.flat, heads):
    image = ax.imshow(weights[h], cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest")
    ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(rows)), rows, fontsize=fontsize)
    ax.set_title(f"head {h}", fontsize=9)
  for ax in axes.flat[len(heads):]:
    ax.axis("off")
  fig.colorbar(image, ax=axes, shrink=0.6)
  fig.suptitle(f"{TITLES[kind]}, layer {layer}", fontsize=10)  # layers count from 0
  row_name, column_name = AXIS_NAMES[kind]
  fig.supxlabel(f"keys: {column_name}", fontsize=9)
  fig.supylabel(f"queries: {row_name}", fontsize=9)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=dpi)  # no bbox_inches="tight": the pixel size stays as promised
  return path


def draw_attention_files(maps: AttentionMaps, out_dir: str, kinds=KINDS, layer: int = -1,
                         head: int | None = None, **draw_options) -> list[str]:
  """draw_attention for each kind, into out_dir/KIND_layerN_heads.png (or _headH.png)."""
  layer = resolve_layer(maps, layer)
  suffix = "heads" if head is None else f"head{head}"
  return [draw_attention(maps, os.path.join(out_dir, f"{kind}_layer{layer}_{suffix}.png"),
                         kind, layer, head, **draw_options) for kind in kinds]
