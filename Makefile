# Every target creates .venv and installs the project first, so a fresh clone needs only Python 3.11.
# The install takes the exact versions tested from requirements.lock (README, "Install"), with
# the test tools and the compilers for TPU/GPU targets (the `aot` extra: --dry_run --target=).
# These targets are the CPU path; on a TPU or GPU host, install its extra and run train.py
# (README, "Install on TPU / GPU").
export JAX_PLATFORMS ?= cpu
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

.PHONY: venv quickstart test clean

$(VENV)/installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,aot]' -c $(LOCK)
	touch $@

venv: $(VENV)/installed

# Train the CPU quick start on Multi30k, then score test2016 (sacreBLEU with its signature):
# greedy with the last checkpoint, then the paper's recipe (beam 4, last 5 checkpoints averaged).
quickstart: venv
	$(PY) train.py --config=configs/multi30k.py --workdir=$(WORKDIR)
	$(PY) evaluate.py --workdir=$(WORKDIR) --testset=multi30k/test2016 --beam_size=1 --average_last=1
	$(PY) evaluate.py --workdir=$(WORKDIR) --testset=multi30k/test2016

# Two pytest workers (pytest-xdist), one test file each at a time: a file's module fixtures
# are built once. One process kept 1.15 of 2 cores busy; two ran the suite in 19 min, not 28.
TEST_WORKERS ?= 2

test: venv
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadfile --durations=20

clean:
	rm -rf $(VENV)
