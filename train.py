"""Train a Transformer: python train.py --config=configs/base.py --workdir=runs/base

Any config field can be overridden: --config.num_train_steps=1000 --config.mesh=data:4,model:2.
--dry_run prints the plan (parameters, batch, mesh, FLOPs) and the gradient accumulation the
trainer will choose on these devices (it compiles the step where their memory is known: a GPU,
a TPU, or --config.device_memory_bytes), without training.

At start it prints the backend and the devices. A paper-scale config (config.needs_accelerator:
configs/base.py, big.py, big_enfr.py) is refused on the CPU backend unless --config.device=cpu
is given: on a TPU VM or a GPU host that means jax for the CPU was installed, not the
accelerator's extra.

Exit status: 0 when training reached num_train_steps; 128 + the signal's number when SIGTERM
(143) or SIGINT (130) stopped it after saving a checkpoint at the current step (run the same
command to continue: schedulers can requeue on 143 as on a preemption); 1 with one line on
stderr for bad input, a training that diverged, or a workdir that another run took over
while this one trained (it then saves nothing more), or a write that failed (a full disk, a
read-only workdir: the line names the path, the cause, the newest intact checkpoint and what
to do; the libraries' tracebacks are in the debug log, which -v 1 shows).
"""
import os
import re
import signal
import sys

from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/base.py[:ROW].",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, vocabulary and metrics.")
flags.DEFINE_bool("dry_run", False, "Print the run's plan and exit without training.")
flags.DEFINE_string("target", None, "With --dry_run: also compile the run's programs for this "
                    "accelerator (e.g. tpu-v4-8, gpu-h100x8; "
                    "aiayn_flax/planning/accelerator_targets.py) and print the memory XLA "
                    "reports; needs pip install -e '.[aot]'.")
flags.DEFINE_bool("prepare_data", False, "Download and prepare the config's tfds dataset into "
                  "config.dataset.data_dir (e.g. gs://BUCKET/tensorflow_datasets) and exit: once, "
                  "on any machine, before a run on several hosts.")
flags.DEFINE_bool("force_resume", False, "Resume even if the workdir's config differs in a field "
                  "that changes the model or the data.")
flags.mark_flags_as_required(["config"])
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from aiayn_flax.runtime.tensorflow_setup import keep_tensorflow_off_accelerators
  keep_tensorflow_off_accelerators()  # before any tf.data work: TF must not take GPU memory
  # After flag parsing: keeps --help fast.
  from aiayn_flax.runtime import cluster, compilation_cache, workdir_lease
  from aiayn_flax.training import checkpoint_room, trainer
  config = FLAGS.config
  if FLAGS.dry_run:
    if FLAGS.target:
      compiled_dry_run(config, FLAGS.target)
    else:
      local_dry_run(config)
    checkpoints_line, fits = checkpoint_room.planned_checkpoints_line(config, FLAGS.workdir)
    if not fits:  # the kept checkpoints' bytes against the workdir's free space
      sys.exit(f"train.py: error: {checkpoints_line}")
    print(checkpoints_line)
    return
  if FLAGS.prepare_data:
    from aiayn_flax import tasks
    print(tasks.for_config(config).prepare_data(config))
    return
  from aiayn_flax.runtime import host_agreement
  try:
    cluster.initialize_distributed()  # a multi-host slice: join the other processes first
    # A host whose config file failed to load has joined too, to say so (stop_every_host).
    host_agreement.stop_if_any_failed("--config", None)
  except (cluster.NotJoined, host_agreement.AnotherHostFailed) as e:
    sys.exit(f"train.py: error: {e}")  # no run at all: unable to join, or a host's config
  if not FLAGS.workdir:
    raise app.UsageError("--workdir is required to train")
  refusal = check_backend(config)
  if refusal:
    sys.exit(f"train.py: error: {refusal}")
  compilation_cache.enable(config, FLAGS.workdir)  # before the first compile
  try:
    summary = trainer.train_and_evaluate(config, FLAGS.workdir, FLAGS.force_resume)
  except (FileNotFoundError, ValueError, trainer.NonFiniteTrainingError,
          workdir_lease.LeaseLost) as e:
    # (on several hosts, without waiting for threads a library left waiting for a host that
    # stopped: host_agreement.end_process)
    host_agreement.end_process(f"train.py: error: {e}")
  if summary["stopped_by"]:
    print(f"stopped by {summary['stopped_by']} at step {summary['step']} (checkpoint saved); "
          "run the same command to continue", file=sys.stderr)
    sys.exit(128 + signal.Signals[summary["stopped_by"]].value)
  logging.info("finished at step %d: %s", summary["step"], summary)
  print(f"params_digest: {summary['params_digest']}")


def check_backend(config) -> str | None:
  """Prints the backend and devices; returns why the run must not start on them, or None."""
  import jax
  devices = jax.devices()
  print(f"backend: {jax.default_backend()}; {len(devices)} x {devices[0].device_kind} "
        f"over {jax.process_count()} process(es)", flush=True)
  if (jax.default_backend() == "cpu" and config.needs_accelerator
      and config.get("device", "") != "cpu"):
    return (f"{config.name} is a paper-scale run and jax sees only the CPU: on a TPU VM "
            "pip install -e '.[tpu]' -c requirements.lock, on an NVIDIA GPU host pip install -e "
            "'.[cuda12]' -c requirements.lock; to train on the CPU anyway add --config.device=cpu")
  return None


