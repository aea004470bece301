"""The one prepared call on a lent GPU (<= 10 minutes) that decides each GPU form, rehearsed end
to end on the CPU first:

  python bench/device_session.py --prepare                   # here: .device_data/ (no TF there)
  python bench/device_session.py --out=$OUT                  # there; carry .device_data
  python bench/device_session.py --rehearse --out=/tmp/s     # here, small sizes (minutes)
  python bench/device_session.py --rehearse --break_pallas   # ... with Pallas failing to lower

Each part runs in a process of its own under a time limit (its share of --budget_s, measured in
the rehearsal: SHARES), and the rest go on when one fails:
1. preflight (~20 s): versions (jax, jaxlib, the CUDA plugin, flax, optax), the device, its
   compute capability and memory, which optional imports exist (tensorflow, tfds, torch,
   nbclient), and so which parts can run;
2. forms: for each GPU form (FORMS), one bf16 step of base (a small model in rehearsal) from a
   fixed state, batch and key with the form on and off, the others at their defaults: loss, grad
   norm and updated parameters compared at the CPU tests' tolerances, the compiled program
   checked against the census (no while/conditional, the form's custom calls present, no more
   kernels than the form's plain program plus 5%), then both programs timed, alternately, each
   step waited for (block_until_ready), median of --rounds after a warm-up. A form that fails
   (does not compile, not equal, not in the program) is recorded and set to its plain value
   for every later form and part. One process runs the forms (base's programs are shared); if
   it dies or runs out of time, the form in flight is recorded as failed and a new process goes
   on with the rest;
3. determinism: the session's forms, the same state, batches and key run twice, bit for bit;
4. quickstart: configs/multi30k.py trained for what the budget leaves from a workdir prepared
   here (vocabulary + token caches: --prepare), then test2016 scored greedy from text files
   (evaluate.py --src_file/--ref_file), so no TensorFlow is needed there.
It writes OUT/session.json (every fact) and OUT/session.md (per form: works / equal / faster by
how much; the preflight; each part's seconds), and OUT/session.log (every part's output): the
device tool returns at most 8 files from $OUT.
"""
import dataclasses
import glob
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bench import gpu_bars  # noqa: E402

flags.DEFINE_string("out", "/tmp/device_session", "Where session.json/.md/.log go.")
flags.DEFINE_bool("rehearse", False, "On the CPU: small sizes, few steps (minutes on 2 cores).")
flags.DEFINE_bool("prepare", False, "Write --data_dir for the device and exit (here: needs TF).")
flags.DEFINE_string("data_dir", ".device_data", "The prepared quick-start workdir and test2016's "
                    "text (--prepare), carried to the device.")
flags.DEFINE_integer("budget_s", 570, "Seconds for the whole session; each part gets a share.")
flags.DEFINE_list("parts", ["preflight", "forms", "determinism", "quickstart"], "Parts to run.")
flags.DEFINE_list("forms", [], "Forms to decide (default: every one of FORMS).")
flags.DEFINE_bool("break_pallas", False, "Make the Pallas backend fail when lowered (rehearses a "
                  "form that does not compile).")
flags.DEFINE_integer("rounds", 0, "A/B timing rounds per form (0: 20 on a GPU, 2 in rehearsal).")
flags.DEFINE_string("part", "", "(internal) run one part in this process.")
flags.DEFINE_string("plain", "", "(internal) forms set to their plain value, comma-separated.")
FLAGS = flags.FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each part's share of what is left when it starts (preflight: of the budget; quickstart: all
# that is left). The rehearsal of 2026-12-07 (`--rehearse --break_pallas`, 2 contended cores,
# 337 s of 570) took: preflight 2 s (1%), forms 187 s (55%), determinism 23 s (7%), quick start
# 126 s (37%); on a GPU base's compiles (9 distinct programs) are the forms' unknown.
SHARES = {"preflight": 0.05, "forms": 0.55, "determinism": 0.15, "quickstart": 1.0}


