"""Data, evaluation and the workdir on several hosts: real train.py / evaluate.py processes
joined by jax.distributed on this machine's loopback (gloo collectives), 2 processes x 2 CPU
devices, compared with 1 process x 4 devices; and the workdir's lease and damaged files.

The multi-host runs use a tiny Multi30k model (500-piece vocabulary, one layer, 4 steps), so
that the vocabulary and the tokenized cache are real files built from real text.
"""
import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from aiayn_flax.runtime import workdir_lease
from conftest import REPO, TOY_ONE_LAYER
from multi_host_launch import DEVICES_PER_HOST, pythonpath_with_cluster_site
from test_cloud_workdir import emulated_gcs  # noqa: F401 - a fixture

TINY_MULTI30K = [
    "--config=configs/multi30k.py", "--config.model.vocab_size=500", "--config.model.d_model=32",
    "--config.model.d_ff=64", "--config.model.num_heads=2", "--config.model.num_layers=1",
    "--config.dataset.vocab_sample_sentences=2000", "--config.dataset.max_length=48",
    # Two buckets (24, 48): the hosts still agree on each step's shape, with half the compiles
    # of the four that bucket_min_length 8 gives.
    "--config.dataset.bucket_min_length=24", "--config.dataset.bucket_growth=2.0",
    "--config.tokens_per_batch=512",
    "--config.num_train_steps=4", "--config.steps_per_call=1",
    "--config.checkpoint_every_steps=4", "--config.eval_every_steps=4",
    "--config.log_every_steps=2", "--config.eval_decode_sentences=8",
    "--config.checkpoint_asynchronously=false", "--config.average_last_checkpoints=1",
    "--config.decode_batch_size=16",
    # A 4-step model stops at the length limit: 10 past the source, not the paper's 50, a
    # third of the decoding steps (what the tests compare does not depend on it).
    "--config.decode_extra_length=10"]
TOY = ["--config=configs/toy.py", TOY_ONE_LAYER,
       "--config.log_every_steps=10",  # no validation: not read
       "--config.checkpoint_every_steps=10", "--config.eval_every_steps=0",
       "--config.dataset.toy_eval_examples=20", "--config.checkpoint_asynchronously=false"]
DIGEST = re.compile(r"^params_digest: (\w+)$", re.M)
LOSS = re.compile(r"step (\d+)/\d+: loss ([0-9.]+)")
VALID_LOSS = re.compile(r"step (\d+): valid/loss ([0-9.]+)")


