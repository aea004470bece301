"""The PyTorch peer of bench/train_speed.py: the same model trained on the same batches, timed
in a process of its own, on request.

  bench/train_speed.py starts it and talks to it; by hand (one JSON request a line on stdin,
  one JSON answer a line on stdout):
  echo '{"model": {"vocab_size": 8000, "d_model": 128, "d_ff": 512, "num_heads": 4,
         "num_layers": 4, "dropout_rate": 0.1}, "label_smoothing": 0.1, "rows": 91,
         "length": 32, "steps": 5}' | .bench_venv/bin/python bench/torch_peer.py

A request names the model's shape and the batch shape (train_speed.py copies both from our
config, so the two sides cannot drift apart), and optionally `"compile": true` (the model and
its loss through `torch.compile`, inductor's default mode, as a PyTorch user on a CPU would) or
`"autocast": "bfloat16"` (the forward pass under torch.autocast, the peer of our bf16 compute);
the first request for a setting builds the model and runs two warm-up steps (the first one
compiles: its time is `warmup_seconds`), later ones reuse it. The answer gives the parameter
count, the warm-up time and the seconds per training step over `steps` steps.

The model is the paper's, written with torch.nn's layers: post-LN encoder and decoder layers
(ReLU, dropout on every sublayer output and on the embeddings only), no final LayerNorm (as
ours with post-LN), one embedding for source, target and the pre-softmax projection, scaled by
sqrt(d_model), sinusoidal positions, label-smoothed cross-entropy over real target tokens, Adam
(0.9, 0.98, 1e-9). Batches come from bench/synthetic_batches.py, the module our side uses.
float32 on the CPU. `"device": "cuda"` runs it on the GPU (bench/device_check.py's peer), its
timings closed by a synchronize.

torch is not a dependency of the project: install the CPU build into a venv of its own,
`python3.11 -m venv .bench_venv && .bench_venv/bin/pip install torch==2.13.0 numpy` with the
CPU wheel (PyTorch's CPU index; PyPI's Linux wheel pulls the CUDA libraries); pyproject's `bench`
extra names the version.
"""
import json
import math
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic_batches import synthetic_batches  # noqa: E402

PAD_ID, BOS_ID = 0, 3  # aiayn_flax.data.vocabulary's special ids


def sinusoids(length: int, d_model: int, device: torch.device) -> torch.Tensor:
  """Section 3.5's positional encodings, [length, d_model]."""
  position = torch.arange(length, dtype=torch.float32, device=device)[:, None]
  inverse = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float32,
                                             device=device) / d_model)
  table = torch.zeros(length, d_model, device=device)
  table[:, 0::2], table[:, 1::2] = torch.sin(position * inverse), torch.cos(position * inverse)
  return table