@dataclasses.dataclass(frozen=True)
class Form:
  name: str
  field: str  # a config field of programs.PLAIN_FORMS, or "DROPOUT_SEEDS" (a module switch)
  on: object
  custom_call: str = ""  # a kernel kind (kernel_census) the on-program must hold on a GPU
  by_default: bool = True  # what the defaults ("auto") run on one GPU; else opt-in

  @property
  def off(self):
    """The plain form: programs.PLAIN_FORMS' value (the dropout seeds': a fold per layer)."""
    from aiayn_flax import programs
    return "make_rng" if self.field == "DROPOUT_SEEDS" else programs.PLAIN_FORMS[self.field]



# In the order decided: the defaults first, the opt-in attentions last.
FORMS = (
    Form("pallas_attention", "model.attention_implementation", "pallas", "Pallas (Triton)"),
    Form("fused_loss", "loss_implementation", "fused"),
    Form("one_vector_optimizer", "optimizer_implementation", "one_vector"),
    Form("one_pass_layer_norm", "model.layer_norm_implementation", "one_pass"),
    Form("aligned_rows", "aligned_row_tokens", 256),
    Form("one_key_dropout_seeds", "DROPOUT_SEEDS", "one_key"),
    Form("cudnn_attention", "model.attention_implementation", "cudnn", "attention (cuDNN)",
         by_default=False),
    Form("xla_attention", "model.attention_implementation", "xla", by_default=False),
)
BY_NAME = {f.name: f for f in FORMS}


# ---------------------------------------------------------------- in a part's own process


def with_form(config, form: Form, on: bool):
  """A copy of `config` with `form` on, or off (its plain form: programs.with_plain_forms); the
  dropout seeds' form is a module switch, set here."""
  from aiayn_flax import programs
  from aiayn_flax.attention import dropout
  if form.field == "DROPOUT_SEEDS":
    dropout.DROPOUT_SEEDS = form.on if on else form.off
    return config.copy_and_resolve_references()
  if not on:
    return programs.with_plain_forms(config, [form.field])
  config = config.copy_and_resolve_references()
  config.update_from_flattened_dict({form.field: form.on})
  return config


def session_config(size: str, plain: list[str]):
  """base (or a small multi30k model in rehearsal) in bf16, the failed forms of the defaults
  plain (a failed opt-in form changes no default)."""
  from aiayn_flax.attention import dropout
  from configs import base, multi30k
  dropout.DROPOUT_SEEDS = "one_key"  # the module's default (a program is traced after this)
  config = base.get_config() if size == "base" else multi30k.get_config()
  if size == "small":
    config.model.update(d_model=64, d_ff=128, num_heads=2, num_layers=1, vocab_size=256)
  config.model.dtype = "bfloat16"
  for name in plain:
    if BY_NAME[name].by_default:
      config = with_form(config, BY_NAME[name], on=False)
  return config


def break_pallas() -> None:
  """The Pallas backend raises when a program using it is lowered, as a Triton or shared-memory
  failure would (the dispatcher still picks it)."""
  from aiayn_flax.attention import backends

  def fails(*args, **kwargs):
    raise RuntimeError("forced Pallas failure (--break_pallas): lowering refused")
  backends.BACKENDS["pallas"] = dataclasses.replace(backends.BACKENDS["pallas"], run=fails)


def step_program(config, model):
  """One training step as the trainer compiles it on one device (programs.training_programs),
  not donated (both sides start from one state), without the fallback (a failure is the
  finding here). Rows aligned as config.aligned_row_tokens says, on the CPU too."""
  import functools

  import jax

  from aiayn_flax import devices, optimizer, train_step
  forms = train_step.StepForms(loss=config.loss_implementation,
                               optimizer=optimizer.update_form(config),
                               aligned_tokens=config.aligned_row_tokens)
  step = functools.partial(train_step.train_step, model=model,
                           label_smoothing=config.label_smoothing,
                           schedule=optimizer.learning_rate_schedule(config), forms=forms)
  return jax.jit(devices.traced_for(jax.devices()[0].platform, step))


def fixed_inputs(config, model, rows: int, length: int):
  """The state at the end of warm-up (the schedule's peak rate, so updates show), a batch, a
  key: the same for every form."""
  import jax.numpy as jnp

  from aiayn_flax import train_step
  from bench.synthetic_batches import synthetic_batches
  state = train_step.create_train_state(config, model)
  state = state.replace(step=jnp.asarray(config.warmup_steps, state.step.dtype))
  return state, synthetic_batches(rows, length, config.model.vocab_size)[0], \
      train_step.dropout_key(0)


