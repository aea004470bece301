"""The jitted programs of a run, built once for the trainer and for the compiled dry run
(`train.py --dry_run --target=...`), so that what the dry run compiles is what training runs:
the same functions, shardings and donations.

The step's GPU forms (config fields, docs/TRAIN.md's table) are hypotheses until a GPU runs
them: where a program does not compile with them (any error of lowering or of the compiler
that is not the device's memory), the programs are built again with the attention written out,
then with every form plain (PLAIN_FORMS), each time with one warning naming the form and its
switch, and the run goes on. Only where the plain forms fail too does the error stop it."""
import dataclasses
import functools

import jax
import ml_collections
from absl import logging

from aiayn_flax import config_checks, devices, model as model_lib, optimizer, sharding, train_step

# Each GPU form's config field and its plain form (what a CPU runs), in the order a run falls
# back: the attention first (Pallas's kernels are where a GPU compile is likeliest to fail),
# then the rest together.
PLAIN_FORMS = {"model.attention_implementation": "written_out",
               "model.layer_norm_implementation": "flax", "loss_implementation": "reductions",
               "optimizer_implementation": "per_array", "aligned_row_tokens": 0}
FALLBACKS = (("model.attention_implementation",), tuple(PLAIN_FORMS))


def aligned_tokens(config, mesh) -> int:
  """The tokens a batch's rows are aligned to (train_step.with_aligned_rows): on one GPU,
  config.aligned_row_tokens. Over several devices the rows appended at the end would all fall
  on the last one, so there the batches stay as they come."""
  one_gpu = mesh.devices.size == 1 and mesh.devices.flat[0].platform == "gpu"
  return config.get("aligned_row_tokens", 256) if one_gpu else 0


def step_forms(config, mesh) -> train_step.StepForms:
  return train_step.StepForms(loss=config.get("loss_implementation", "auto"),
                              optimizer=optimizer.update_form(config),
                              aligned_tokens=aligned_tokens(config, mesh))


def form_value(config, field: str):
  """The value of a PLAIN_FORMS field in `config`, or the one an older run had in effect where
  its config lacks it (config_checks' registry: "auto", 256 aligned tokens)."""
  *block, key = field.split(".")
  return (config[block[0]] if block else config).get(key, config_checks.ADDED_FIELDS[field])


def with_plain_forms(config, fields):
  """A copy of `config` with `fields` (of PLAIN_FORMS) set to their plain form."""
  plain = config.copy_and_resolve_references()
  for field in fields:
    *block, key = field.split(".")
    (plain[block[0]] if block else plain)[key] = PLAIN_FORMS[field]
  return plain


def warn_fallback(what: str, in_use: dict, error: Exception) -> None:
  """The one warning of a fallback: what did not compile, the fields switched as they were
  (`in_use`, field -> value) and as they now are, the error and the flags that start so."""
  plain = [f"{field}={PLAIN_FORMS[field]}" for field in in_use]
  logging.warning("%s did not compile with %s (%s); going on with %s: set --config.%s to "
                  "start so (docs/TRAIN.md, the GPU forms)", what,
                  ", ".join(f"{field}={value}" for field, value in in_use.items()),
                  error_line(error), ", ".join(plain), " --config.".join(plain))


def is_device_memory_error(error: Exception) -> bool:
  """An overflow of the device's memory (a TPU compiler's RESOURCE_EXHAUSTED "... exceeds
  available HBM"), which no form switches; not a kernel's shared memory ("Shared memory size
  limit exceeded"), which a smaller block or another form can avoid."""
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text and "shared memory" not in text.lower()


def does_not_compile(jitted, args) -> bool:
  """Whether `jitted` traces for `args` but does not lower or compile: what a fallback can
  mend. An error in tracing (the program's own) or at run time is not."""
  if any(isinstance(x, jax.Array) and x.is_deleted() for x in jax.tree.leaves(args)):
    return False  # it ran, and consumed its donated arguments
  try:
    traced = jitted.trace(*args)
  except Exception:  # noqa: BLE001 - the program's error, raised by the call as it is
    return False
  try:
    traced.lower().compile()
  except Exception:  # noqa: BLE001
    return True
  return False


def error_line(error: Exception) -> str:
  lines = [line for line in str(error).splitlines() if line.strip()] or [""]
  return f"{type(error).__name__}: {lines[0][:240]}"


@dataclasses.dataclass(frozen=True)
class TrainingPrograms:
  step_fn: object  # (state, batch, rng) -> (state, metrics): one optimizer step
  steps_fn: object  # (state, [K, ...] batches, num_steps, rng): several steps in one call
  accumulate_fn: object  # (sums | None, params, batch, rng, step, micro_step) -> sums
  apply_fn: object  # (state, grad_sums, metrics) -> (state, metrics): the accumulated update
  eval_fn: object  # (params, batch) -> metric sums
  forms: "FormFallback"  # the config they are built from now, and its fallbacks


class FormFallback:
  """The config the programs are built from: the run's, until a program fails to compile
  with its forms; then the next of FALLBACKS' (one warning each). `build(config)` returns the
  jitted functions by name."""

  def __init__(self, config, build, where: str):
    self.config, self._build, self._where = config, build, where
    self._fallbacks = [fields for fields in FALLBACKS
                       if any(form_value(config, f) != PLAIN_FORMS[f] for f in fields)]
    self.functions = build(config)
    self.fell_back = []  # the fields switched, in order

  def fall_back(self, program: str, error: Exception) -> bool:
    """Builds the programs with the next fallback's plain forms (False: none is left)."""
    if not self._fallbacks:
      return False
    fields = self._fallbacks.pop(0)
    in_use = {f: form_value(self.config, f) for f in fields
              if form_value(self.config, f) != PLAIN_FORMS[f]}
    warn_fallback(f"{self._where}: {program}", in_use, error)
    self.config = with_plain_forms(self.config, fields)
    self.fell_back += list(in_use)
    self.functions = self._build(self.config)
    return True


