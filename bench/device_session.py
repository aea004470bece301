"""The one prepared script for a lent GPU (about 10 minutes on an H200), run through the device
tool from the repository root, with the Multi30k files carried beside the working tree:

  mkdir -p .device_data && cp -r ../shared/data/multi30k .device_data/   # here, before the run
  python bench/device_session.py --out=$OUT                              # there; carry .device_data
  python bench/device_session.py --rehearse --out=/tmp/session           # here, on the CPU first

In order, each part in a process of its own, each with a time limit, the rest going on when
one fails (its log says why):
1. `bench/device_check.py` with the forms of before 2026-11-28 (`--forms=before`), then with
   today's (the one-pass loss, one-vector Adam, dropout seeds from one key, attention in
   Pallas's Triton kernels), both sizes; every
   step timed waited for and 20 steps queued with one wait; torch eager and torch.compile beside
   (`--peer_python`, the same interpreter); a trace of 3 steps; XLA's autotuning results saved
   (`autotune.textproto`, for later deviceless compiles: `--xla_gpu_load_autotune_results_from`);
   then today's forms again with cuDNN's fused attention (`--attention=cudnn`), with XLA's
   Triton GEMM off (`--xla_gpu_enable_triton_gemm=false`), and the quick start at 4 steps per
   call, its loop in CUDA graphs or not (`--xla_gpu_enable_command_buffer=...,WHILE,CONDITIONAL`).
2. The quick start trained (`configs/multi30k.py`; its steps cut to what fits the time left),
   then test2016 scored by evaluate.py greedy and with beam 4, each timed (sentences per second).
3. The notebook executed top to bottom (its install cell skipped: INSTALL=False), its
   parameters overridden as papermill does.
Everything lands in --out: the device_check tables (for `device_check.py --from_file
--write_results`), logs, the trace and `session.md`, a summary with the commands and times.
"""
import os
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_string("out", "/tmp/device_session", "Where the tables, logs and traces go.")
flags.DEFINE_bool("rehearse", False, "A rehearsal on the CPU: the quick start only, a few steps "
                  "of each part, small decoding (minutes on 2 cores).")
flags.DEFINE_string("data_dir", ".device_data", "A folder holding multi30k/ (AIAYN_DATA_DIR); "
                    "without it Multi30k is downloaded.")
flags.DEFINE_integer("budget_s", 570, "Seconds for the whole session; each part gets a share.")
FLAGS = flags.FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_part(name: str, command: list[str], seconds: float, env: dict, summary: list) -> bool:
  """Runs one part with a time limit, its output to OUT/NAME.log; records the outcome."""
  log = os.path.join(FLAGS.out, f"{name}.log")
  start = time.monotonic()
  with open(log, "w") as f:
    try:
      code = subprocess.run(command, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                            timeout=max(seconds, 1)).returncode
    except subprocess.TimeoutExpired:
      code = "timed out"
  took = time.monotonic() - start
  summary.append(f"| {name} | `{' '.join(command)}` | {code} | {took:.0f} s | {name}.log |")
  print(summary[-1], flush=True)
  return code == 0


def notebook_command(workdir: str, data_dir: str, rehearse: bool) -> list[str]:
  overrides = dict(NUM_STEPS=30 if rehearse else 1000, DATA_DIR=data_dir, WORKDIR=workdir,
                   INSTALL=False, EVAL_SENTENCES=16 if rehearse else 0, BEAM_SIZE=4)
  script = f"""
import nbclient, nbformat
notebook = nbformat.read("notebooks/aiayn_flax.ipynb", as_version=4)
index = next(i for i, c in enumerate(notebook.cells)
             if "parameters" in c.get("metadata", {{}}).get("tags", []))
notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(
    "\\n".join(f"{{k}} = {{v!r}}" for k, v in {overrides!r}.items())))
client = nbclient.NotebookClient(notebook, timeout=None, kernel_name="python3",
                                 resources={{"metadata": {{"path": "notebooks"}}}})
try:
  client.execute()
finally:
  nbformat.write(notebook, {os.path.join(FLAGS.out, "notebook_executed.ipynb")!r})
print("".join(o.get("text", "") for o in notebook.cells[-1].outputs))
"""
  return [sys.executable, "-c", script]