def environment(**extra) -> dict:
  """This process's environment for a child, without its XLA_FLAGS, plus `extra` (which may
  set them: run_processes gives each process its devices there)."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  return env | extra


@contextlib.contextmanager
def coordinator_port():
  """A loopback port for jax.distributed's coordinator, held (SO_REUSEPORT, not listening)
  until the processes are done, so that nothing else takes it in between; gRPC's server binds
  with SO_REUSEPORT too, and only its listening socket gets the connections."""
  with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]


# Each process's own disk, as on hosts that share nothing but the workdir: HOME, the temporary
# folder, tfds' data folder and the user cache. Only process 0 is given the data.
HOST_FOLDERS = {"HOME": "home", "TMPDIR": "tmp", "TFDS_DATA_DIR": "tensorflow_datasets",
                "XDG_CACHE_HOME": "cache"}


def host_environment(hosts: pathlib.Path, index: int) -> dict:
  folders = {name: hosts / f"host{index}" / sub for name, sub in HOST_FOLDERS.items()}
  for folder in folders.values():
    folder.mkdir(parents=True, exist_ok=True)
  env = {name: str(folder) for name, folder in folders.items()}
  if index > 0:
    env["AIAYN_DATA_DIR"] = None  # this host has no copy of the data
  return env


def files_under(folder: pathlib.Path) -> list[str]:
  return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def run_processes(args: list[str], processes: int, devices: int, timeout: float = 600,
                  hosts: pathlib.Path | None = None, args_of: dict | None = None,
                  prefix_of: dict | None = None):
  """Runs `python ARGS` as `processes` joined processes of `devices` CPU devices each (one
  process: not joined); [(exit status, stderr + stdout, stdout)] in process order. With
  `hosts`, each process has its own folders there (`host_environment`); `args_of[i]` adds to
  process i's arguments, `prefix_of[i]` runs its command through another (`without_folder`).
  Their output goes to files: a pipe left unread while waiting for another process would fill
  and stop its writer, and the collectives with it."""
  with coordinator_port() as port, tempfile.TemporaryDirectory() as folder:
    started, files = [], []
    for index in range(processes):
      joined = dict(JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
                    JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                    JAX_NUM_PROCESSES=str(processes),
                    JAX_PROCESS_ID=str(index),
                    PYTHONPATH=pythonpath_with_cluster_site()) if processes > 1 else {}
      env = environment(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                        **joined)
      if hosts:
        for name, value in host_environment(hosts, index).items():
          env.pop(name, None) if value is None else env.update({name: value})
      out, err = (pathlib.Path(folder) / f"{index}.{name}" for name in ("out", "err"))
      files.append((out, err))
      with out.open("w") as stdout, err.open("w") as stderr:
        started.append(subprocess.Popen(
            [*(prefix_of or {}).get(index, []), sys.executable, *args,
             *(args_of or {}).get(index, [])], cwd=REPO, env=env,
            stdout=stdout, stderr=stderr))
    try:
      for p in started:
        p.wait(timeout=timeout)
    finally:
      for p in started:
        p.kill()
    results = []
    for p, (out, err) in zip(started, files):
      stdout = out.read_text(encoding="utf-8")
      results.append((p.returncode, err.read_text(encoding="utf-8") + stdout, stdout))
    return results


def without_folder(folder: pathlib.Path, empty: pathlib.Path) -> list[str]:
  """A command prefix that runs a process in its own mount namespace, where `folder` shows the
  empty folder `empty` (as root): a host whose disk does not hold what another's does."""
  return ["unshare", "-m", "--propagation", "private", "bash", "-c",
          f'mount --bind {empty} {folder} && exec "$0" "$@"']


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
  """The folder of each host's own disk (`host_environment`), for every run of this module."""
  return tmp_path_factory.mktemp("hosts")


@pytest.fixture(scope="module")
def two_process_run(shared_data, hosts, tmp_path_factory):
  """A tiny Multi30k run trained by 2 processes x 2 devices, each with its own HOME, temporary,
  tfds and cache folders, the data on process 0's alone; the workdir is what they share:
  (workdir, [output of each])."""
  workdir = tmp_path_factory.mktemp("two_process_run")
  results = run_processes(["train.py", f"--workdir={workdir}", *TINY_MULTI30K], 2,
                          DEVICES_PER_HOST, hosts=hosts)
  outputs = [output for _, output, _ in results]
  assert [status for status, _, _ in results] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
  return workdir, outputs


@pytest.mark.slow
def test_hosts_with_separate_disks_train_evaluate_and_resume_with_the_data_on_host_zero_alone(
    two_process_run, hosts, shared_data, tmp_path):
  from aiayn_flax.data import text_files
  workdir, _ = two_process_run
  resumed = tmp_path / "run"
  shutil.copytree(workdir, resumed)
  results = run_processes(["train.py", f"--workdir={resumed}", *TINY_MULTI30K,
                           "--config.num_train_steps=6"], 2, DEVICES_PER_HOST, hosts=hosts)
  assert [status for status, _, _ in results] == [0, 0], results[1][1][-3000:]
  assert all("Resumed from step 4 " in output for _, output, _ in results)
  # A test set on host 0's disk alone.
  own = hosts / "host0" / "home"
  for language in ("en", "de"):
    lines = text_files.read_lines(str(shared_data / "multi30k" / f"val.{language}.gz"))[:24]
    (own / f"test.{language}").write_text("".join(line + "\n" for line in lines), "utf-8")
  results = run_processes(["evaluate.py", f"--workdir={resumed}", "--beam_size=1",
                           f"--src_file={own / 'test.en'}", f"--ref_file={own / 'test.de'}",
                           "--average_last=1"], 2, DEVICES_PER_HOST, hosts=hosts)
  assert [status for status, _, _ in results] == [0, 0], results[1][1][-3000:]
  assert "BLEU" in results[0][2]
  assert len((resumed / "eval" / "test.en.beam1_avg1_step6.hyp").read_text().splitlines()) == 24
  # Host 1 has no AIAYN_DATA_DIR: had it read Multi30k it would have downloaded it (offline,
  # failed). Nothing of the data reached its folders.
  assert not [path for path in files_under(hosts / "host1")
              if re.search(r"multi30k|downloads|\.gz$|tfrecord", path)], files_under(
                  hosts / "host1")


