# Every target creates .venv and installs the project first, so a fresh clone needs only
# Python >= 3.11 (docs/INSTALL.md). The install takes the exact versions tested from
# requirements.lock.
#
# `make quickstart` trains on the accelerator when the host has one, and installs only what
# that needs: jax's TPU extra on a TPU VM, its CUDA 12 extra where nvidia-smi sees a GPU, plain
# jax for the CPU otherwise. `ACCELERATOR=cpu` (or tpu, gpu) overrides the guess. `make install`
# installs the same and trains nothing (a login node that has no GPU: `ACCELERATOR=gpu`).
# `make test` installs the test tools, the TPU/GPU compilers of --dry_run --target (the
# `aot` extra) and export.py's engines (the `export` extra: ctranslate2, transformers and torch's
# CPU build, docs/EXPORT.md), and runs the tests on the CPU.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOCK := requirements.lock
WORKDIR ?= runs/multi30k

# Real data: AIAYN_DATA_DIR when the user sets it, else ../shared/data when that folder is
# beside the clone (our CI); otherwise the code downloads Multi30k.
ifeq ($(origin AIAYN_DATA_DIR),undefined)
  ifneq ($(wildcard ../shared/data/.),)
    export AIAYN_DATA_DIR := $(abspath ../shared/data)
  endif
endif

# A Cloud TPU VM says so in its environment (TPU_ACCELERATOR_TYPE, as Colab's TPU runtime
# does too) or has TPU device files (/dev/accel0 on v2-v4, /dev/vfio/0 on v5e and later).
ACCELERATOR ?= $(shell \
  if [ -n "$$TPU_ACCELERATOR_TYPE" ] || [ -e /dev/accel0 ] || [ -e /dev/vfio/0 ]; then echo tpu; \
  elif nvidia-smi -L >/dev/null 2>&1; then echo gpu; \
  else echo cpu; fi)
EXTRA_tpu := [tpu]
EXTRA_gpu := [cuda12]
EXTRA_cpu :=
JAX_PLATFORM_tpu := tpu
JAX_PLATFORM_gpu := cuda
JAX_PLATFORM_cpu := cpu
ifeq ($(EXTRA_$(ACCELERATOR))$(JAX_PLATFORM_$(ACCELERATOR)),)
  $(error ACCELERATOR=$(ACCELERATOR): expected tpu, gpu or cpu)
endif

.PHONY: install quickstart test test-fast clean

# jax 0.10.2 needs Python >= 3.11; Ubuntu 22.04 (TPU VM images among them) ships 3.10.
$(VENV)/bin/python:
	@v=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); \
	case "$$v" in 3.1[1-9]|3.[2-9][0-9]) ;; *) echo "make: $(PYTHON) is Python $${v:-(not found)}; aiayn_flax needs Python >= 3.11: make PYTHON=python3.11, or get one with uv (curl -LsSf https://astral.sh/uv/install.sh | sh; uv python install 3.11; make PYTHON=\$$(uv python find 3.11)), docs/INSTALL.md" >&2; exit 1;; esac
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# One stamp per install, so that a change of extras installs again.
$(VENV)/installed-run-$(ACCELERATOR): pyproject.toml $(LOCK) | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.$(EXTRA_$(ACCELERATOR))' -c $(LOCK)
	touch $@

# On Linux x86-64 the lock pins torch's CPU build, torch==2.13.0+cpu (PyPI's wheel would bring
# CUDA: GBs), which PyPI does not serve: pip takes it from the indexes and folders it is set up
# with, and from PyTorch's CPU index where that answers (a 5-second look). Where none has it, the
# lock makes pip stop before downloading anything, and the tests are installed without the
# export extra: tests/test_export.py skips the engines' tests, saying why.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_CPU_INDEX_OPTION = $(shell $(PYTHON) -c "import urllib.request as r; r.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" >/dev/null 2>&1 && echo --extra-index-url $(TORCH_CPU_INDEX))

