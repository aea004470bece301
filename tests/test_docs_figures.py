"""The numbers of record (BLEU and F1, their seeds' spread and significance, times, memory, the
test suite's count) agree wherever README.md, docs/, the Makefile and the configs repeat them.

Each figure has one source, the page whose table or run record holds it; every other place that
states it is listed here and must give the same value, rounded to the digits it shows. A figure
that changes is then changed everywhere, or this test names the place left behind."""
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# name: (source, [repeats]); each a (path, pattern) whose groups are the figures, in order.
FIGURES = {
    "Multi30k test2016, greedy, last 5 averaged, seed 0": (
        ("docs/RESULTS.md", r"\| greedy \| last 5 checkpoints averaged \| \*\*(\d+\.\d+)\*\*"),
        [("README.md", r"EN→DE, greedy, last 5 checkpoints averaged .*?the code of 2026-11-28: "
                       r"(\d+\.\d+);"),
         ("configs/multi30k.py", r"(\d+\.\d+) greedy and \d+\.\d+ with beam 4"),
         ("docs/RECIPE.md", r"greedy line moved to the averaged checkpoints, chosen on "
                            r"validation: (\d+\.\d+)")]),
    "Multi30k test2016, beam 4, last 5 averaged, seed 0": (
        ("docs/RESULTS.md", r"\| beam 4, alpha 0\.6 \(the paper's recipe\) \| last 5 checkpoints "
                            r"averaged \| \*\*(\d+\.\d+)\*\*"),
        [("README.md", r"EN→DE, beam 4, last 5 checkpoints averaged .*?the code of 2026-11-28: "
                       r"(\d+\.\d+);"),
         ("configs/multi30k.py", r"\d+\.\d+ greedy and (\d+\.\d+) with beam 4"),
         ("docs/RECIPE.md", r"the beam figure is (\d+\.\d+)")]),
    # make quickstart at today's code: another draw of dropout's masks than the rows above
    # (522d693), read once on test2016 (docs/RESULTS.md).
    "Multi30k test2016, make quickstart at today's code: greedy, beam 4": (
        ("docs/RESULTS.md", r"`make\s+quickstart` gave \*\*(\d+\.\d+)\*\* greedy and "
                            r"\*\*(\d+\.\d+)\*\* with beam 4"),
        [("README.md", r"EN→DE, greedy, [^\n]*?\| (\d+\.\d+) sacreBLEU at today's code[^\n]*\n"
                       r"\| EN→DE, beam 4, [^\n]*?\| (\d+\.\d+) sacreBLEU at today's code"),
         ("README.md", r"version:2\.6\.0 = (\d+\.\d+) \.\.\.")]),
    "Multi30k test2016, greedy, 3 seeds": (
        ("docs/RESULTS.md", r"\| greedy, last 5 averaged \| \*\*(\d+\.\d+) ± (\d+\.\d+)\*\*"),
        [("README.md", r"EN→DE, greedy, .*?3 seeds (\d+\.\d+) ± (\d+\.\d+)\)"),
         ("configs/multi30k.py", r"seeds 0, 1, 2:\s+(\d+\.\d+) \+- (\d+\.\d+) and"),
         ("docs/RESULTS.md", r"averaged checkpoints \((\d+\.\d+) ± (\d+\.\d+) over three seeds"),
         ("docs/RECIPE.md", r"\d+\.\d+\s+\((\d+\.\d+) ± (\d+\.\d+) over three seeds\)")]),
    "Multi30k test2016, beam 4, 3 seeds": (
        ("docs/RESULTS.md", r"\| beam 4, last 5 averaged \| \*\*(\d+\.\d+) ± (\d+\.\d+)\*\*"),
        [("README.md", r"EN→DE, beam 4, .*?3 seeds (\d+\.\d+) ± (\d+\.\d+)\)"),
         ("configs/multi30k.py", r"\+- \d+\.\d+ and (\d+\.\d+) \+- (\d+\.\d+);"),
         ("docs/RESULTS.md", r"beam \*\*not\s+met\*\* \((\d+\.\d+) ± (\d+\.\d+)\)")]),
    # Table 4 at today's code (docs/PARSING.md's final table, 2026-11-30); the table of
    # 2026-11-27 at the older code is history in the lab notes.
    "Table 4, gold only, 3 seeds": (
        ("docs/PARSING.md", r"\| gold only, constrained \(beam 10, alpha 2\.0, last \d+: chosen on "
                            r"validation\) \| (\d+\.\d+) ± (\d+\.\d+)"),
        [("README.md", r"`configs/parsing_sample.py`\) \| Penn Treebank sample \| (\d+\.\d+) ± "
                       r"(\d+\.\d+) F1"),
         ("docs/PARSING.md", r"The gold-only config gives\s+(\d+\.\d+) ± (\d+\.\d+)"),
         ("docs/RESULTS.md", r"\*\*Gold only, (\d+\.\d+) ± (\d+\.\d+)\*\*")]),
    "Table 4, gold and silver, 3 seeds": (
        ("docs/PARSING.md", r"\| \*\*gold and silver, constrained\*\* \(beam 10, alpha 2\.0, "
                            r"last \d+: chosen on validation\) \| \*\*(\d+\.\d+) ± (\d+\.\d+)\*\*"),
        [("README.md", r"`configs/parsing_silver.py`\) \| Penn Treebank sample \| (\d+\.\d+) ± "
                       r"(\d+\.\d+) F1"),
         ("docs/PARSING.md", r"semi-supervised config's mean test\s+F1 is (\d+\.\d+) ± (\d+\.\d+)"),
         ("docs/lab_notes/PARSING.md", r"seeds of each row on the test files: (\d+\.\d+) ± (\d+\.\d+)"),
         ("docs/RESULTS.md", r"\*\*Semi-supervised, (\d+\.\d+) ± (\d+\.\d+)\*\*")]),
    "Table 4, the teacher PCFG": (
        ("docs/PARSING.md", r"\| PCFG \(h=2, parent-annotated, h=1 back-off\): \*\*the teacher\*\* "
                            r"\| \*\*(\d+\.\d+)\*\*"),
        [("README.md", r"strongest PCFG baseline's (\d+\.\d+)"),
         ("docs/PARSING.md", r"parent-annotated PCFG with h=2 \((\d+\.\d+)\), which is the teacher"),
         ("docs/lab_notes/PARSING.md", r"against the teacher's (\d+\.\d+)"),
         ("docs/RESULTS.md", r"\*\*The teacher, (\d+\.\d+)\.\*\*")]),
    "Table 4, gold and silver against the teacher, seeds and sentences (two-sided p)": (
        ("docs/PARSING.md", r"\| \*\*gold and silver, constrained\*\* \(beam[^\n]*?\| \*\*([+-]\d+\.\d+) "
                            r"\[([+-]\d+\.\d+), ([+-]\d+\.\d+)\], p = (\d\.\d+)\*\* \|\n"),
        [("docs/PARSING.md", r"\| gold and silver, constrained \| [^|]* \| ([+-]\d+\.\d+) "
                             r"\[([+-]\d+\.\d+), ([+-]\d+\.\d+)\], p = (\d\.\d+) \|"),
         ("docs/PARSING.md", r"mean test\s+F1 is \d+\.\d+ ± \d+\.\d+, (\d+\.\d+) above.*?two-sided, "
                             r"95% interval\s+\[([+-]\d+\.\d+), ([+-]\d+\.\d+)\], p = (\d\.\d+)"),
         ("README.md", r"its teacher, that PCFG, by (\d+\.\d+),[^\n]*?\(two-sided p = (\d\.\d+) over "
                       r"seeds and sentences"),
         ("README.md", r"a bootstrap drawing both: \+(\d+\.\d+) \[([+-]\d+\.\d+), ([+-]\d+\.\d+)\], "
                       r"two-sided\s+p = (\d\.\d+)"),
         ("docs/RESULTS.md", r"The semi-supervised row is (\d+\.\d+) above the teacher.*?95% "
                             r"interval\s+\[([+-]\d+\.\d+), ([+-]\d+\.\d+)\], two-sided p = (\d\.\d+)"),
         ("docs/lab_notes/PARSING.md", r"against the teacher's \d+\.\d+ \(two-sided\s+p = (\d\.\d+) "
                                       r"over seeds and sentences"),
         ("configs/parsing_silver.py", r"(\d+\.\d+) above the teacher \(over seeds and\s+"
                                       r"sentences, two-sided\s+p = (\d\.\d+)")]),
    "Table 4, gold and silver against the teacher, sentences only (seeds held; one-sided p)": (
        ("docs/PARSING.md", r"\| gold and silver, constrained \| ([+-]\d+\.\d+) \[([+-]\d+\.\d+), "
                            r"([+-]\d+\.\d+)\], p = (\d\.\d+) \|"),
        [("docs/PARSING.md", r"over the test sentences alone, the seeds held fixed: one-sided\s+"
                             r"p = (\d\.\d+)"),
         ("README.md", r"the earlier tables' test gives\s+one-sided p = (\d\.\d+)"),
         ("docs/RESULTS.md", r"the earlier tables' test, one-sided p = (\d\.\d+)"),
         ("configs/parsing_silver.py", r"over the test sentences alone,\s+one-sided p = (\d\.\d+)")]),
    "Table 4, minutes to train one row's seed": (
        ("docs/PARSING.md", r"Both rows train 9,500 steps in (\d+) minutes on this boot"),
        [("README.md", r"parsing, section 6\.3 .*?\| 9,500 steps, (\d+) min, 2 CPU cores"),
         ("README.md", r"parsing, semi-supervised: .*?\| 9,500 steps, (\d+) min, 2 CPU cores"),
         ("docs/RESULTS.md", r"9,500 steps of (\d+) minutes each")]),
    "The quick start's minutes (make quickstart, whole)": (
        ("docs/RESULTS.md", r"took \*\*(\d+) min \d+ s\*\* in all"),
        [("README.md", r"EN→DE, greedy, [^\n]*\| (\d+) min, 2 CPU cores"),
         ("configs/multi30k.py", r"trained in about (\d+) minutes"),
         ("docs/TRAIN.md", r"5100 steps\) in about (\d+) minutes")]),
    "The H200's base step: ms, x PyTorch eager, x torch.compile": (
        ("docs/RESULTS.md", r"On the H200 base's step is (\d+\.\d+)x PyTorch eager and "
                            r"(\d+\.\d+)x torch\.compile"),
        [("README.md", r"base's in \d+\.\d+ ms, (\d+\.\d+)x PyTorch eager and (\d+\.\d+)x "
                       r"`torch\.compile`"),
         ("docs/PERFORMANCE.md", r"(\d+\.\d+)x torch eager, (\d+\.\d+)x torch\.compile"),
         ("docs/lab_notes/PERFORMANCE.md", r"(\d+\.\d+)x torch eager, (\d+\.\d+)x "
                                           r"torch\.compile")]),
    "The H200's base step, ms": (
        ("docs/RESULTS.md", r"Base's MFU is half the plan's 0\.4: its kernels take \d+ ms of the "
                            r"(\d+\.\d+)"),
        [("README.md", r"base's in (\d+\.\d+) ms"),
         ("docs/PERFORMANCE.md", r"base (\d+\.\d+) ms per step"),
         ("docs/lab_notes/PERFORMANCE.md", r"base (\d+\.\d+) ms per step")]),
    "Base's train step compiled for one H100, GiB": (
        ("docs/SCALE.md", r"\| base \| gpu-h100x1 \| bfloat16 \| (\d+\.\d+) \(122x256\)"),
        [("docs/lab_notes/SCALE.md", r"\d+\.\d+ against (\d+\.\d+) on one H100; big"),
         ("docs/lab_notes/SCALE.md", r"\| gpu-h100x1 \| base: train step \| (\d+\.\d+) GiB "
                                     r"\(SCALE\.md's compiled table\)"),
         ("docs/lab_notes/SCALE.md", r"base for one H100 compiled, earlier and with\s+the CPU less "
                                     r"busy: (\d+\.\d+) GiB")]),
    "WMT14 EN-DE, GB downloaded (tfds' archives)": (
        ("docs/MULTI_HOST.md", r"the WMT dev sets 39 MB: (\d+\.\d+) GB\) and prepares 4\.5M pairs"),
        [("README.md", r"prepare WMT14 once \((\d+\.\d+) GB\s+downloaded"),
         ("docs/TRAIN.md", r"(\d+\.\d+) GB downloaded")]),
    "Checkpoints the quick start's scores average": (
        ("configs/multi30k.py", r"c\.average_last_checkpoints = (\d+)"),
        [("Makefile", r"# greedy, then the paper's recipe \(beam 4\), both on the last (\d+) "
                      r"checkpoints averaged"),
         ("README.md", r"EN→DE, greedy, last (\d+) checkpoints averaged"),
         ("README.md", r"EN→DE, beam 4, last (\d+) checkpoints averaged")]),
}


