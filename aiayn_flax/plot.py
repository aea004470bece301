"""Training curves of a run, read from the TensorBoard event files its metric writer left in the
workdir: training and validation loss, and validation BLEU, against steps.

  python -m aiayn_flax.plot --workdir=runs/multi30k [--out=curves.png]
"""
import argparse
import glob
import os
import sys

import numpy as np
from matplotlib.figure import Figure  # no pyplot: no global state, no display backend needed

LOSS_TAGS = ("train/loss", "valid/loss", "train/nll", "valid/nll")
BLEU_TAG = "valid/bleu"
EVENT_FILE_PATTERN = "events.out.tfevents.*"


def read_scalars(workdir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """tag -> (steps, values) of every scalar in the workdir's event files, in step order.

  The trainer's writer (training/event_files.py) stores simple values; runs written through
  clu's tf.summary writer (before 2026-11-28) store tensors: both are read. A step written
  twice (a resumed run repeats the steps after its last checkpoint) keeps the value written
  last.
  """
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.util import tensor_util
  if "://" in workdir:  # the event files are read with the local file system's glob
    raise FileNotFoundError(
        f"--workdir={workdir}: plot reads a local folder; copy the event files first "
        f"(gcloud storage cp '{workdir.rstrip('/')}/{EVENT_FILE_PATTERN}' DIR) or run "
        f"tensorboard --logdir {workdir}")
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"--workdir={workdir}: no such directory")
  if not glob.glob(os.path.join(workdir, EVENT_FILE_PATTERN)):
    raise FileNotFoundError(f"{workdir}: no TensorBoard event files ({EVENT_FILE_PATTERN}); "
                            "train first (python train.py --config=... --workdir=...)")
  accumulator = event_accumulator.EventAccumulator(
      workdir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
  accumulator.Reload()  # reads every event file of the folder, oldest first
  points: dict[str, dict[int, float]] = {}
  tags = accumulator.Tags()
  for tag in tags.get(event_accumulator.SCALARS, []):
    for event in accumulator.Scalars(tag):
      points.setdefault(tag, {})[event.step] = float(event.value)
  for tag in tags.get(event_accumulator.TENSORS, []):
    for event in accumulator.Tensors(tag):
      value = tensor_util.make_ndarray(event.tensor_proto)
      if value.size == 1 and np.issubdtype(value.dtype, np.number):  # not hparams or text
        points.setdefault(tag, {})[event.step] = float(value.reshape(()))
  return {tag: (np.array(sorted(by_step), dtype=np.int64),
                np.array([by_step[s] for s in sorted(by_step)], dtype=np.float64))
          for tag, by_step in points.items()}


def plot_training_curves(workdir: str, out: str | None = None, *, dpi: int = 100) -> str:
  """Writes a PNG (default WORKDIR/training_curves.png; 1100 x 400 pixels at 100 dpi) of the
  losses (left) and the validation BLEU (right) against steps. Returns its path."""
  scalars = read_scalars(workdir)
  if not any(tag in scalars for tag in LOSS_TAGS):
    raise ValueError(f"{workdir}: the event files hold none of {', '.join(LOSS_TAGS)}")
  out = out or os.path.join(workdir, "training_curves.png")
  fig = Figure(figsize=(11, 4), dpi=dpi, layout="constrained")
  loss_ax, bleu_ax = fig.subplots(1, 2)
  styles = {"train/loss": dict(color="C0"), "valid/loss": dict(color="C1", marker="o"),
            "train/nll": dict(color="C0", linestyle="--"),
            "valid/nll": dict(color="C1", linestyle="--", marker="o")}
  for tag in LOSS_TAGS:
    if tag in scalars:
      loss_ax.plot(*scalars[tag], label=tag, **styles[tag])
  loss_ax.set(xlabel="step", ylabel="per-token loss (nats)",
              title="loss (label-smoothed) and NLL")
  loss_ax.legend()
  loss_ax.grid(alpha=0.3)
  if BLEU_TAG in scalars:
    bleu_ax.plot(*scalars[BLEU_TAG], color="C2", marker="o", label="valid/bleu (greedy)")
    bleu_ax.legend()
  else:
    bleu_ax.text(0.5, 0.5, "no validation BLEU yet", ha="center", va="center",
                 transform=bleu_ax.transAxes)
  bleu_ax.set(xlabel="step", ylabel="sacreBLEU", title="validation BLEU")
  bleu_ax.grid(alpha=0.3)
  fig.suptitle(os.path.abspath(workdir), fontsize=9)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=dpi)
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="python -m aiayn_flax.plot", description=__doc__.split(
      "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="A run's directory.")
  parser.add_argument("--out", help="PNG to write (default: WORKDIR/training_curves.png).")
  parser.add_argument("--dpi", type=int, default=100)
  args = parser.parse_args(argv)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  try:
    print(plot_training_curves(args.workdir, args.out, dpi=args.dpi))
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f"{parser.prog}: error: {e}")


if __name__ == "__main__":
  main()
