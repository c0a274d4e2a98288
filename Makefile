# Two commands on a fresh machine:  make train  |  make test
# Each creates .venv (once) and installs the package with the CPU TensorFlow wheel.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: train test venv clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[cpu,test]"
	touch $(STAMP)

venv: $(STAMP)

train: $(STAMP)
	$(PY) -m models.mlp.main

test: $(STAMP)
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) .pytest_cache
