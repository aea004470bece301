"""Planning for accelerators: what a config needs on hardware that may not be here.

  accelerator_targets.py  the TPU and GPU kinds a plan or compilation can be made for
  flops.py                the model's analytic FLOPs per training step
  dry_run.py              the dry run's plan: memory per device, micro-batches, step time, MFU
  compiled_plan.py        the same from XLA's compiled programs (train.py --dry_run --target)
  fit.py                  the gradient accumulation a run needs, chosen by compiling
  run_plan.py             the run's plan, made once at start: mesh, fit, micro-batches; the
                          trainer trains it and train.py --dry_run prints it
  kernel_census.py        the kernels of a compiled training step, counted by kind

devices.py (the kinds of devices) and sharding.py (mesh and partition rules) stay in the model
layer beside model.py: the model, optimizer and translator place arrays with them, so here the
two layers would import each other.

May import: aiayn_flax.runtime, aiayn_flax.data, aiayn_flax.decoding, aiayn_flax,
  aiayn_flax.attention, aiayn_flax.parsing, aiayn_flax.tasks
"""