def local_dry_run(config) -> None:
  """The run's plan for the devices here, as the trainer makes it (planning/run_plan.py: the
  accumulation compiled where their memory is known), printed: the analytic plan at that
  accumulation and the fit: line; exits non-zero in one line when nothing fits."""
  from aiayn_flax.planning import run_plan
  plan = run_plan.for_local_devices(config)
  print(plan.text(), flush=True)
  if not plan.fit.fits:
    sys.exit(f"train.py: error: does not fit: {plan.fit.line}")


def compiled_dry_run(config, target_name: str) -> None:
  """For the target's devices: the run's plan (planning/run_plan.py: the training step
  compiled at the accumulation the trainer will choose there), printed as local_dry_run's,
  then every program compiled; exits non-zero with one line when the target is unknown or the
  run does not fit."""
  from aiayn_flax.planning import accelerator_targets, compiled_plan, run_plan
  try:
    target = accelerator_targets.target(target_name)
  except ValueError as e:
    sys.exit(f"train.py: error: {e}")
  config = config.copy_and_resolve_references()
  if not config.device:
    config.device, config.num_devices = target.kind, target.num_devices
  try:
    plan = run_plan.for_target(config, target)
  except ValueError as e:  # no compiler for the target here
    sys.exit(f"train.py: error: {e}")
  print(plan.text(), flush=True)
  if not plan.fit.fits:
    sys.exit(f"train.py: error: does not fit: {plan.fit.line}")
  try:
    result = compiled_plan.compile_run(plan.config, target_name, training=plan.programs or None,
                                       accumulation=plan.accumulation)
  except (compiled_plan.DoesNotFit, ValueError) as e:
    sys.exit(f"train.py: error: does not fit: {e}" if isinstance(e, compiled_plan.DoesNotFit)
             else f"train.py: error: {e}")
  print("\n".join(compiled_plan.plan_lines(result)))
  if not result["fits"]:
    sys.exit(f"train.py: error: does not fit: {compiled_plan.does_not_fit_message(result)}")


def config_path_error(argv: list[str]) -> str | None:
  """One line when --config names no file (a typo ends in a long ml_collections traceback
  otherwise), naming the configs there are; None when it names one."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      value = arg.split("=", 1)[1]
    elif arg == "--config" and i + 1 < len(argv):
      value = argv[i + 1]
    else:
      continue
    path = value.split(":", 1)[0]  # configs/base.py:ROW
    if not os.path.isfile(path):
      configs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
      known = sorted(os.path.relpath(os.path.join(configs, name))
                     for name in os.listdir(configs)
                     if name.endswith(".py") and not name.startswith("_"))
      return f"--config={value}: no such file {path!r}; the configs: {', '.join(known)}"
  return None


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a missing config file, a bad config argument (an unknown
  Table 3 row) and an unknown --config.KEY reported in one line, not a traceback from inside
  ml_collections; on every host of a run at once (stop_every_host)."""
  try:
    return _parse_flags(argv)
  except SystemExit as e:
    if isinstance(e.code, str):  # the one line of a config that failed to load
      stop_every_host(e.code, argv)
    raise


def stop_every_host(message: str, argv: list[str]) -> None:
  """Exits with `message` (a config that failed to load here). Launched as one of several
  processes that will train, this one joins the others first and hands them its error, so that
  every host stops at once in one line (a config file missing from one host's disk), where the
  others would wait for it until JAX's start-up timeout (300 s)."""
  # (jax only where a launch may join: a typo stays one line)
  from aiayn_flax.runtime import cluster
  trains = not any(arg.split("=", 1)[0] in ("--dry_run", "--prepare_data")
                   and arg.split("=", 1)[-1].lower() not in ("false", "0") for arg in argv)
  try:
    if trains and cluster.maybe_launched_with_others(os.environ) and cluster.join_arguments(
        os.environ, cluster.launched_process_count()) is not None:
      from aiayn_flax.runtime import host_agreement
      cluster.initialize_distributed()
      host_agreement.stop_if_any_failed("--config", message.removeprefix("train.py: error: "))
  except Exception:  # noqa: BLE001 - no joining (NotJoined, ...): this host's line alone
    pass
  sys.exit(message)


def _parse_flags(argv: list[str]) -> list[str]:
  if error := config_path_error(argv):
    sys.exit(f"train.py: error: {error}")
  try:
    return FLAGS(argv)
  except flags.IllegalFlagValueError as e:  # get_config raised: its message ends the text
    sys.exit(f"train.py: error: {str(e).strip().splitlines()[-1]}")
  except (AttributeError, KeyError) as e:
    message = str(e).encode().decode("unicode_escape")  # ml_collections' message, unescaped
    key = re.search(r"'(\w+)'", message)
    key = key.group(1) if key else message
    suggestion = re.search(r'Did you mean "(\w+)"', message)
    given = [a for a in argv[1:] if a.startswith("--config.") and key in a.split("=", 1)[0]]
    from aiayn_flax.config_checks import renamed_field_message
    if renamed := renamed_field_message(key):
      sys.exit(f"train.py: error: {' '.join(given) or key}: {renamed}")
    sys.exit(f"train.py: error: {' '.join(given) or key}: the config has no field {key!r}"
             + (f" (did you mean {suggestion.group(1)!r}?)" if suggestion else "")
             + "; run with --dry_run, or read the config file, for the fields it has")


if __name__ == "__main__":
  from aiayn_flax.runtime import garbage_collection, huge_pages
  garbage_collection.collect_less_often()  # before JAX's imports (fewer collections)
  huge_pages.log_once_flags_are_parsed()  # malloc on huge pages? (set from outside: no restart)
  app.run(main, flags_parser=parse_flags)