def figures(path: str, pattern: str) -> tuple[str, ...]:
  text = (REPO / path).read_text()
  match = re.search(pattern, text, re.S)
  assert match, f"{path}: no longer states /{pattern}/ (moved or reworded: update FIGURES)"
  return match.groups()


def rounded_alike(source: str, repeat: str) -> bool:
  """Whether repeat is source rounded to the digits repeat shows (38.58 -> 38.6, 21 -> 21)."""
  digits = len(repeat.split(".")[1]) if "." in repeat else 0
  return f"{float(source):.{digits}f}" == repeat or float(source) == float(repeat)


@pytest.mark.parametrize("name", FIGURES)
def test_a_figure_repeated_agrees_with_its_source(name):
  source, repeats = FIGURES[name]
  values = figures(*source)
  for path, pattern in repeats:
    repeated = figures(path, pattern)
    # A place that states fewer figures than the source gives the first and the last (the
    # README's summary of Table 4: the difference and its p, not the interval), or the last
    # alone (a p-value restated).
    expected = (values if len(repeated) == len(values) else values[-1:] if len(repeated) == 1
                else values[:1] + values[-1:])
    assert len(repeated) == len(expected), (path, repeated, values)
    assert all(rounded_alike(v, r) for v, r in zip(expected, repeated)), (
        f"{name}: {path} says {', '.join(repeated)}; {source[0]} says {', '.join(values)}")


def test_the_test_suite_s_count_and_time_are_stated_once():
  """docs/TESTS.md holds the run of record; the README and the Makefile link to it."""
  tests_page = (REPO / "docs/TESTS.md").read_text()
  assert len(re.findall(r"\b\d+ tests in \d+ min", tests_page)) == 1
  for path in ("README.md", "Makefile", "docs/INSTALL.md"):
    text = (REPO / path).read_text()
    assert not re.search(r"\b\d+ tests\b", text), path
    for line in text.splitlines():
      if "make test" in line:
        assert not re.search(r"\d+ min", line), f"{path}: {line.strip()}"
