"""The numbers of record (BLEU and F1, their seeds' spread and significance, times, memory, the
test suite's count) agree with the records they were measured in, wherever README.md, docs/, the
Makefile and the configs state them.

Each measured figure has one source: its record, a file kept beside the docs
(docs/records/*.json: a run's scores per seed, a device session's timings, a dry run's memory)
or the package's own data (tfds' checksum list for WMT14's archives); a figure derived from
several (a mean ± sd over seeds, a ratio of two timings) is computed here from them. Every
place that states the figure is listed and must give the same value, rounded to the digits it
shows. A figure changed in the docs alone, even everywhere at once, fails here: changing it
means changing the record. Nothing here reruns anything: the records are read as kept."""
import importlib.util
import json
import pathlib
import re
import statistics

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
RECORDS = REPO / "docs" / "records"


def record(name: str, *path: str):
  """The record `name`, or the value at `path` (its keys in turn) within it."""
  figures = json.loads((RECORDS / name).read_text())
  for key in path:
    figures = figures[key]
  return figures


def mean_and_sd(values) -> tuple[str, str]:
  """Mean and sample standard deviation over seeds, as the docs give them."""
  return str(statistics.mean(values)), str(statistics.stdev(values))


def multi30k(*path):
  return record("multi30k_test2016.json", *path)


def over_seeds(decoding: str) -> tuple[str, str]:
  return mean_and_sd([seed[decoding] for seed in multi30k("by_seed").values()])


def table4(*path):
  return record("table4_parsing_sample.json", *path)


def against_teacher(test: str) -> tuple[str, ...]:
  found = table4("gold and silver against the teacher", test)
  return tuple(str(v) for v in (found["difference"], *found["interval"], found["p"]))


def export_agreement(*path):
  return record("export_agreement.json", *path)


def greedy_agreement(engine: str) -> tuple[str, str]:
  """(sentences identical to ours, sacreBLEU) of an engine's greedy translations."""
  found = export_agreement("greedy", engine)
  return str(found["identical"]), str(found["sacrebleu"])


def int8_rewrites() -> tuple[str, str]:
  """int8's share of sentences changed (%) and its sacreBLEU change, signed, from ours."""
  int8, ours = export_agreement("greedy", "ctranslate2 int8"), export_agreement("greedy", "ours")
  return (str(100 * (1 - int8["identical"] / export_agreement("sentences"))),
          f"{int8['sacrebleu'] - ours['sacrebleu']:+.2f}")


H200 = "h200_base_step_2026-11-27.json"
# The four archives WMT14 EN-DE's builder downloads, as tfds' checksum list names them.
WMT14_DE_EN_ARCHIVES = ("dev.tgz", "training-parallel-europarl-v7.tgz",
                        "training-parallel-commoncrawl.tgz", "training-parallel-nc-v9.tgz")


def wmt14_archive_bytes() -> dict:
  """{archive: bytes} from the installed tfds' url_checksums/wmt14_translate.txt (found without
  importing tfds, which takes seconds)."""
  package = importlib.util.find_spec("tensorflow_datasets").submodule_search_locations[0]
  sizes = {}
  for line in (pathlib.Path(package) / "url_checksums" / "wmt14_translate.txt").read_text(
      ).splitlines():
    url, size, _, name = line.split("\t")
    sizes[name] = int(size)
  return {name: sizes[name] for name in WMT14_DE_EN_ARCHIVES}