@pytest.mark.slow
def test_a_corpus_on_host_zero_alone_trains_on_two_hosts_as_on_one(shared_data, hosts, tmp_path):
  """A user's own parallel text (configs/parallel_text.py) on host 0's disk alone: host 1 runs
  in its own mount namespace, where that folder is empty. The 2 x 2 devices train with host 0's
  token cache key, to the loss of 1 process x 4 devices; with subword sampling (a unigram
  vocabulary), each host draws the epoch that 1 process draws, to the digest. Validation keeps
  the plain segmentation: its loss is that of 1 process too."""
  from aiayn_flax.data import text_files
  corpus, empty = tmp_path / "host0_disk", tmp_path / "empty"
  corpus.mkdir()
  empty.mkdir()
  for stem, name, count in (("train", "train", 1000), ("val", "dev", 40)):
    for language in ("en", "de"):
      lines = text_files.read_lines(str(shared_data / "multi30k" / f"{stem}.{language}.gz"))
      (corpus / f"{name}.{language}").write_text("".join(f"{line}\n" for line in lines[:count]),
                                                 "utf-8")
  files = ",".join(str(corpus / f"{name}.{language}") for name in ("train", "dev")
                   for language in ("en", "de"))
  flags = [f"--config=configs/parallel_text.py:{files}", "--config.device=cpu",
           *TINY_MULTI30K[1:], "--config.dataset.vocab_model_type=unigram",
           "--config.dataset.subword_sampling_alpha=0.2"]
  two = run_processes(["train.py", f"--workdir={tmp_path / 'two'}", *flags], 2,
                      DEVICES_PER_HOST, hosts=hosts, prefix_of={1: without_folder(corpus, empty)})
  one = run_processes(["train.py", f"--workdir={tmp_path / 'one'}", *flags], 1,
                      2 * DEVICES_PER_HOST)
  assert [status for status, _, _ in two + one] == [0, 0, 0], two[1][1][-3000:]
  assert "token ids read from" in two[1][1] and "SentencePiece" not in two[1][1]
  curves = [[(int(step), float(loss)) for step, loss in LOSS.findall(output)]
            for _, output, _ in (two[0], one[0])]
  assert [step for step, _ in curves[0]] == [2, 4] == [step for step, _ in curves[1]]
  # (logged to 3 decimals; the sums of 2 processes and of 1 differ in their last bits)
  assert max(abs(a - b) for (_, a), (_, b) in zip(*curves)) <= 1.5e-3, curves
  assert DIGEST.findall(two[0][1]) == DIGEST.findall(two[1][1]) != []
  valid = [[(int(step), float(loss)) for step, loss in VALID_LOSS.findall(output)]
           for _, output, _ in (two[0], one[0])]
  assert [step for step, _ in valid[0]] == [4] == [step for step, _ in valid[1]]
  assert abs(valid[0][0][1] - valid[1][0][1]) <= 1.5e-3, valid
  sampled = re.compile(r"epoch (\d+): subword segmentations sampled .* digest (\w+)")
  assert sampled.findall(two[0][1]) == sampled.findall(two[1][1]) == sampled.findall(
      one[0][1]) != []


def error_lines(output: str) -> list[str]:
  assert "Traceback" not in output, output[-3000:]
  return [line for line in output.splitlines() if line.startswith("train.py: error: ")]


@pytest.mark.slow
def test_hosts_that_disagree_or_do_not_share_the_workdir_all_stop_in_one_line(
    two_process_run, hosts, tmp_path):
  workdir, _ = two_process_run
  run = tmp_path / "run"
  shutil.copytree(workdir, run)
  results = run_processes(["train.py", f"--workdir={run}", *TINY_MULTI30K], 2,
                          DEVICES_PER_HOST, hosts=hosts,
                          args_of={1: ["--config.label_smoothing=0.2"]})
  for status, output, _ in results:
    assert status == 1, output[-3000:]
    assert error_lines(output) == [
        "train.py: error: host 1 differs from host 0 in its config: label_smoothing: 0.1 on "
        "host 0, 0.2 on host 1"]
  # Host 1 names a workdir on its own disk: it cannot see host 0's lease.
  local = hosts / "host1" / "home" / "run"
  results = run_processes(["train.py", f"--workdir={run}", *TINY_MULTI30K], 2,
                          DEVICES_PER_HOST, hosts=hosts, args_of={1: [f"--workdir={local}"]})
  for index, (status, output, _) in enumerate(results):
    assert status == 1, output[-3000:]
    [line] = error_lines(output)
    assert re.fullmatch(
        r'train\.py: error: host 1 differs from host 0 in its view of the workdir\'s run\.lease: '
        rf'"[0-9a-f]{{32}}" on host 0, null on host 1; {re.escape(str(run if index == 0 else local))} '
        r"must be one folder that every host of the run sees \(gs://BUCKET/\.\.\., or a "
        r"filesystem all hosts mount\), not a local disk", line)
  assert not (local / "vocab.model").exists() and not (local / "tokenized").exists()


