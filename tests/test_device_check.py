"""bench/device_check.py, the script a lent accelerator runs (issue 43), tried on the CPU: it
measures the quick start's first steps on the dry run's batch, and its rows land in
docs/RESULTS.md's table, a second run of the same device and size replacing the first."""
import os
import subprocess
import sys

import pytest

from bench import device_check

pytestmark = pytest.mark.slow  # starts bench/device_check.py, which trains

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_device_check_measures_the_quick_start_and_writes_its_row(tmp_path):
  out = tmp_path / "device_check.md"
  # Two sizes run as a process each (here the same size twice, the cheapest); 2 steps queued
  # rather than 20 (0.34 s each here).
  subprocess.run([sys.executable, "bench/device_check.py", "--sizes=quickstart,quickstart",
                  "--steps=2", "--queued_steps=2", f"--out={out}"], cwd=REPO, check=True,
                 capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                 timeout=300)
  header, rule, row, second = out.read_text().splitlines()
  assert second.split("|")[3] == row.split("|")[3]
  assert header.startswith("| date | device | size |") and rule.startswith("|---")
  cells = [cell.strip() for cell in row.split("|")[1:-1]]
  assert cells[1] == "1 x cpu" and cells[2] == "quickstart"
  # The batch the dry run's plan counts FLOPs on: the bucket nearest 32 tokens, its rows.
  assert cells[3] == "85 x 32, float32"
  assert float(cells[4]) > 0 and float(cells[5]) > 0
  queued, said = cells[10].split(" ", 1)
  assert float(queued) > 0 and said == "(2 queued)"
  measured, compiled = cells[8].split(" / ")
  assert "process peak RSS" in measured and float(compiled) > 0.1

  results = tmp_path / "RESULTS.md"
  results.write_text("# Results\n\n## Scores\n\ntext\n")
  other = row.replace("| quickstart |", "| base |")
  device_check.write_results([row, other], str(results))
  device_check.write_results([row.replace("| 2026", "| 2027", 1)], str(results))  # re-measured
  text = results.read_text()
  assert text.startswith("# Results\n\n## Scores\n\ntext\n")
  assert text.count(device_check.SECTION) == 1 and text.count(device_check.HEADER) == 1
  rows = [line for line in text.splitlines() if line.startswith("| 20")]
  assert [r.split("|")[3].strip() for r in rows] == ["base", "quickstart"]
  assert rows[1].startswith("| 2027")


def test_the_device_session_records_a_form_that_fails_and_goes_on_without_it(tmp_path):
  """bench/device_session.py's rehearsal, its cheapest path: Pallas made to fail when lowered
  (--break_pallas) is recorded as not working, and the determinism part after it runs with
  the attention written out (plain), bit for bit; the quick start, without its prepared data,
  says why it is skipped. "Bit for bit" means something only on a GPU (a lent device's session):
  XLA:CPU runs these steps deterministically, so here it checks the part runs and reports."""
  import json
  subprocess.run([sys.executable, "bench/device_session.py", "--rehearse", "--break_pallas",
                  "--forms=pallas_attention", "--parts=preflight,forms,determinism,quickstart",
                  f"--data_dir={tmp_path}/none", f"--out={tmp_path}"], cwd=REPO, check=True,
                 capture_output=True, text=True, timeout=300)
  session = json.loads((tmp_path / "session.json").read_text())
  assert session["preflight"]["platform"] == "cpu" and session["preflight"]["versions"]["jax"]
  [form] = session["forms"]
  assert form["form"] == "pallas_attention" and form["works"] is False and form["failed"]
  assert "forced Pallas failure" in form["error"]
  assert session["plain"] == ["pallas_attention"]
  assert session["determinism"]["plain"] == ["pallas_attention"]
  assert session["determinism"]["bit_for_bit"] is True
  assert "no prepared workdir" in session["parts"]["quickstart"]["skipped"]
  table = (tmp_path / "session.md").read_text()
  assert "| pallas_attention | model.attention_implementation=pallas / written_out | no: " \
      "RuntimeError: forced Pallas failure" in table