# name: (source, [repeats]); each a (path, pattern) whose groups are the figures, in order.
FIGURES = {
    "Multi30k test2016, greedy, last 5 averaged, seed 0": (
        (lambda: (str(multi30k("by_seed", "0", "greedy, last 5 averaged")),)),
        [("docs/RESULTS.md", r"\| greedy \| last 5 checkpoints averaged \| \*\*(\d+\.\d+)\*\*"),
         ("README.md", r"EN→DE, greedy, last 5 checkpoints averaged .*?the code of 2026-11-28: "
                       r"(\d+\.\d+);"),
         ("configs/multi30k.py", r"(\d+\.\d+) greedy and \d+\.\d+ with beam 4"),
         ("docs/RECIPE.md", r"greedy line moved to the averaged checkpoints, chosen on "
                            r"validation: (\d+\.\d+)")]),
    "Multi30k test2016, beam 4, last 5 averaged, seed 0": (
        (lambda: (str(multi30k("by_seed", "0", "beam 4, last 5 averaged")),)),
        [("docs/RESULTS.md", r"\| beam 4, alpha 0\.6 \(the paper's recipe\) \| last 5 checkpoints "
                            r"averaged \| \*\*(\d+\.\d+)\*\*"),
         ("README.md", r"EN→DE, beam 4, last 5 checkpoints averaged .*?the code of 2026-11-28: "
                       r"(\d+\.\d+);"),
         ("configs/multi30k.py", r"\d+\.\d+ greedy and (\d+\.\d+) with beam 4"),
         ("docs/RECIPE.md", r"the beam figure is (\d+\.\d+)")]),
    # make quickstart at today's code: another draw of dropout's masks than the rows above
    # (522d693), read once on test2016 (docs/RESULTS.md).
    "Multi30k test2016, make quickstart at today's code: greedy, beam 4": (
        (lambda: tuple(str(multi30k("make quickstart at today's code", decoding)) for decoding in
                        ("greedy, last 5 averaged", "beam 4, last 5 averaged"))),
        [("docs/RESULTS.md", r"`make\s+quickstart` gave \*\*(\d+\.\d+)\*\* greedy and "
                            r"\*\*(\d+\.\d+)\*\* with beam 4"),
         ("README.md", r"EN→DE, greedy, [^\n]*?\| (\d+\.\d+) sacreBLEU at today's code[^\n]*\n"
                       r"\| EN→DE, beam 4, [^\n]*?\| (\d+\.\d+) sacreBLEU at today's code"),
         ("README.md", r"version:2\.6\.0 = (\d+\.\d+) \.\.\.")]),
    "Multi30k test2016, greedy, 3 seeds": (
        (lambda: over_seeds("greedy, last 5 averaged")),
        [("docs/RESULTS.md", r"\| greedy, last 5 averaged \| \*\*(\d+\.\d+) ± (\d+\.\d+)\*\*"),
         ("README.md", r"EN→DE, greedy, .*?3 seeds (\d+\.\d+) ± (\d+\.\d+)\)"),
         ("configs/multi30k.py", r"seeds 0, 1, 2:\s+(\d+\.\d+) \+- (\d+\.\d+) and"),
         ("docs/RESULTS.md", r"averaged checkpoints \((\d+\.\d+) ± (\d+\.\d+) over three seeds"),
         ("docs/RECIPE.md", r"\d+\.\d+\s+\((\d+\.\d+) ± (\d+\.\d+) over three seeds\)")]),
    "Multi30k test2016, beam 4, 3 seeds": (
        (lambda: over_seeds("beam 4, last 5 averaged")),
        [("docs/RESULTS.md", r"\| beam 4, last 5 averaged \| \*\*(\d+\.\d+) ± (\d+\.\d+)\*\*"),
         ("README.md", r"EN→DE, beam 4, .*?3 seeds (\d+\.\d+) ± (\d+\.\d+)\)"),
         ("configs/multi30k.py", r"\+- \d+\.\d+ and (\d+\.\d+) \+- (\d+\.\d+);"),
         ("docs/RESULTS.md", r"beam \*\*not\s+met\*\* \((\d+\.\d+) ± (\d+\.\d+)\)")]),
    # Table 4 at today's code (docs/PARSING.md's final table, 2026-11-30); the table of
    # 2026-11-27 at the older code is history in the lab notes.
    "Table 4, gold only, 3 seeds": (
        (lambda: mean_and_sd(table4("f1_by_seed", "gold only, constrained (beam 10, alpha 2.0, "
                                                 "last 20)"))),
        [("docs/PARSING.md", r"\| gold only, constrained \(beam 10, alpha 2\.0, last \d+: chosen on "
                            r"validation\) \| (\d+\.\d+) ± (\d+\.\d+)"),
         ("README.md", r"`configs/parsing_sample.py`\) \| Penn Treebank sample \| (\d+\.\d+) ± "
                       r"(\d+\.\d+) F1"),
         ("docs/PARSING.md", r"The gold-only config gives\s+(\d+\.\d+) ± (\d+\.\d+)"),
         ("docs/RESULTS.md", r"\*\*Gold only, (\d+\.\d+) ± (\d+\.\d+)\*\*")]),
    "Table 4, gold and silver, 3 seeds": (
        (lambda: mean_and_sd(table4("f1_by_seed", "gold and silver, constrained (beam 10, alpha "
                                                 "2.0, last 20)"))),
        [("docs/PARSING.md", r"\| \*\*gold and silver, constrained\*\* \(beam 10, alpha 2\.0, "
                            r"last \d+: chosen on validation\) \| \*\*(\d+\.\d+) ± (\d+\.\d+)\*\*"),
         ("README.md", r"`configs/parsing_silver.py`\) \| Penn Treebank sample \| (\d+\.\d+) ± "
                       r"(\d+\.\d+) F1"),
         ("docs/PARSING.md", r"semi-supervised config's mean test\s+F1 is (\d+\.\d+) ± (\d+\.\d+)"),
         ("docs/lab_notes/PARSING.md", r"seeds of each row on the test files: (\d+\.\d+) ± (\d+\.\d+)"),
         ("docs/RESULTS.md", r"\*\*Semi-supervised, (\d+\.\d+) ± (\d+\.\d+)\*\*")]),
    "Table 4, the teacher PCFG": (
        (lambda: (str(table4("teacher PCFG (h=2, parent-annotated, h=1 back-off) f1")),)),
        [("docs/PARSING.md", r"\| PCFG \(h=2, parent-annotated, h=1 back-off\): \*\*the teacher\*\* "
                            r"\| \*\*(\d+\.\d+)\*\*"),
         ("README.md", r"strongest PCFG baseline's (\d+\.\d+)"),
         ("docs/PARSING.md", r"parent-annotated PCFG with h=2 \((\d+\.\d+)\), which is the teacher"),
         ("docs/lab_notes/PARSING.md", r"against the teacher's (\d+\.\d+)"),
         ("docs/RESULTS.md", r"\*\*The teacher, (\d+\.\d+)\.\*\*")]),
    "Table 4, gold and silver against the teacher, seeds and sentences (two-sided p)": (
        (lambda: against_teacher("seeds and sentences (two-sided)")),
        [("docs/PARSING.md", r"\| \*\*gold and silver, constrained\*\* \(beam[^\n]*?\| \*\*([+-]\d+\.\d+) "
                            r"\[([+-]\d+\.\d+), ([+-]\d+\.\d+)\], p = (\d\.\d+)\*\* \|\n"),
         ("docs/PARSING.md", r"\| gold and silver, constrained \| [^|]* \| ([+-]\d+\.\d+) "
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
        (lambda: against_teacher("sentences only, seeds held (one-sided)")),
        [("docs/PARSING.md", r"\| gold and silver, constrained \| ([+-]\d+\.\d+) \[([+-]\d+\.\d+), "
                            r"([+-]\d+\.\d+)\], p = (\d\.\d+) \|"),
         ("docs/PARSING.md", r"over the test sentences alone, the seeds held fixed: one-sided\s+"
                             r"p = (\d\.\d+)"),
         ("README.md", r"the earlier tables' test gives\s+one-sided p = (\d\.\d+)"),
         ("docs/RESULTS.md", r"the earlier tables' test, one-sided p = (\d\.\d+)"),
         ("configs/parsing_silver.py", r"over the test sentences alone,\s+one-sided p = (\d\.\d+)")]),
    "Table 4, minutes to train one row's seed": (
        (lambda: (str(table4("train_minutes_per_seed")),)),
        [("docs/PARSING.md", r"Both rows train 9,500 steps in (\d+) minutes on this boot"),
         ("README.md", r"parsing, section 6\.3 .*?\| 9,500 steps, (\d+) min, 2 CPU cores"),
         ("README.md", r"parsing, semi-supervised: .*?\| 9,500 steps, (\d+) min, 2 CPU cores"),
         ("docs/RESULTS.md", r"9,500 steps of (\d+) minutes each")]),
    "The quick start's minutes (make quickstart, whole)": (
        (lambda: (str(multi30k("make quickstart, fresh clone, whole", "wall_seconds") // 60),)),
        [("docs/RESULTS.md", r"took \*\*(\d+) min \d+ s\*\* in all"),
         ("README.md", r"EN→DE, greedy, [^\n]*\| (\d+) min, 2 CPU cores"),
         ("configs/multi30k.py", r"trained in about (\d+) minutes"),
         ("docs/TRAIN.md", r"5100 steps\) in about (\d+) minutes")]),
    "The H200's base step: ms, x PyTorch eager, x torch.compile": (
        (lambda: tuple(str(record(H200)[torch] / record(H200)["step_ms_median_after_first"])
                        for torch in ("torch_eager_step_ms", "torch_compile_step_ms"))),
        [("docs/RESULTS.md", r"On the H200 base's step is (\d+\.\d+)x PyTorch eager and "
                            r"(\d+\.\d+)x torch\.compile"),
         ("README.md", r"base's in \d+\.\d+ ms, (\d+\.\d+)x PyTorch eager and (\d+\.\d+)x "
                       r"`torch\.compile`"),
         ("docs/PERFORMANCE.md", r"(\d+\.\d+)x torch eager, (\d+\.\d+)x torch\.compile"),
         ("docs/lab_notes/PERFORMANCE.md", r"(\d+\.\d+)x torch eager, (\d+\.\d+)x "
                                           r"torch\.compile")]),
    "The H200's base step, ms": (
        (lambda: (str(record(H200)["step_ms_median_after_first"]),)),
        [("docs/RESULTS.md", r"Base's MFU is half the plan's 0\.4: its kernels take \d+ ms of the "
                            r"(\d+\.\d+)"),
         ("README.md", r"base's in (\d+\.\d+) ms"),
         ("docs/PERFORMANCE.md", r"base (\d+\.\d+) ms per step"),
         ("docs/lab_notes/PERFORMANCE.md", r"base (\d+\.\d+) ms per step")]),
    "Base's train step compiled for one H100, GiB": (
        (lambda: (str(record("base_h100_compiled.json")["train_step_gib"]),)),
        [("docs/SCALE.md", r"\| base \| gpu-h100x1 \| bfloat16 \| (\d+\.\d+) \(122x256\)"),
         ("docs/lab_notes/SCALE.md", r"\d+\.\d+ against (\d+\.\d+) on one H100; big"),
         ("docs/lab_notes/SCALE.md", r"\| gpu-h100x1 \| base: train step \| (\d+\.\d+) GiB "
                                     r"\(SCALE\.md's compiled table\)"),
         ("docs/lab_notes/SCALE.md", r"base for one H100 compiled, earlier and with\s+the CPU less "
                                     r"busy: (\d+\.\d+) GiB")]),
    "WMT14 EN-DE, GB downloaded (tfds' archives)": (
        (lambda: (str(sum(wmt14_archive_bytes().values()) / 1e9),)),
        [("docs/MULTI_HOST.md", r"the WMT dev sets 39 MB: (\d+\.\d+) GB\) and prepares 4\.5M pairs"),
         ("README.md", r"prepare WMT14 once \((\d+\.\d+) GB\s+downloaded"),
         ("docs/TRAIN.md", r"(\d+\.\d+) GB downloaded")]),
    "Checkpoints the quick start's scores average": (
        ("configs/multi30k.py", r"c\.average_last_checkpoints = (\d+)"),
        [("Makefile", r"# greedy, then the paper's recipe \(beam 4\), both on the last (\d+) "
                      r"checkpoints averaged"),
         ("README.md", r"EN→DE, greedy, last (\d+) checkpoints averaged"),
         ("README.md", r"EN→DE, beam 4, last (\d+) checkpoints averaged")]),
    **{f"Export, test2016 greedy, {engine}: identical to ours, sacreBLEU": (
        (lambda engine=engine: greedy_agreement(engine)),
        [("docs/EXPORT.md", rf"\| {row} \| (\d+)/\d+ \| (\d+\.\d+) \|")])
       for engine, row in (("ours", r"ours \(evaluate\.py `--beam_size=1`\)"),
                           ("ctranslate2 f32", "CTranslate2 float32"),
                           ("ctranslate2 int8", "CTranslate2 int8"),
                           ("generate f32", "generate float32, our epsilon"),
                           ("generate f32, epsilon 1e-5", "generate float32, torch's 1e-5"))},
    "Export, test2016 greedy: int8's sentences rewritten (%), its BLEU change": (
        int8_rewrites,
        [("docs/EXPORT.md", r"int8 rewrites (\d+)% of the sentences[^(]*\(([+-]\d+\.\d+)\)")]),
    "Export, test2016 beam 4: ours, CTranslate2": (
        (lambda: tuple(str(export_agreement("beam4", name)) for name in (
            "ours (GNMT alpha 0.6)", "ctranslate2 f32 (length_penalty 0.6)"))),
        [("docs/EXPORT.md", r"ours \(GNMT, alpha 0\.6\) (\d+\.\d+), CTranslate2\s+"
                            r"\(`length_penalty=0\.6`\) (\d+\.\d+)")]),
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
def test_a_figure_stated_agrees_with_its_record(name):
  source, repeats = FIGURES[name]
  values = source() if callable(source) else figures(*source)
  where = "its record" if callable(source) else source[0]
  for path, pattern in repeats:
    repeated = figures(path, pattern)
    # A place that states fewer figures than the source gives the first and the last (the
    # README's summary of Table 4: the difference and its p, not the interval), or the last
    # alone (a p-value restated).
    expected = (values if len(repeated) == len(values) else values[-1:] if len(repeated) == 1
                else values[:1] + values[-1:])
    assert len(repeated) == len(expected), (path, repeated, values)
    assert all(rounded_alike(v, r) for v, r in zip(expected, repeated)), (
        f"{name}: {path} says {', '.join(repeated)}; {where} says {', '.join(values)}")


def test_the_wmt14_archives_are_named_with_the_bytes_tfds_lists():
  """docs/MULTI_HOST.md names each archive's size (MB) beside the total (the figure above)."""
  sizes = wmt14_archive_bytes()
  stated = figures("docs/MULTI_HOST.md", r"Europarl v7 (\d+) MB, Common Crawl (\d+) MB, News\s+"
                   r"Commentary v9 (\d+) MB, the WMT dev sets (\d+) MB")
  expected = [sizes[name] / 1e6 for name in ("training-parallel-europarl-v7.tgz",
                                              "training-parallel-commoncrawl.tgz",
                                              "training-parallel-nc-v9.tgz", "dev.tgz")]
  assert all(rounded_alike(str(e), s) for e, s in zip(expected, stated)), (stated, expected)


def test_the_h200_timings_the_planner_reads_are_the_session_s_record():
  """kernel_census's measured row (what the dry run's MFU and the census use) is the record's."""
  from aiayn_flax.planning import kernel_census
  kept = record(H200)
  assert kernel_census.MEASURED_H200_BASE == {
      "launches": kept["kernel_launches"], "kernels_ms": kept["kernels_ms"],
      "step_ms": kept["step_ms_median_after_first"]}


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


# docs/EXPORT.md's serving tables, each headed by its test set: the record of their run and
# the test set's name there.
SERVING_TABLES = {"test2016": ("serving.json", "multi30k/test2016"),
                  "newstest2014": ("serving.json", "wmt14")}
SERVING_ENGINES = ("ours", "ctranslate2 f32", "ctranslate2 int8", "generate f32")


@pytest.mark.parametrize("test_set", SERVING_TABLES)
def test_each_serving_table_cell_is_its_record_s(test_set):
  """Cell by cell: sentences/s, then sacreBLEU (batch > 1) or the median ms (batch 1)."""
  record_file, name = SERVING_TABLES[test_set]
  kept = {(row["batch_size"], row["beam"], row["engine"]): row
          for row in record(record_file)["rows"] if row["testset"] == name}
  table = figures("docs/EXPORT.md", rf"\n(\| {test_set}: batch, beam \|.*?)\n\n")[0]
  stated = []
  for batch, beam, cells in re.findall(r"^\| (\d+), (greedy|beam 4) \| (.+) \|$", table, re.M):
    for engine, cell in zip(SERVING_ENGINES, cells.split(" | "), strict=True):
      rate, second = re.fullmatch(r"(\d+(?:\.\d+)?) \((\d+(?:\.\d+)?)(?: ms)?\)", cell).groups()
      row = kept[(int(batch), 1 if beam == "greedy" else 4, engine)]
      second_kept = row["ms_per_sentence"] if int(batch) == 1 else row["sacrebleu"]
      assert rounded_alike(str(row["sentences_per_s"]), rate), (test_set, batch, beam, engine)
      assert rounded_alike(str(second_kept), second), (test_set, batch, beam, engine)
      stated.append(engine)
  assert len(stated) == len(kept), f"{test_set}: {len(stated)} cells stated of {len(kept)}"
