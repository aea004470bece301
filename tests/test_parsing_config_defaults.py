"""The parsing configs decode by default as the final table (docs/PARSING.md, "The final table")
chose on the validation files for their row, so that `evaluate.py --split=test` on one seed gives
that row; bench/parsing_table.py reads the same defaults (config_decoding) to say where a
rerun's choice differs from them."""
import importlib.util
import re
import sys

from conftest import REPO

sys.path.insert(0, str(REPO))
from bench import parsing_table  # noqa: E402

PARSING = (REPO / "docs" / "PARSING.md").read_text(encoding="utf-8")


def load(config_file: str):
  spec = importlib.util.spec_from_file_location("table_config", REPO / config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def final_command() -> str:
  """docs/PARSING.md's command of the final table, continuation lines joined."""
  block = re.search(r"```bash\n(python bench/parsing_table\.py .*?)```", PARSING, re.DOTALL)
  return block.group(1).replace("\\\n", " ")


def recorded_choice(row: str, mode: str = "constrained") -> dict:
  """The decoding the table's row records as chosen on validation."""
  label = row.replace("_", " ")
  match = re.search(rf"\| (?:\*\*)?{label}, {mode}(?:\*\*)? \(beam (\d+), alpha ([\d.]+), "
                    rf"last (\d+): chosen on validation\)", PARSING)
  assert match, f"no {label!r} {mode} row in docs/PARSING.md's final table"
  return {"beam": int(match[1]), "alpha": float(match[2]), "average_last": int(match[3])}


def grid(command: str, flag: str) -> list[float]:
  given = re.search(rf"--{flag}=(\S+)", command)
  values = given[1].split(",") if given else parsing_table.FLAGS[flag].default
  return [float(v) for v in values]


def test_the_parsing_configs_decode_as_the_final_table_chose_on_validation():
  command = final_command()
  rows = dict(re.findall(r"--row=(\w+)=(configs/\w+\.py)", command))
  assert rows == {"gold_only": "configs/parsing_sample.py",
                  "gold_and_silver": "configs/parsing_silver.py"}
  for row, config_file in rows.items():
    config = load(config_file)
    chosen = recorded_choice(row)
    assert config.decode_constrained, config_file  # the row evaluate.py gives is the constrained
    assert parsing_table.config_decoding(config) == chosen, (config_file, chosen)
    assert parsing_table.compare_with_config(row, config, chosen)
    # A choice the table's grid could make: a rerun of its command can choose it again.
    assert chosen["beam"] in grid(command, "beams"), row
    assert chosen["alpha"] in grid(command, "alphas"), row
    assert chosen["average_last"] in grid(command, "average_last"), row
  # Each row's own choice, stated in its config (the table of 2026-11-27 chose 5 for the
  # semi-supervised row; today's code chose 20 for both).
  assert load("configs/parsing_silver.py").average_last_checkpoints == 20
  assert load("configs/parsing_sample.py").average_last_checkpoints == 20


def test_the_final_command_reproduces_the_paper_rows_averaging():
  """The paper's rows averaged the last 20 checkpoints (the configs' default then); the command
  pins that, whatever a rerun chooses for the rows on validation."""
  averaged = {int(n) for n in re.findall(r"the paper's beam 21, alpha 0\.3, input \+ 300 "
                                         r"\(constrained, last (\d+)\)", PARSING)}
  assert averaged == {20}
  assert int(re.search(r"--paper_average_last=(\d+)", final_command())[1]) == 20


def test_a_choice_other_than_the_configs_is_said(capsys):
  config = load("configs/parsing_silver.py")
  other = parsing_table.config_decoding(config) | {"average_last": 5}
  assert not parsing_table.compare_with_config("gold_and_silver", config, other)
  assert "evaluate.py's defaults do not give this row" in capsys.readouterr().out