class Transformer(nn.Module):
  def __init__(self, vocab_size: int, d_model: int, d_ff: int, num_heads: int, num_layers: int,
               dropout_rate: float):
    super().__init__()
    self.d_model = d_model
    self.embed = nn.Embedding(vocab_size, d_model)
    nn.init.normal_(self.embed.weight, std=d_model ** -0.5)
    self.dropout = nn.Dropout(dropout_rate)

    def layers(kind, **kwargs):
      return kind(d_model, num_heads, d_ff, dropout_rate, batch_first=True, norm_first=False,
                  **kwargs)
    self.encoder = nn.TransformerEncoder(layers(nn.TransformerEncoderLayer), num_layers,
                                         enable_nested_tensor=False)
    self.decoder = nn.TransformerDecoder(layers(nn.TransformerDecoderLayer), num_layers)
    # Dropout where the paper (and our model) has it, on sublayer outputs and embeddings only:
    # torch's layers also drop attention weights and the FFN's hidden units.
    for layer in [*self.encoder.layers, *self.decoder.layers]:
      layer.dropout = nn.Identity()  # the FFN's hidden units
      for attention in (layer.self_attn, getattr(layer, "multihead_attn", None)):
        if attention is not None:
          attention.dropout = 0.0

  def embed_with_positions(self, ids: torch.Tensor) -> torch.Tensor:
    x = self.embed(ids) * math.sqrt(self.d_model)  # section 3.4
    return self.dropout(x + sinusoids(ids.shape[1], self.d_model, ids.device))

  def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Teacher-forced logits [B, T, V]."""
    decoder_inputs = torch.cat([torch.full_like(targets[:, :1], BOS_ID), targets[:, :-1]], 1)
    decoder_inputs = decoder_inputs.masked_fill(targets == PAD_ID, PAD_ID)
    source_padding = inputs == PAD_ID
    memory = self.encoder(self.embed_with_positions(inputs),
                          src_key_padding_mask=source_padding)
    length = targets.shape[1]  # True above the diagonal: a later position, masked
    causal = torch.ones(length, length, dtype=torch.bool, device=targets.device).triu(1)
    y = self.decoder(self.embed_with_positions(decoder_inputs), memory, tgt_mask=causal,
                     tgt_is_causal=True, tgt_key_padding_mask=decoder_inputs == PAD_ID,
                     memory_key_padding_mask=source_padding)
    return y @ self.embed.weight.T  # the pre-softmax projection tied to the embedding


class TimedStep:
  """One model and its optimizer on one batch shape, warmed up once, then timed on request."""

  def __init__(self, request: dict):
    torch.manual_seed(0)
    self.device = torch.device(request.get("device", "cpu"))
    self.model = Transformer(**request["model"]).to(self.device)
    self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98),
                                      eps=1e-9)
    self.loss = nn.CrossEntropyLoss(ignore_index=PAD_ID,
                                    label_smoothing=request["label_smoothing"])
    self.batches = [(torch.from_numpy(b["inputs"]).long().to(self.device),
                     torch.from_numpy(b["targets"]).long().to(self.device))
                    for b in synthetic_batches(request["rows"], request["length"],
                                               request["model"]["vocab_size"])]
    self.parameters = sum(p.numel() for p in self.model.parameters())
    autocast = request.get("autocast")
    self.autocast = getattr(torch, autocast) if autocast else None
    # The forward pass and the loss in one compiled graph (its backward is compiled with it);
    # the optimizer's update stays eager, as torch.compile's tutorials train.
    self.forward_loss = (torch.compile(self._forward_loss) if request.get("compile")
                         else self._forward_loss)
    self.warmup_seconds = self.seconds_per_step(2) * 2  # the first step compiles

  def _forward_loss(self, inputs, targets) -> torch.Tensor:
    logits = self.model(inputs, targets)
    return self.loss(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

  def step(self, inputs, targets) -> None:
    self.optimizer.zero_grad(set_to_none=True)
    if self.autocast is None:
      loss = self.forward_loss(inputs, targets)
    else:
      with torch.autocast(self.device.type, dtype=self.autocast):
        loss = self.forward_loss(inputs, targets)
    loss.backward()
    self.optimizer.step()

  def seconds_per_step(self, steps: int) -> float:
    self.synchronize()
    start = time.perf_counter()
    for i in range(steps):
      self.step(*self.batches[i % len(self.batches)])
    self.synchronize()
    return (time.perf_counter() - start) / steps

  def synchronize(self) -> None:
    if self.device.type == "cuda":  # kernels run behind the host: wait for them
      torch.cuda.synchronize(self.device)


def main() -> None:
  built = {}
  for line in sys.stdin:
    request = json.loads(line)
    key = json.dumps({k: v for k, v in request.items() if k not in ("steps", "profile")},
                     sort_keys=True)
    if key not in built:
      built[key] = TimedStep(request)
    timed = built[key]
    if request.get("profile"):  # bench/profile_step.py: self CPU time by op
      with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        timed.seconds_per_step(request["steps"])
      table = profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
      print(json.dumps({"profile": table}), flush=True)
      continue
    seconds = timed.seconds_per_step(request["steps"])
    print(json.dumps({"parameters": timed.parameters, "seconds_per_step": seconds,
                      "warmup_seconds": timed.warmup_seconds,
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "peak_bytes": (torch.cuda.max_memory_allocated(timed.device)
                                     if timed.device.type == "cuda" else None)}),
          flush=True)


if __name__ == "__main__":
  main()
