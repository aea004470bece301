# Every target creates .venv and installs the project first, so a fresh clone needs only Python 3.11.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WORKDIR ?= runs/multi30k
export AIAYN_DATA_DIR ?= $(abspath ../shared/data)

.PHONY: venv quickstart test clean

$(VENV)/installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/installed

# Train the CPU quick start on Multi30k, then score test2016 (sacreBLEU with its signature):
# greedy with the last checkpoint, then the paper's recipe (beam 4, last 5 checkpoints averaged).
quickstart: venv
	$(PY) train.py --config=configs/multi30k.py --workdir=$(WORKDIR)
	$(PY) evaluate.py --workdir=$(WORKDIR) --testset=multi30k/test2016 --beam_size=1 --average_last=1
	$(PY) evaluate.py --workdir=$(WORKDIR) --testset=multi30k/test2016

test: venv
	$(PY) -m pytest tests --durations=20

clean:
	rm -rf $(VENV)