@pytest.mark.slow
def test_vocabulary_and_token_ids_are_built_once_by_process_zero(two_process_run):
  workdir, (first, second) = two_process_run
  vocab = workdir / "vocab.model"
  assert f"vocabulary: built by process 0 of 2: {vocab}" in first
  assert f"vocabulary: read {vocab} on process 1 of 2" in second
  for split in ("train", "validation"):
    [cache] = (workdir / "tokenized").glob(f"multi30k-{split}-*.npz")
    assert f"multi30k/{split}: token ids built by process 0 of 2" in first
    assert f"multi30k/{split}: token ids read from {cache} on process 1 of 2" in second
  # Process 1 wrote none of the files (each write logs its path) and trained on nothing else.
  assert "SentencePiece: wrote" in first and "token ids cached in" in first
  assert "SentencePiece" not in second and "token ids cached in" not in second
  assert sorted(p.name for p in workdir.iterdir() if not p.name.startswith("events.")) == [
      "checkpoints", "tokenized", "vocab.model"]  # no lease left, no temporary file
  assert DIGEST.findall(first) == DIGEST.findall(second) != []


@pytest.mark.slow
@pytest.mark.timeout(1800)  # with the fixture's training when it runs first: 2 x 2 devices
def test_evaluation_on_two_processes_gives_the_hypotheses_of_one_device(
    two_process_run, shared_data, tmp_path):
  from aiayn_flax.data import text_files
  workdir, _ = two_process_run
  for language in ("en", "de"):  # 24 sentences: 2 decoding batches of 16 (16 and 8)
    lines = text_files.read_lines(str(shared_data / "multi30k" / f"test_2016_flickr.{language}.gz"))
    (tmp_path / f"test.{language}").write_text("".join(line + "\n" for line in lines[:24]),
                                              encoding="utf-8")
  outputs = {}
  # The same batches of 16 sentences on both: --batch_size counts per device.
  for processes, devices, batch_size in ((1, 1, 16),
                                         (2, DEVICES_PER_HOST, 16 // (2 * DEVICES_PER_HOST))):
    results = run_processes(
        ["evaluate.py", f"--workdir={workdir}", f"--src_file={tmp_path / 'test.en'}",
         f"--ref_file={tmp_path / 'test.de'}", "--beam_size=4", f"--batch_size={batch_size}",
         f"--output_dir={tmp_path / str(processes)}"], processes, devices)
    assert [status for status, _, _ in results] == [0] * processes, results[-1][1][-3000:]
    outputs[processes] = [output for _, output, _ in results]
  name = "test.en.beam4_avg1_step4"
  one, two = tmp_path / "1", tmp_path / "2"
  assert (one / f"{name}.hyp").read_bytes() == (two / f"{name}.hyp").read_bytes()
  # (A 4-step model's beam writes odd pieces, \x85 among them: count lines as files hold them.)
  assert (one / f"{name}.hyp").read_bytes().count(b"\n") == 24
  assert json.loads((one / f"{name}.json").read_text()) == json.loads(
      (two / f"{name}.json").read_text())
  # Every batch was decoded by the 4 devices of both processes together, and only process 0
  # printed and wrote.
  first, second = outputs[2]
  decoded = re.compile(r"decoded 24/24 sentences \([\d.]+ sentences/s on (\d+) device\(s\)")
  assert decoded.findall(outputs[1][0]) == ["1"]
  assert decoded.findall(first) == decoded.findall(second) == [str(2 * DEVICES_PER_HOST)]
  assert "BLEU" in first and f"wrote {name}.json and .hyp" in first
  assert "BLEU" not in second and "wrote" not in second

  # translate.py on every worker, decoding over their 4 devices: the same translations,
  # printed once, by process 0.
  results = run_processes(["translate.py", f"--workdir={workdir}",
                           f"--input={tmp_path / 'test.en'}", "--beam_size=4",
                           f"--batch_size={16 // (2 * DEVICES_PER_HOST)}"], 2, DEVICES_PER_HOST)
  assert [status for status, _, _ in results] == [0, 0], results[1][1][-3000:]
  (first, first_gloo), (second, second_gloo) = (
      without_gloo_messages(stdout) for _, _, stdout in results)
  lines, empty = lines_and_empty_lines((one / f"{name}.hyp").read_text())
  # Every translation in order, and no other line but the newlines of gloo's messages.
  assert lines_and_empty_lines(first) == (lines, empty + first_gloo)
  # Process 1 printed nothing: gloo's newlines are left, and at times the number that ends a
  # message, printed apart from it after another's newline ("\n\n\n3\n", seen once).
  assert re.fullmatch(r"[\n\d]*", second) and second.count("\n") == second_gloo, second


@pytest.mark.slow
@pytest.mark.parametrize("script", ["translate.py", "evaluate.py"])
def test_an_input_process_zero_cannot_read_stops_every_process_at_once_naming_it(toy_run,
                                                                                 tmp_path,
                                                                                 script):
  """translate.py --input, evaluate.py --src_file on 2 processes, the file mistyped: both stop
  within a minute, each in one line naming the file, before any model is loaded (not process 0
  alone, the other left waiting in a broadcast until JAX's timeouts)."""
  _, workdir, _ = toy_run
  missing = tmp_path / "tset.en"
  flags, flag, what = (([f"--input={missing}"], f"--input={missing}",
                        f"--input={missing}: No such file or directory")
                       if script == "translate.py" else
                       ([f"--src_file={missing}", f"--ref_file={missing}"], "--src_file/--ref_file",
                        f"{missing}: no such file"))
  started = time.time()
  results = run_processes([script, f"--workdir={workdir}", *flags], 2, 1, timeout=120)
  assert time.time() - started < 60
  for index, (status, output, _) in enumerate(results):
    assert status == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    [line] = [line for line in output.splitlines() if line.startswith(f"{script}: error")]
    assert line == f"{script}: error: " + (
        "" if index == 0 else f"process 0 stopped at {flag}: FileNotFoundError: ") + what


@pytest.mark.slow
def test_a_config_file_missing_on_one_host_stops_every_host_at_once_naming_it(hosts, tmp_path):
  """train.py --config=FILE on 2 processes, FILE on host 0's disk only (host 1 in its own mount
  namespace, the folder empty there): both stop within a minute, each in one line naming the
  file (not host 0 waiting at the start for host 1 until JAX's 300 s timeout)."""
  folder, empty = tmp_path / "configs", tmp_path / "empty"
  folder.mkdir()
  empty.mkdir()
  config = folder / "mine.py"
  config.write_text("from configs import toy\n\n\ndef get_config():\n  return toy.get_config()\n")
  started = time.time()
  results = run_processes(["train.py", f"--config={config}", f"--workdir={tmp_path / 'run'}"],
                          2, 1, timeout=120, hosts=hosts,
                          prefix_of={1: without_folder(folder, empty)})
  assert time.time() - started < 60
  missing = f"--config={config}: no such file {str(config)!r}; the configs: "
  for index, (status, output, _) in enumerate(results):
    assert status == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    [line] = [line for line in output.splitlines() if line.startswith("train.py: error")]
    assert line.startswith("train.py: error: " + (
        "process 1 stopped at --config: " if index == 0 else "") + missing), line


GLOO_MESSAGE = re.compile(r"\[Gloo\] Rank \d* is connected to \d* peer ranks\. Expected number "
                          r"of connected peer ranks is : \d*")


def without_gloo_messages(stdout: str) -> tuple[str, int]:
  """(stdout less gloo's messages on the CPU test bed, how many there were). Gloo prints them
  from C++ threads piece by piece as its contexts connect (at the start, and at a broadcast of
  --input), and flushes at each newline: a message can land inside another, one's number beside
  the other's, its newline after the other's or after lines Python printed since. They are
  taken out innermost first; each one's newline is left where it landed, an empty line."""
  count = 0
  while found := GLOO_MESSAGE.search(stdout):
    stdout, count = stdout[:found.start()] + stdout[found.end():], count + 1
  return stdout, count


def test_gloo_messages_are_taken_out_wherever_they_land():
  message = ("[Gloo] Rank {} is connected to 3 peer ranks. Expected number of connected peer "
             "ranks is : 3")
  # As a run printed it: rank 3's message inside rank 2's, both newlines after both.
  inside = "[Gloo] Rank " + message.format(3) + message.format(2)[len("[Gloo] Rank "):]
  assert without_gloo_messages(f"{inside}\n\n") == ("\n\n", 2)
  assert without_gloo_messages(f"a\n{message.format(0)}\nb\n") == ("a\n\nb\n", 1)
  assert without_gloo_messages("a\n\nb 12\n") == ("a\n\nb 12\n", 0)


def lines_and_empty_lines(text: str) -> tuple[list[str], int]:
  """(the lines that are not empty, in order, how many are); as files hold them (a 4-step
  model's pieces include \x85, which str.splitlines would split at)."""
  lines = text.split("\n")
  return [line for line in lines if line], sum(not line for line in lines)


def start_toy(workdir, steps: int) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, "train.py", f"--workdir={workdir}", *TOY,
       f"--config.num_train_steps={steps}"], cwd=REPO, env=environment(),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_line(process, pattern: str) -> str:
  """The output of process up to the first line matching pattern; fails if the process ends
  first. No deadline of its own: however slow a loaded machine makes the steps, the line comes,
  and a hang is the test's time limit's (pytest-timeout) to report."""
  lines = []
  while line := process.stdout.readline():
    lines.append(line)
    if re.search(pattern, line):
      return "".join(lines)
  raise AssertionError(f"{pattern!r} not seen before the process ended:\n"
                       f"{''.join(lines[-30:])}")


def finished_toy(workdir, steps: int) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "train.py", f"--workdir={workdir}", *TOY,
                         f"--config.num_train_steps={steps}"], cwd=REPO, env=environment(),
                        capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_second_trainer_on_a_workdir_in_use_refuses_and_a_killed_runs_lease_does_not_block(
    tmp_path):
  workdir = tmp_path / "run"
  first = start_toy(workdir, 100_000)
  try:
    wait_for_line(first, r"step 30/")  # the checkpoint of step 20 is written
    first.send_signal(signal.SIGSTOP)  # alive, holding its lease, training no further
    second = finished_toy(workdir, 5)  # without the lease: resumes past 5, exits 0 at once
    assert first.poll() is None
    first.kill()  # SIGKILL: no chance to remove its lease
    first.wait()
  finally:
    first.kill()
  assert second.returncode == 1, second.stderr[-3000:]
  lease = json.loads((workdir / "run.lease").read_text())
  assert lease["pid"] == first.pid and lease["host"] == socket.gethostname()
  heartbeat = "HEARTBEAT"  # renewed since the refusal, maybe
  assert re.fullmatch(re.escape(
      f"train.py: error: {workdir} is in use by the run started {lease['started']} on host "
      f"{lease['host']}, pid {first.pid} (last heartbeat {heartbeat}); wait for it to end or "
      f"stop it, or train in another --workdir (a killed run's lease ({workdir / 'run.lease'}) "
      f"stops counting once its pid is gone, or after {workdir_lease.STALE_SECONDS} s without "
      "a heartbeat from another host)").replace(heartbeat, r"[0-9T:+-]+"),
      second.stderr.strip().splitlines()[-1])
  assert "Traceback" not in second.stderr

  # The same command resumes the killed run (its pid is gone), to the parameters of a run that
  # trained alone.
  saved = max(int(step.name) for step in (workdir / "checkpoints").iterdir()
              if step.name.isdigit())
  resumed = finished_toy(workdir, saved + 20)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resumed from step {saved} " in resumed.stderr
  assert not (workdir / "run.lease").exists()
  alone = finished_toy(tmp_path / "alone", saved + 20)
  assert DIGEST.findall(resumed.stdout) == DIGEST.findall(alone.stdout) != []