def main(argv):
  del argv
  os.makedirs(FLAGS.out, exist_ok=True)
  data_dir = os.path.abspath(os.path.join(REPO, FLAGS.data_dir))
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
  if os.path.isdir(os.path.join(data_dir, "multi30k")):  # carried; else Multi30k is downloaded
    env["AIAYN_DATA_DIR"] = data_dir
  else:
    print(f"{data_dir}/multi30k not found: Multi30k will be downloaded (needs the network)")
    data_dir = ""
  if FLAGS.rehearse:
    env["JAX_PLATFORMS"] = "cpu"
  else:
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_dump_autotune_results_to="
                        + os.path.join(FLAGS.out, "autotune.textproto")).strip()
  deadline = time.monotonic() + FLAGS.budget_s
  left = lambda share: share * (deadline - time.monotonic())  # noqa: E731
  python, summary = sys.executable, []
  sizes = "quickstart" if FLAGS.rehearse else "base,quickstart"
  steps = "3" if FLAGS.rehearse else "20"

  # 1. The step, each form, waited and queued, the peer beside.
  peer = [] if FLAGS.rehearse else [f"--peer_python={python}"]
  run_part("step_before", [python, "bench/device_check.py", f"--sizes={sizes}",
                           f"--steps={steps}", "--forms=before",
                           f"--out={FLAGS.out}/device_check_before.md"], left(0.2), env, summary)
  run_part("step_after", [python, "bench/device_check.py", f"--sizes={sizes}", f"--steps={steps}",
                          *peer, f"--trace_dir={FLAGS.out}/trace",
                          f"--out={FLAGS.out}/device_check_after.md"], left(0.3), env, summary)

  # cuDNN's fused attention in training (model.attention_implementation=cudnn).
  if not FLAGS.rehearse:
    run_part("step_after_cudnn_attention", [python, "bench/device_check.py", f"--sizes={sizes}",
                                            "--steps=10", "--attention=cudnn",
                                            f"--out={FLAGS.out}/device_check_cudnn.md"],
             left(0.15), env, summary)

  # XLA's Triton GEMM off (cuBLAS for every matmul): a flag to decide on a device only.
  no_triton = {**env, "XLA_FLAGS": (env.get("XLA_FLAGS", "")
                                    + " --xla_gpu_enable_triton_gemm=false").strip()}
  if not FLAGS.rehearse:
    run_part("step_after_no_triton_gemm", [python, "bench/device_check.py", f"--sizes={sizes}",
                                           "--steps=10",
                                           f"--out={FLAGS.out}/device_check_no_triton_gemm.md"],
             left(0.15), no_triton, summary)

  # Several steps per call (a loop in one program), with and without CUDA graphs that cover
  # the loop (XLA's command buffers with WHILE and CONDITIONAL): flags to decide on a device.
  graphs = {**env, "XLA_FLAGS": (env.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="
                                 "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
                                 ).strip()}
  for name, part_env in (("4_per_call", env), ("4_per_call_loop_in_graphs", graphs)):
    if not FLAGS.rehearse or part_env is env:
      run_part(f"step_after_{name}", [python, "bench/device_check.py", "--sizes=quickstart",
                                      f"--steps={steps}", "--steps_per_call=4",
                                      f"--out={FLAGS.out}/device_check_{name}.md"],
               left(0.25 if FLAGS.rehearse else 0.1), part_env, summary)  # the CPU is slow

  # 2. The quick start trained, then test2016 greedy and beam 4, each timed.
  workdir = os.path.join(FLAGS.out, "quickstart")
  cut = ["--config.num_train_steps=20", "--config.eval_every_steps=20",
         "--config.eval_decode_sentences=16"] if FLAGS.rehearse else []
  run_part("quickstart_train", [python, "train.py", "--config=configs/multi30k.py",
                                f"--workdir={workdir}", *cut], left(0.45), env, summary)
  limit = ["--batch_size=8", "--average_last=1"] if FLAGS.rehearse else []
  for beam in (1, 4):
    run_part(f"quickstart_test2016_beam{beam}",
             [python, "evaluate.py", f"--workdir={workdir}", "--testset=multi30k/test2016",
              f"--beam_size={beam}", f"--output_dir={FLAGS.out}/beam{beam}", *limit],
             left(0.3), env, summary)

  # 3. The notebook, top to bottom.
  run_part("notebook", notebook_command(os.path.join(FLAGS.out, "notebook_run"), data_dir,
                                        FLAGS.rehearse), left(0.95), env, summary)

  with open(os.path.join(FLAGS.out, "session.md"), "w") as f:
    f.write(f"# Device session {time.strftime('%Y-%m-%d %H:%M')}\n\n| part | command | exit | "
            "time | log |\n|---|---|---|---:|---|\n" + "\n".join(summary) + "\n")
  print(f"summary: {FLAGS.out}/session.md")


if __name__ == "__main__":
  app.run(main)