def compiled_step(config, inputs):
  from aiayn_flax import train_step
  model = train_step.make_model(config)
  return step_program(config, model).lower(*inputs).compile()


def summary_of(state, metrics, before) -> dict:
  """The step's loss and grad norm, its gradient (Adam's first moment from zero is (1 - b1) x
  the gradient: optimizer state leaves as large as parameters) and its updates' signs."""
  import jax
  import numpy as np
  param_count = len(jax.tree.leaves(before.params))
  moments = [np.asarray(x, np.float32) for x in jax.tree.leaves(state.opt_state)
             if getattr(x, "ndim", 0) and np.issubdtype(x.dtype, np.floating)]
  updates = [np.asarray(a, np.float32) - np.asarray(b, np.float32) for a, b in
             zip(jax.tree.leaves(state.params), jax.tree.leaves(before.params))]
  names = [jax.tree_util.keystr(path) for path, _ in
           jax.tree_util.tree_flatten_with_path(before.params)[0]]
  return {"loss": float(metrics["loss_sum"]) / max(float(metrics["tokens"]), 1.0),
          "grad_norm": float(metrics["grad_norm"]), "moments": moments[:param_count],
          "updates": updates, "names": names}


def compare(on: dict, off: dict, dtype: str) -> tuple[bool, dict]:
  """Loss and grad norm within the tolerance (relative), the gradient (Adam's first moment)
  within the tolerance of each array's largest value, as the CPU tests compare gradients.
  (Adam's first update is about the rate times the gradient's sign, which a rounding flips
  where a gradient is near 0: the share of updates that agree in sign is reported, not
  checked.)"""
  import numpy as np
  tolerance = gpu_bars.TOLERANCE[dtype]
  facts = {"loss_on": on["loss"], "loss_off": off["loss"], "grad_norm_on": on["grad_norm"],
           "grad_norm_off": off["grad_norm"], "tolerance": tolerance}
  ok = all(np.isfinite(on[k]) and abs(on[k] - off[k]) <= tolerance * abs(off[k])
           for k in ("loss", "grad_norm"))
  worst, worst_name = 0.0, ""
  for a, b, name in zip(on["moments"], off["moments"], on["names"]):
    scale = max(float(np.max(np.abs(b))), 1e-30)
    difference = (float(np.max(np.abs(a - b))) / scale if np.all(np.isfinite(a))
                  else float("inf"))
    if difference > worst:
      worst, worst_name = difference, name
  facts["gradient_max_difference_of_scale"] = worst
  facts["gradient_worst_array"] = worst_name
  agree = sum(int(np.sum(np.sign(a) == np.sign(b))) for a, b in zip(on["updates"], off["updates"]))
  facts["update_signs_agreeing"] = agree / max(sum(a.size for a in on["updates"]), 1)
  finite = all(np.all(np.isfinite(a)) for a in on["updates"])
  return bool(ok and finite and worst <= tolerance), facts


def program_facts(compiled) -> dict:
  from aiayn_flax.planning import kernel_census
  counted = kernel_census.census(compiled.as_text())
  kinds = {}
  for k in counted["kernels"]:
    kinds[k.kind] = kinds.get(k.kind, 0) + 1
  return {"kernels": len(counted["kernels"]), "while": counted["while"],
          "conditional": counted["conditional"],
          "custom": {k: v for k, v in kinds.items() if k in ("Pallas (Triton)",
                                                               "attention (cuDNN)")}}


def program_problems(form: Form, on: dict, off: dict, platform: str) -> list[str]:
  """What the census says is wrong with the on-program (on a GPU; a CPU's program, Pallas
  interpreted in loops, says nothing of a GPU's)."""
  if platform != "gpu":
    return []
  problems = []
  if on["while"] or on["conditional"]:
    problems.append(f"{on['while']} while, {on['conditional']} conditional in the program")
  if form.custom_call and not on["custom"].get(form.custom_call):
    problems.append(f"no {form.custom_call} kernel in the program")
  if on["kernels"] > off["kernels"] * 1.05:
    problems.append(f"{on['kernels']} kernels against {off['kernels']} without the form")
  return problems