@pytest.mark.slow
def test_of_two_trainers_started_in_the_same_second_on_one_workdir_exactly_one_trains(tmp_path):
  workdir = tmp_path / "run"
  trainers = [start_toy(workdir, 100_000) for _ in range(2)]
  try:
    refused = None
    while refused is None:  # the one refused exits; the other trains on, until killed here
      refused = next((t for t in trainers if t.poll() is not None), None)
      time.sleep(0.5)
    [training] = [t for t in trainers if t is not refused]
    wait_for_line(training, r"step 10/")
  finally:
    for trainer in trainers:
      trainer.kill()
      trainer.wait()
  output = refused.stdout.read()
  assert refused.returncode == 1, output[-3000:]
  assert re.search(rf"^train\.py: error: {re.escape(str(workdir))} is in use by the run started "
                   rf".* pid {training.pid} ", output, re.M), output[-3000:]


def test_a_lease_from_another_host_blocks_until_its_heartbeat_is_stale(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lease, "SETTLE_SECONDS", 0.1)  # one taker here: no race
  path = tmp_path / workdir_lease.LEASE_FILENAME
  now = time.time()
  other = {"host": "another-host", "pid": os.getpid(), "run": "x", "started": "then",
           "heartbeat": now - 10, "heartbeat_utc": "just now"}
  path.write_text(json.dumps(other))
  with pytest.raises(workdir_lease.WorkdirInUse, match=r"in use by the run started then on "
                     rf"host another-host, pid {os.getpid()} \(last heartbeat just now\)"):
    workdir_lease.take(tmp_path)
  path.write_text(json.dumps(other | {"heartbeat": now - workdir_lease.STALE_SECONDS - 1}))
  lease = workdir_lease.take(tmp_path)
  try:
    assert json.loads(path.read_text())["host"] == socket.gethostname()
  finally:
    lease.release()
  assert not path.exists()


