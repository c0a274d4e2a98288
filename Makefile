# Two commands on a fresh machine:  make train  |  make test
# Each creates .venv (once) and installs the package with the CPU TensorFlow wheel.
# make train: trains the README LM (gin_configs/readme_lm.gin) on an emulated 8-core mesh,
# then decodes a few prompts. Run again, it resumes from the last checkpoint in MODEL_DIR.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
MODEL_DIR ?= /tmp/mesh_tf_readme_lm
MAIN   := $(PY) -m models.transformer.main --model_dir=$(MODEL_DIR) \
          --gin_file=models/lm_cpu_small.gin --gin_file=problems/pydoc_lm.gin \
          --gin_file=layouts/2x2_dp_mp.gin --gin_file=readme_lm.gin

.PHONY: train test venv clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[cpu,test]"
	touch $(STAMP)

venv: $(STAMP)

train: $(STAMP)
	$(MAIN) --mode=train
	$(MAIN) --mode=decode

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

clean:
	rm -rf $(VENV) .pytest_cache
