"""A workdir on Cloud Storage (gs://bucket/run): training, resuming and evaluation keep every
file of the run in the bucket and none on the local disk (but for the host's copy of the token
ids, in its temporary folder, which it memory-maps).

The bucket is served by a GCS emulator on localhost (gcp-storage-emulator), so no network is
needed. Orbax's arrays go to it through tensorstore (TENSORSTORE_GCS_HTTP_URL), everything else
through etils.epath's fsspec backend (gcsfs, STORAGE_EMULATOR_HOST). On a real TPU VM epath
takes TensorFlow's GCS client instead (its endpoint is compiled in), so here epath is switched to
fsspec; TensorBoard's event files go through epath too (aiayn_flax/training/event_files.py).
"""
import json
import logging
import subprocess
import sys
import tempfile

import gcsfs.retry
import pytest
from etils import epath
from etils.epath import gpath

from aiayn_flax import plot
from aiayn_flax.training import trainer
from conftest import REPO
from configs import multi30k

BUCKET = "bucket"
# A script run against the emulator: the client-side settings of `emulated_gcs`, then the
# script itself with the command line's arguments.
EMULATED_CLIENT = (
    "from etils.epath import gpath; gpath._is_tf_installed = lambda: False\n"
    "import gcsfs.retry; gcsfs.retry.errs = gcsfs.retry.errs - {501, '501'}\n"
    f"import runpy; runpy.run_path({str(REPO / 'evaluate.py')!r}, run_name='__main__')\n")


def give_downloads_their_generation():
  """Real Cloud Storage names an object's generation in a download's x-goog-generation header;
  the emulator leaves it out, and tensorstore, which reads it back to update an OCDBT manifest
  (more often on a loaded machine), then fails with "Malformed StorageGeneration"."""
  from gcp_storage_emulator import server
  from gcp_storage_emulator.exceptions import NotFound
  from gcp_storage_emulator.handlers import objects
  download = objects.download

  def download_with_generation(request, response, storage, *args, **kwargs):
    download(request, response, storage, *args, **kwargs)
    try:
      obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except NotFound:
      return
    response["x-goog-generation"] = obj["generation"]
    response["x-goog-metageneration"] = obj["metageneration"]

  patch = pytest.MonkeyPatch()
  patch.setattr(objects, "download", download_with_generation)  # what objects.get calls
  for _, methods in server.HANDLERS:  # the routes that name it directly
    for method, handler in list(methods.items()):
      if handler is download:
        patch.setitem(methods, method, download_with_generation)
  return patch


@pytest.fixture(scope="module")
def emulated_gcs():
  from gcp_storage_emulator.server import create_server
  handlers = give_downloads_their_generation()
  # Port 0: the OS picks a free port as the emulator binds it, and we read it back (a port
  # found free beforehand could be taken by another process before the emulator binds it).
  server = create_server("localhost", 0, in_memory=True, default_bucket=BUCKET)
  server.start()  # returns once the HTTP server is bound
  port = server._api._httpd.server_address[1]  # the emulator has no public accessor for it
  url = f"http://localhost:{port}"
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("STORAGE_EMULATOR_HOST", url)  # gcsfs
    patch.setenv("TENSORSTORE_GCS_HTTP_URL", url)  # orbax's arrays
    patch.setenv("GCE_METADATA_HOST", "localhost:1")  # no credentials to look for
    patch.setattr(gpath, "_is_tf_installed", lambda: False)  # epath: fsspec for gs://
    # The emulator answers objects.moveTo (a rename) with 501, which gcsfs would retry for half
    # a minute before it falls back to copy and delete; fall back at once.
    patch.setattr(gcsfs.retry, "errs", gcsfs.retry.errs - {501, "501"})
    yield
  server.stop()
  handlers.undo()


@pytest.fixture(scope="module")
def small_corpus(shared_data, tmp_path_factory) -> dict:
  """The first 800 training and 40 validation pairs of Multi30k as local plain-text files (the
  input files of a parallel_text dataset are read locally)."""
  from aiayn_flax.data import text_files
  folder = tmp_path_factory.mktemp("corpus")
  files = {}
  for split, name, count in (("train", "train", 800), ("validation", "val", 40)):
    files[split] = []
    for language in ("en", "de"):
      lines = text_files.read_lines(str(shared_data / "multi30k" / f"{name}.{language}.gz"))
      path = folder / f"{split}.{language}"
      path.write_text("".join(line + "\n" for line in lines[:count]), encoding="utf-8")
      files[split].append(str(path))
  return files