def test_a_killed_run_not_yet_reaped_holds_no_lease():
  child = subprocess.Popen(["sleep", "600"])
  try:
    assert workdir_lease._pid_alive(child.pid)
    child.kill()
    stat = pathlib.Path(f"/proc/{child.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # the kernel's teardown
      time.sleep(0.01)
    assert not workdir_lease._pid_alive(child.pid)  # a zombie: its pid still answers kill(0)
  finally:
    child.kill()
    child.wait()


def test_a_lease_in_a_bucket_refuses_a_second_run(emulated_gcs, monkeypatch):  # noqa: F811
  monkeypatch.setattr(workdir_lease, "SETTLE_SECONDS", 0.1)  # one taker at a time: no race
  from etils import epath
  workdir = "gs://bucket/leased"
  lease = workdir_lease.take(workdir)
  try:
    with pytest.raises(workdir_lease.WorkdirInUse, match=rf"pid {os.getpid()} "):
      workdir_lease.take(workdir)
  finally:
    lease.release()
  assert not (epath.Path(workdir) / workdir_lease.LEASE_FILENAME).exists()
  workdir_lease.take(workdir).release()  # free again


@pytest.mark.slow
def test_a_truncated_vocabulary_is_one_line_naming_the_file(two_process_run, tmp_path):
  workdir, _ = two_process_run
  damaged = tmp_path / "run"
  damaged.mkdir()
  model = (workdir / "vocab.model").read_bytes()
  (damaged / "vocab.model").write_bytes(model[:len(model) // 2])
  shutil.copytree(workdir / "tokenized", damaged / "tokenized")
  result = subprocess.run([sys.executable, "train.py", f"--workdir={damaged}", *TINY_MULTI30K],
                          cwd=REPO, env=environment(), capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f"train.py: error: {damaged / 'vocab.model'}: damaged, not a readable SentencePiece "
      "model; restore it from a copy, or delete it and the tokenized/ folder beside it to "
      "train it again (the same data and seed train the same vocabulary)")
  assert "Traceback" not in result.stderr


def test_hosts_name_the_first_difference_as_a_dotted_key():
  from aiayn_flax.runtime import host_agreement
  ours = {"model": {"d_model": 512, "num_heads": 8}, "seed": 0}
  assert host_agreement.first_difference(ours, {"model": {"d_model": 256, "num_heads": 4},
                                                "seed": 1}) == ("model.d_model", 512, 256)
  assert host_agreement.first_difference(ours, ours | {"extra": 1}) == ("extra", None, 1)
  assert host_agreement.first_difference([4, 8], [4]) == ("", [4, 8], [4])
  host_agreement.check({"config": ours})  # one process: nothing to compare