class Program:
  """One of a run's jitted programs, called as jax.jit's (and lowered as it: `lower`,
  `__wrapped__`), that falls back to plainer forms where it does not compile."""

  def __init__(self, name: str, forms: FormFallback):
    self.name, self._forms = name, forms

  @property
  def jitted(self):
    return self._forms.functions[self.name]

  @property
  def __wrapped__(self):
    return self.jitted.__wrapped__

  def lower(self, *args):
    return self.jitted.lower(*args)

  def trace(self, *args):
    return self.jitted.trace(*args)

  def compile(self, *args):
    """lower(*args).compile(), falling back where the forms do not lower or compile (an error
    in tracing is the program's, not a form's: raised as it is)."""
    while True:
      traced = self.jitted.trace(*args)
      try:
        return traced.lower().compile()
      except Exception as error:  # noqa: BLE001 - any lowering or compiler error
        if is_device_memory_error(error) or not self._forms.fall_back(self.name, error):
          raise

  def __call__(self, *args):
    try:
      return self.jitted(*args)
    except Exception as error:  # noqa: BLE001 - told apart below
      # A failure to compile leaves the (donated) arguments as they were: the call is tried
      # again with plainer forms. One at run time (or no fallback left) is the caller's.
      if is_device_memory_error(error) or not self._does_not_compile(args):
        raise
      if not self._forms.fall_back(self.name, error):
        raise
    return self(*args)

  def _does_not_compile(self, args) -> bool:
    return does_not_compile(self.jitted, args)


def training_programs(config, model, mesh, state_sharding) -> TrainingPrograms:
  """The train, accumulate/apply and eval programs of `config` on `mesh`; the state is
  donated (updated in place), batches are split along `data`. `model` is the config's
  (train_step.make_model); a fallback builds its own with plainer forms."""
  batch_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  stacked_batch_sharding = sharding.stacked_batch_sharding(mesh)
  # Traced knowing their devices' platform: on a CPU mesh, the CPU's forms alone.
  platform = mesh.devices.flat[0].platform
  for_mesh = functools.partial(devices.traced_for, platform)

  def build(config_):
    model_ = model if config_ is config else train_step.make_model(
        config_, mesh.devices.flat[0], mesh.devices.size)
    schedule = optimizer.learning_rate_schedule(config_)
    common = dict(model=model_, label_smoothing=config_.label_smoothing,
                  forms=step_forms(config_, mesh))
    step = dict(common, schedule=schedule)
    return {
        "step_fn": jax.jit(functools.partial(for_mesh(train_step.train_step), **step),
                           in_shardings=(state_sharding, batch_sharding, replicated),
                           out_shardings=(state_sharding, replicated), donate_argnums=0),
        "steps_fn": jax.jit(functools.partial(for_mesh(train_step.train_steps), **step),
                            in_shardings=(state_sharding, stacked_batch_sharding, replicated,
                                          replicated),
                            out_shardings=(state_sharding, replicated), donate_argnums=0),
        "accumulate_fn": jax.jit(functools.partial(for_mesh(train_step.accumulate_step),
                                                   **common), donate_argnums=0),
        "apply_fn": jax.jit(functools.partial(for_mesh(train_step.apply_gradient_sums),
                                              schedule=schedule, forms=common["forms"]),
                            out_shardings=(state_sharding, replicated), donate_argnums=(0, 1)),
        "eval_fn": jax.jit(functools.partial(for_mesh(train_step.eval_step), **common)),
    }

  forms = FormFallback(config, build, "training")
  return TrainingPrograms(**{name: Program(name, forms) for name in forms.functions},
                          forms=forms)


# What decoding can fall back from: the model's own forms that inference runs (its attention is
# always written out: attention/backends.py).
DECODING_FORMS = ("model.layer_norm_implementation",)


def plain_model(model):
  """`model` (a Transformer) with DECODING_FORMS plain."""
  plain = {f.split(".", 1)[1]: PLAIN_FORMS[f] for f in DECODING_FORMS}
  return model_lib.Transformer(ml_collections.FrozenConfigDict(model.config.to_dict() | plain))


class DecodingWithFallback:
  """A decoding function (params, inputs) -> outputs made by `make(model)`, as jax.jit's, that
  is made again from plain_model(model) where it does not compile (evaluate.py, translate.py,
  training's validation BLEU), with one warning."""

  def __init__(self, model, make):
    self._model, self._make = model, make
    self.jitted, self.fell_back = make(model), False

  def lower(self, *args):
    return self.jitted.lower(*args)

  def __call__(self, *args):
    try:
      return self.jitted(*args)
    except Exception as error:  # noqa: BLE001 - told apart below
      in_use = {f: form_value({"model": self._model.config}, f) for f in DECODING_FORMS}
      in_use = {f: value for f, value in in_use.items() if value != PLAIN_FORMS[f]}
      if (self.fell_back or not in_use or is_device_memory_error(error)
          or not does_not_compile(self.jitted, args)):
        raise
      warn_fallback("decoding", in_use, error)
      self.jitted, self.fell_back = self._make(plain_model(self._model)), True
    return self.jitted(*args)
