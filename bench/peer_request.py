"""The request bench/torch_peer.py answers, built from our config so that the two sides train
the same model on the same batch shape (bench/train_speed.py, bench/device_check.py)."""


def peer_request(config, rows: int, length: int, steps: int, variant: str,
                 device: str = "cpu") -> dict:
  """`variant` is eager or compile; bfloat16 compute becomes the peer's bf16 autocast."""
  m = config.model
  request = {"model": {"vocab_size": m.vocab_size, "d_model": m.d_model, "d_ff": m.d_ff,
                       "num_heads": m.num_heads, "num_layers": m.num_layers,
                       "dropout_rate": m.dropout_rate},
             "label_smoothing": config.label_smoothing, "rows": rows, "length": length,
             "steps": steps, "compile": variant == "compile"}
  if m.dtype == "bfloat16":
    request["autocast"] = "bfloat16"
  if device != "cpu":  # a CPU request stays as it always was
    request["device"] = device
  return request
