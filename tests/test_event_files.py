"""TensorBoard's event files written without TensorFlow (aiayn_flax/training/event_files.py):
TensorBoard's own reader gets back exactly what was written."""
import numpy as np
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from aiayn_flax import plot
from aiayn_flax.training import event_files


def test_scalars_and_the_config_read_back_through_tensorboards_reader(tmp_path):
  writer = event_files.create_writer(str(tmp_path))
  writer.write_hparams({"config": '{"seed": 3}'})
  writer.write_scalars(10, {"train/loss": 2.5, "train/grad_norm": np.float32(0.125)})
  writer.flush()
  writer.write_scalars(20, {"train/loss": 1.75})
  writer.close()
  scalars = plot.read_scalars(str(tmp_path))
  assert [list(s) for s in scalars["train/loss"]] == [[10, 20], [2.5, 1.75]]
  assert [list(s) for s in scalars["train/grad_norm"]] == [[10], [0.125]]
  reader = event_accumulator.EventAccumulator(str(tmp_path))
  reader.Reload()
  [config] = reader.Tensors("hparams/config")
  assert tensor_util.make_ndarray(config.tensor_proto).item() == b'{"seed": 3}'


def test_two_writers_of_one_process_keep_separate_files(tmp_path):
  first, second = (event_files.EventFile(str(tmp_path)) for _ in range(2))
  first.write_scalars(1, {"a": 1.0})
  second.write_scalars(2, {"a": 2.0})
  first.close(), second.close()
  assert first.path != second.path and len(list(tmp_path.iterdir())) == 2
  assert [list(s) for s in plot.read_scalars(str(tmp_path))["a"]] == [[1, 2], [1.0, 2.0]]


def test_just_logging_writes_no_file(tmp_path, caplog):
  writer = event_files.create_writer(str(tmp_path / "run"), just_logging=True)
  with caplog.at_level("INFO"):
    writer.write_scalars(5, {"train/loss": 0.5, "step": 5})
  assert "[5] step=5, train/loss=0.5" in caplog.text
  assert not (tmp_path / "run").exists()