def timed(call_a, call_b, rounds: int) -> dict:
  """A/B step times, alternating, every step waited for; the ratio off/on of medians and the
  spread (quartiles) of the per-round ratios."""
  import jax
  for call in (call_a, call_b):  # warm-up
    jax.block_until_ready(call())
  a, b = [], []
  for _ in range(rounds):
    for call, times in ((call_a, a), (call_b, b)):
      start = time.perf_counter()
      jax.block_until_ready(call())
      times.append(time.perf_counter() - start)
  ratios = sorted(x / y for x, y in zip(b, a))  # off / on: above 1, the form is faster
  quartile = lambda q: ratios[min(len(ratios) - 1, int(q * len(ratios)))]  # noqa: E731
  return {"on_ms": 1e3 * statistics.median(a), "off_ms": 1e3 * statistics.median(b),
          "speedup": statistics.median(b) / statistics.median(a),
          "speedup_quartiles": [quartile(0.25), quartile(0.75)], "rounds": rounds}


def decide_forms(out: str, names: list[str], plain: list[str], rehearse: bool, rounds: int):
  """Part 2: appends one JSON line per form to OUT/forms.jsonl as each is decided."""
  import jax
  platform = jax.devices()[0].platform
  size, (rows, length) = ("small", (16, 16)) if rehearse else ("base", (976, 32))
  from aiayn_flax import train_step
  from aiayn_flax.attention import dropout
  defaults = session_config(size, plain)
  inputs = fixed_inputs(defaults, train_step.make_model(defaults), rows, length)
  programs = {}

  def program(overrides: tuple):
    """The step compiled with the session's forms and `overrides` ((form, on) pairs), once per
    distinct config (the defaults' program serves every default form's "on" on a GPU)."""
    config = session_config(size, plain)
    for form, on in overrides:
      config = with_form(config, form, on)
    key = json.dumps([config.to_dict(), dropout.DROPOUT_SEEDS], sort_keys=True, default=str)
    if key not in programs:
      start = time.monotonic()
      programs[key] = (compiled_step(config, inputs), time.monotonic() - start)
    return programs[key]

  for name in names:
    form = BY_NAME[name]
    record = {"form": name, "field": form.field, "size": size, "batch": f"{rows}x{length}",
              "dtype": "bfloat16"}
    if name in plain:
      continue
    try:
      # On a GPU the defaults ("auto") are the default forms' "on"; elsewhere they are plain.
      # The "on" first: a form that does not compile is found before its peer is compiled.
      on, on_s = program(() if platform == "gpu" and form.by_default else ((form, True),))
      off, off_s = program(((form, False),))
      record.update(compile_s=[on_s, off_s], works=True)
      results = {side: summary_of(*compiled(*inputs), inputs[0]) for side, compiled in
                 (("on", on), ("off", off))}
      record["equal"], record["numbers"] = compare(results["on"], results["off"], "bfloat16")
      if form.field == "DROPOUT_SEEDS":  # other random bits by design: the loss near, no more
        record["equal"] = "n/a (other dropout bits)"
      record["program_on"], record["program_off"] = program_facts(on), program_facts(off)
      record["program_problems"] = program_problems(form, record["program_on"],
                                                    record["program_off"], platform)
      record["timing"] = timed(lambda: on(*inputs), lambda: off(*inputs), rounds)
    except Exception as error:  # noqa: BLE001 - any failure to lower, compile or run
      from aiayn_flax import programs as programs_lib
      record.update(works=False, error=programs_lib.error_line(error))
    record["failed"] = (not record.get("works") or record.get("equal") is False
                        or bool(record.get("program_problems")))
    with open(os.path.join(out, "forms.jsonl"), "a") as f:
      f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def check_determinism(out: str, plain: list[str], rehearse: bool) -> None:
  """Part 3: three chained steps from one state and key, twice, compared bit for bit."""
  import jax
  import numpy as np
  from bench.synthetic_batches import synthetic_batches
  size, (rows, length) = ("small", (16, 16)) if rehearse else ("quickstart", (343, 8))
  config = session_config(size, plain)
  from aiayn_flax import train_step
  state, _, key = fixed_inputs(config, train_step.make_model(config), rows, length)
  batches = synthetic_batches(rows, length, config.model.vocab_size)[:3]
  compiled = compiled_step(config, (state, batches[0], key))

  def run():
    s, metrics = state, []
    for batch in batches:
      s, m = compiled(s, batch, key)
      metrics.append(m)
    return [np.asarray(x) for x in jax.tree.leaves((s.params, s.opt_state, metrics))]
  first, second = run(), run()
  equal = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(first, second))
  differing = sum(not np.array_equal(a, b, equal_nan=True) for a, b in zip(first, second))
  result = {"size": size, "batch": f"{rows}x{length}", "plain": plain, "steps": len(batches),
            "bit_for_bit": equal, "arrays_differing": differing, "arrays": len(first),
            "program": program_facts(compiled)}
  if jax.devices()[0].platform == "gpu" and size == "quickstart":
    # tests/test_gpu_step.py's bar for this program (deviceless for an H100, another XLA
    # allowed a few more), reached with every default form; a form made plain may add kernels.
    result["census_bar"] = gpu_bars.QUICKSTART_KERNELS
    result["within_bar"] = (
        result["program"]["kernels"] <= gpu_bars.QUICKSTART_KERNELS * gpu_bars.KERNELS_ALLOWANCE
        and not (result["program"]["while"] or result["program"]["conditional"]))
  with open(os.path.join(out, "determinism.json"), "w") as f:
    json.dump(result, f)
  print(json.dumps(result), flush=True)


