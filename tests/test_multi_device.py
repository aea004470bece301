"""One device vs 8 simulated devices, training and decoding (subprocesses, since XLA_FLAGS is
read at jax import)."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each starts a Python process on 8 simulated devices


def test_one_device_and_eight_devices_give_the_same_step():
  script = os.path.join(os.path.dirname(__file__), "multi_device_check.py")
  result = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=600)
  print(result.stdout)
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert "OK" in result.stdout


def test_decoding_split_over_eight_devices_gives_the_translations_of_one():
  script = os.path.join(os.path.dirname(__file__), "sharded_decoding_check.py")
  result = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=600)
  print(result.stdout)
  assert result.returncode == 0, result.stdout + result.stderr[-3000:]
  assert "OK" in result.stdout