$(VENV)/installed-test: pyproject.toml $(LOCK) | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[dev,aot,export]' -c $(LOCK) $(TORCH_CPU_INDEX_OPTION) || { \
	  echo "make: the export extra did not install (pip's error above; torch's CPU build comes from pip's own indexes or $(TORCH_CPU_INDEX)): the tests are installed without it, and tests/test_export.py skips the engines' tests (docs/INSTALL.md; rm $@ to try again)" >&2; \
	  $(PY) -m pip install -q -e '.[dev,aot]' -c $(LOCK); }
	touch $@

# Install only, train nothing: `make install ACCELERATOR=gpu` on a SLURM login node without a
# GPU installs the CUDA 12 extra that the GPU nodes' jobs run (docs/MULTI_HOST.md).
install: $(VENV)/installed-run-$(ACCELERATOR)
	@echo "make install: .venv has the $(ACCELERATOR) install ('.$(EXTRA_$(ACCELERATOR))', requirements.lock); nothing trained"

# On the CPU, glibc's malloc on transparent huge pages: XLA:CPU's per-call buffers then fault in
# 2 MiB at a time, fewer faults and less time per step (docs/INSTALL.md#on-a-cpu-malloc-on-huge-pages;
# the run's log says whether it took), added to the user's GLIBC_TUNABLES. Not on a GPU or TPU,
# where nothing measured a gain; nor where the user's GLIBC_TUNABLES already says.
ifeq ($(findstring glibc.malloc.hugetlb,$(GLIBC_TUNABLES)),)
  MALLOC_ENV_cpu := GLIBC_TUNABLES=$(if $(GLIBC_TUNABLES),$(GLIBC_TUNABLES):)glibc.malloc.hugetlb=1
endif
MALLOC_ENV := $(MALLOC_ENV_$(ACCELERATOR))

# Train the quick start on Multi30k, then score test2016 (sacreBLEU with its signature):
# greedy, then the paper's recipe (beam 4), both on the last 5 checkpoints averaged
# (configs/multi30k.py's average_last_checkpoints).
# JAX_PLATFORMS names the backend chosen, so that jax uses it or fails saying why.
quickstart: export JAX_PLATFORMS := $(JAX_PLATFORM_$(ACCELERATOR))
quickstart: $(VENV)/installed-run-$(ACCELERATOR)
	@echo "make quickstart: training on the $(ACCELERATOR) (JAX_PLATFORMS=$(JAX_PLATFORMS)); ACCELERATOR=cpu|gpu|tpu overrides"
	$(MALLOC_ENV) $(PY) train.py --config=configs/multi30k.py --workdir=$(WORKDIR)
	$(MALLOC_ENV) $(PY) evaluate.py --workdir=$(WORKDIR) --testset=multi30k/test2016 --beam_size=1
	$(MALLOC_ENV) $(PY) evaluate.py --workdir=$(WORKDIR) --testset=multi30k/test2016

# pytest-xdist, one test file per worker at a time (--dist loadfile): a file's module fixtures
# are built once. `-n auto` starts one worker per core; TEST_WORKERS=2 (or any number) says
# otherwise. TESTS narrows the run to some files (TESTS=tests/test_model.py).
# The tests run on the CPU whatever the host has (conftest.py sets JAX_PLATFORMS=cpu too).
TEST_WORKERS ?= auto
TESTS ?= tests

test: $(VENV)/installed-test
	JAX_PLATFORMS=cpu $(PY) -m pytest $(TESTS) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20

# The tests not marked slow (no training, no subprocess, no compiling for an accelerator):
# a few minutes on 2 cores; `make test` runs them all (docs/TESTS.md).
test-fast: $(VENV)/installed-test
	JAX_PLATFORMS=cpu $(PY) -m pytest $(TESTS) -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10

clean:
	rm -rf $(VENV)