def preflight(out: str) -> None:
  """Part 1: what this machine has, written to OUT/preflight.json."""
  import importlib.metadata
  import importlib.util
  facts = {"python": sys.version.split()[0], "versions": {}, "imports": {}}
  for package in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "jax-cuda12-pjrt",
                  "jax-cuda13-pjrt", "flax", "optax", "orbax-checkpoint", "numpy"):
    try:
      facts["versions"][package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      pass
  for module in ("tensorflow", "tensorflow_datasets", "torch", "nbclient", "sentencepiece",
                 "sacrebleu"):
    facts["imports"][module] = importlib.util.find_spec(module) is not None
  import jax
  device = jax.devices()[0]
  stats = device.memory_stats() or {}
  facts.update(platform=device.platform, device_kind=device.device_kind,
               device_count=jax.device_count(),
               compute_capability=str(getattr(device, "compute_capability", "")),
               memory_gb=round(stats.get("bytes_limit", 0) / 1e9, 1))
  facts["can_run"] = {
      "forms": True, "determinism": True,
      "quickstart": facts["imports"]["sentencepiece"] and facts["imports"]["sacrebleu"],
      "torch_peer": facts["imports"]["torch"], "notebook": facts["imports"]["nbclient"]}
  with open(os.path.join(out, "preflight.json"), "w") as f:
    json.dump(facts, f)
  print(json.dumps(facts), flush=True)


# ---------------------------------------------------------------- the session (no jax here)


def run_part(name: str, argv: list[str], seconds: float, env: dict, log) -> dict:
  """Runs a command under a time limit, its output appended to the session's log."""
  start = time.monotonic()
  log.write(f"\n===== {name}: {' '.join(argv)} (limit {seconds:.0f} s)\n")
  log.flush()
  try:
    code = subprocess.run(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                          timeout=max(seconds, 1)).returncode
  except subprocess.TimeoutExpired:
    code = "timed out"
  took = time.monotonic() - start
  log.write(f"===== {name}: exit {code} after {took:.1f} s\n")
  log.flush()
  print(f"{name}: exit {code} after {took:.1f} s (limit {seconds:.0f} s)", flush=True)
  return {"exit": code, "seconds": round(took, 1), "limit_s": round(seconds)}


def own_part(part: str, plain: list[str], extra: tuple = ()) -> list[str]:
  return [sys.executable, os.path.abspath(__file__), f"--part={part}", f"--out={FLAGS.out}",
          f"--plain={','.join(plain)}", f"--rehearse={FLAGS.rehearse}",
          f"--break_pallas={FLAGS.break_pallas}", *extra]


def read_json_lines(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def forms_part(seconds: float, env: dict, log, session: dict) -> None:
  """Decides every form, restarting the process after one that kills it; the session's plain
  forms grow with each failed form."""
  names = FLAGS.forms or [f.name for f in FORMS]
  rounds = FLAGS.rounds or (2 if FLAGS.rehearse else 20)
  deadline, runs = time.monotonic() + seconds, []
  path = os.path.join(FLAGS.out, "forms.jsonl")
  while True:
    decided = {r["form"] for r in read_json_lines(path)}
    left = [n for n in names if n not in decided]
    if not left or deadline - time.monotonic() < 1:
      break
    runs.append(run_part("forms", own_part("forms", session["plain"], (
        f"--forms={','.join(left)}", f"--rounds={rounds}")), deadline - time.monotonic(), env,
        log))
    records = read_json_lines(path)
    if len(records) == len(decided) and runs[-1]["exit"] != 0:  # ended in its first form
      records.append({"form": left[0], "works": False, "failed": True,
                      "error": f"the process ended ({runs[-1]['exit']}) in this form"})
      with open(path, "a") as f:
        f.write(json.dumps(records[-1]) + "\n")
    for record in records:
      if record.get("failed") and record["form"] not in session["plain"]:
        session["plain"].append(record["form"])
  session["forms"] = read_json_lines(path)
  session["forms"] += [{"form": n, "works": None, "error": "not reached in the part's time"}
                       for n in names if n not in {r["form"] for r in session["forms"]}]
  session["parts"]["forms"] = {"runs": runs, "seconds": round(sum(r["seconds"] for r in runs), 1),
                               "limit_s": round(seconds)}


def plain_overrides(plain: list[str]) -> list[str]:
  """train.py's --config flags that set the failed forms plain (the dropout seeds are a module
  switch that train.py does not reach: the session says so)."""
  return [f"--config.{BY_NAME[n].field}={BY_NAME[n].off}" for n in plain
          if BY_NAME[n].field != "DROPOUT_SEEDS" and BY_NAME[n].by_default]


def prepare(data_dir: str) -> None:
  """Here, with TF: the quick start's vocabulary and token caches (one training step in a
  throwaway workdir), and test2016's text files, so the device needs no TF."""
  workdir = os.path.join(data_dir, "quickstart_workdir")
  shutil.rmtree(workdir, ignore_errors=True)
  subprocess.run([sys.executable, "train.py", "--config=configs/multi30k.py",
                  f"--workdir={workdir}", "--config.num_train_steps=1",
                  "--config.eval_every_steps=1000", "--config.checkpoint_every_steps=1000"],
                 cwd=REPO, check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  for kept in os.listdir(workdir):
    if kept not in ("vocab.model", "tokenized"):
      path = os.path.join(workdir, kept)
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  raw = os.path.join(os.environ.get("AIAYN_DATA_DIR", "data"), "multi30k")
  for lang in ("en", "de"):
    with gzip.open(os.path.join(raw, f"test_2016_flickr.{lang}.gz"), "rt") as f, \
        open(os.path.join(data_dir, f"test2016.{lang}"), "w") as g:
      g.write(f.read())
  print(f"prepared {data_dir}: {sorted(os.listdir(data_dir))}")


# Runs `python -c NO_TENSORFLOW script.py ARGS` as `python script.py ARGS` where tensorflow and
# tensorflow_datasets cannot be imported, as on the device: a run that needs them fails here too.
NO_TENSORFLOW = """
import os, runpy, sys
class NoTensorflow:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("tensorflow", "tensorflow_datasets"):
      raise ModuleNotFoundError(f"No module named {name!r} (none on the device)", name=name)
sys.meta_path.insert(0, NoTensorflow())
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def quickstart_part(seconds: float, env: dict, log, session: dict) -> None:
  """Trains the quick start from the prepared workdir, TensorFlow made unimportable (as on
  the device), then scores test2016 greedy from the text files."""
  data_dir = os.path.abspath(os.path.join(REPO, FLAGS.data_dir))
  part = session["parts"]["quickstart"] = {"limit_s": round(seconds)}
  if not os.path.isdir(os.path.join(data_dir, "quickstart_workdir", "tokenized")):
    part["skipped"] = f"no prepared workdir in {data_dir} (python bench/device_session.py " \
        "--prepare, here)"
    return
  workdir = os.path.join("/tmp", "device_session_quickstart")
  shutil.rmtree(workdir, ignore_errors=True)
  shutil.copytree(os.path.join(data_dir, "quickstart_workdir"), workdir)
  steps = 8 if FLAGS.rehearse else max(100, int(seconds * 0.6 / 0.05))  # ~20 steps/s on a GPU
  # A checkpoint every quarter: a run cut at its time limit still leaves one to score.
  cut = ["--config.eval_decode_sentences=0", f"--config.num_train_steps={steps}",
         f"--config.eval_every_steps={steps}",
         f"--config.checkpoint_every_steps={max(steps // 4, 1)}",
         "--config.average_last_checkpoints=1", *plain_overrides(session["plain"])]
  if FLAGS.rehearse:
    cut += ["--config.model.num_layers=1", "--config.steps_per_call=1"]
  no_tf = [sys.executable, "-c", NO_TENSORFLOW]
  deadline = time.monotonic() + seconds
  part["train"] = run_part("quickstart_train", [*no_tf, "train.py", "--config=configs/multi30k.py",
                                                f"--workdir={workdir}", *cut],
                           0.75 * seconds, env, log)
  part["train"]["steps"] = steps
  evaluate = [*no_tf, "evaluate.py", f"--workdir={workdir}", "--beam_size=1",
              f"--src_file={data_dir}/test2016.en", f"--ref_file={data_dir}/test2016.de",
              "--target_lang=de", "--multi30k_bleu", f"--output_dir={workdir}/test2016",
              "--average_last=1"]
  part["test2016_greedy"] = run_part("quickstart_test2016_greedy", evaluate,
                                     deadline - time.monotonic(), env, log)
  for path in glob.glob(os.path.join(workdir, "test2016", "*.json")):
    with open(path) as f:
      part["test2016_greedy"]["scores"] = json.load(f)
  part["seconds"] = round(sum(part[k]["seconds"] for k in ("train", "test2016_greedy")), 1)


def markdown(session: dict) -> str:
  """The session's table: per form works / numerically equal / faster by how much."""
  pre = session.get("preflight") or {}
  lines = [f"# Device session {session['started']}", "",
           f"Device: {pre.get('device_count', '?')} x {pre.get('device_kind', '?')} (compute "
           f"capability {pre.get('compute_capability') or '-'}, {pre.get('memory_gb', '?')} GB); "
           f"{', '.join(f'{k} {v}' for k, v in pre.get('versions', {}).items())}.",
           "Optional imports: " + ", ".join(f"{k} {'yes' if v else 'no'}"
                                            for k, v in pre.get("imports", {}).items()) + ".",
           "", "| form | config switch (on / off) | works | numerically equal | faster by "
           "(off/on, quartiles) | on / off ms | kernels on / off | problems |",
           "|---|---|---|---|---:|---:|---:|---|"]
  for r in session.get("forms", []):
    form, timing = BY_NAME[r["form"]], r.get("timing") or {}
    faster = (f"{timing['speedup']:.3f}x ({timing['speedup_quartiles'][0]:.3f}-"
              f"{timing['speedup_quartiles'][1]:.3f})" if timing else "-")
    ms = f"{timing['on_ms']:.1f} / {timing['off_ms']:.1f}" if timing else "-"
    kernels = (f"{r['program_on']['kernels']} / {r['program_off']['kernels']}"
               if "program_on" in r else "-")
    equal = r.get("equal", "-")
    equal = {True: "yes", False: "no"}.get(equal, equal)
    lines.append(f"| {r['form']} | {form.field}={form.on} / {form.off} | "
                 f"{'yes' if r.get('works') else 'no: ' + r.get('error', '')} | {equal} | "
                 f"{faster} | {ms} | {kernels} | "
                 f"{'; '.join(r.get('program_problems', [])) or '-'} |")
  det = session.get("determinism") or {}
  lines += ["", f"Forms plain for the parts after them (failed): {session['plain'] or 'none'}.",
            f"Determinism: {det.get('bit_for_bit', 'not run')} ({det.get('arrays_differing', '?')}"
            f" of {det.get('arrays', '?')} arrays differ over {det.get('steps', '?')} steps); "
            f"its program: {det.get('program', {}).get('kernels', '?')} kernels"
            + (f", within the census bar ({gpu_bars.QUICKSTART_KERNELS} + "
               f"{gpu_bars.KERNELS_ALLOWANCE - 1:.0%}): {det['within_bar']}"
               if "within_bar" in det else "") + "."]
  quick = session["parts"].get("quickstart", {})
  scores = quick.get("test2016_greedy", {}).get("scores", {})
  lines.append(f"Quick start: {quick.get('skipped') or ''}" + (
      f"{quick['train']['steps']} steps, test2016 greedy: BLEU {scores.get('sacrebleu', 0):.2f} "
      f"(sacrebleu), {scores.get('multi30k_bleu', 0):.2f} (Multi30k's lowercased)" if scores
      else "no score"))
  lines += ["", "| part | exit | seconds | limit (s) | share of the session |",
            "|---|---|---:|---:|---:|"]
  for name, part in session["parts"].items():
    seconds = part.get("seconds", 0)
    exit_code = part.get("exit", ", ".join(str(r["exit"]) for r in part.get("runs", [])) or "-")
    lines.append(f"| {name} | {exit_code} | {seconds} | {part.get('limit_s', '-')} | "
                 f"{seconds / session['wall_s']:.0%} |")
  lines.append(f"| all | | {session['wall_s']} | {session['budget_s']} | |")
  return "\n".join(lines) + "\n"


def run_own_part() -> None:
  plain = [n for n in FLAGS.plain.split(",") if n]
  if FLAGS.break_pallas:
    break_pallas()
  if FLAGS.part == "preflight":
    preflight(FLAGS.out)
  elif FLAGS.part == "forms":
    decide_forms(FLAGS.out, FLAGS.forms, plain, FLAGS.rehearse, FLAGS.rounds)
  elif FLAGS.part == "determinism":
    check_determinism(FLAGS.out, plain, FLAGS.rehearse)
  else:
    raise app.UsageError(f"--part={FLAGS.part}: unknown")


def main(argv):
  del argv
  if FLAGS.prepare:
    prepare(os.path.abspath(os.path.join(REPO, FLAGS.data_dir)))
    return
  os.makedirs(FLAGS.out, exist_ok=True)
  if FLAGS.part:
    run_own_part()
    return
  start = time.monotonic()
  for stale in ("forms.jsonl", "preflight.json", "determinism.json"):
    if os.path.exists(os.path.join(FLAGS.out, stale)):
      os.remove(os.path.join(FLAGS.out, stale))
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
  if FLAGS.rehearse:
    env["JAX_PLATFORMS"] = "cpu"
  session = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "plain": [],
             "parts": {}, "budget_s": FLAGS.budget_s, "rehearse": FLAGS.rehearse,
             "break_pallas": FLAGS.break_pallas}
  left = lambda: FLAGS.budget_s - (time.monotonic() - start)  # noqa: E731
  with open(os.path.join(FLAGS.out, "session.log"), "w") as log:
    for part in FLAGS.parts:
      seconds = SHARES[part] * left() if part != "preflight" else SHARES[part] * FLAGS.budget_s
      if part == "forms":
        forms_part(seconds, env, log, session)
      elif part == "quickstart":
        quickstart_part(seconds, env, log, session)
      else:
        session["parts"][part] = run_part(part, own_part(part, session["plain"]), seconds, env,
                                          log)
        path = os.path.join(FLAGS.out, f"{part}.json")
        if os.path.exists(path):
          with open(path) as f:
            session[part] = json.load(f)
  session["wall_s"] = round(time.monotonic() - start, 1)
  with open(os.path.join(FLAGS.out, "session.json"), "w") as f:
    json.dump(session, f, indent=1)
  table = markdown(session)
  with open(os.path.join(FLAGS.out, "session.md"), "w") as f:
    f.write(table)
  print(table)


if __name__ == "__main__":
  app.run(main)