def small_text_config(files: dict, num_train_steps: int):
  """Real captions with a 500-piece vocabulary and a one-layer model, in one bucket shape (one
  compilation of each program): seconds per run."""
  config = multi30k.get_config()
  config.dataset.update(name="parallel_text", vocab_sample_sentences=0, max_length=48,
                        bucket_min_length=48)
  config.dataset.files = files
  config.model.update(vocab_size=500, d_model=32, d_ff=64, num_heads=2, num_layers=1)
  config.tokens_per_batch = 512
  config.num_train_steps = num_train_steps
  config.checkpoint_every_steps = 2
  config.eval_every_steps = config.log_every_steps = 2
  config.eval_decode_sentences = 4
  config.checkpoint_asynchronously = False
  return config


def files_under(url: str) -> set[str]:
  import fsspec
  return {path[len(url) - len("gs://") + 1:] for path in fsspec.filesystem("gcs").find(url)}


@pytest.mark.slow
def test_a_run_in_a_bucket_trains_resumes_and_evaluates_with_nothing_on_the_local_disk(
    emulated_gcs, small_corpus, tmp_path_factory, monkeypatch, caplog):
  cwd = tmp_path_factory.mktemp("cwd")
  monkeypatch.chdir(cwd)  # a URL taken for a local path would land here, e.g. ./gs:/bucket/run
  host_temp = tmp_path_factory.mktemp("host_temp")  # the host's temporary folder, for this test
  monkeypatch.setattr(tempfile, "tempdir", str(host_temp))
  workdir = f"gs://{BUCKET}/run"
  trainer.train_and_evaluate(small_text_config(small_corpus, 4), workdir)
  stored = files_under(workdir)
  assert "vocab.model" in stored
  assert any(name.startswith("tokenized/parallel_text-train-") for name in stored)
  assert {name.split("/")[1] for name in stored if name.startswith("checkpoints/")} == {"2", "4"}

  with caplog.at_level(logging.INFO):
    resumed = trainer.train_and_evaluate(small_text_config(small_corpus, 6), workdir)
  assert f"Resumed from step 4 of {workdir}/checkpoints" in caplog.text
  assert f"token ids read from {workdir}/tokenized/parallel_text-train-" in caplog.text
  # The bucket's token ids are mapped from a copy in the host's temporary folder, byte for byte.
  caches = sorted(name for name in files_under(workdir) if name.startswith("tokenized/"))
  local_files = sorted(p for p in host_temp.rglob("*") if p.is_file())
  assert local_files == [host_temp / "aiayn_flax_tokenized" / name.split("/")[1]
                         for name in caches], (caches, local_files)
  for name, copy in zip(caches, local_files):
    assert copy.read_bytes() == epath.Path(f"{workdir}/{name}").read_bytes()

  # The same six steps in a local folder end with the same parameters.
  uninterrupted = trainer.train_and_evaluate(small_text_config(small_corpus, 6),
                                             str(tmp_path_factory.mktemp("local_run")))
  assert resumed["params_digest"] == uninterrupted["params_digest"]

  # Each of the two starts wrote its own TensorBoard event file into the bucket, and
  # TensorBoard's reader finds the losses of both.
  event_files = sorted(name for name in files_under(workdir) if name.startswith("events.out."))
  assert len(event_files) == 2, event_files
  copied = tmp_path_factory.mktemp("event_files")
  for name in event_files:
    (copied / name).write_bytes(epath.Path(f"{workdir}/{name}").read_bytes())
  steps, _ = plot.read_scalars(str(copied))["train/loss"]
  assert list(steps) == [2, 4, 6], steps

  # evaluate.py, run as a user runs it, reads the run's config, vocabulary and checkpoint from
  # the bucket and writes its translation and scores there.
  sources, references = small_corpus["validation"]
  result = subprocess.run(
      [sys.executable, "-c", EMULATED_CLIENT, f"--workdir={workdir}", f"--src_file={sources}",
       f"--ref_file={references}", "--beam_size=1", "--average_last=1"],
      cwd=cwd, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert files_under(f"{workdir}/eval") == {"validation.en.beam1_avg1_step6.hyp",
                                            "validation.en.beam1_avg1_step6.json"}
  hypotheses = epath.Path(f"{workdir}/eval/validation.en.beam1_avg1_step6.hyp").read_text()
  assert len(hypotheses.splitlines()) == 40
  scores = json.loads(
      epath.Path(f"{workdir}/eval/validation.en.beam1_avg1_step6.json").read_text())
  assert scores["checkpoint_steps"] == [6]
  assert list(cwd.iterdir()) == []
