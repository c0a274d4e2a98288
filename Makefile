# Two commands on a fresh machine:  make train  |  make test
# Each creates .venv (once) and installs the package with the CPU TensorFlow wheel:
# `make train` only what training needs (.[cpu]), `make test` adds the test extra
# (.[cpu,test]). Editing setup.py re-installs on the next run.
# make train: trains the README LM (gin_configs/readme_lm.gin) on an emulated 8-core mesh,
# then decodes a few prompts. Run again, it resumes from the last checkpoint in MODEL_DIR.
# PYTHON picks the interpreter the venv is built from (make PYTHON=python3.10 train);
# TRAIN_FLAGS is appended to both trainer commands, e.g.
#   make train TRAIN_FLAGS="--gin_param=utils.run.train_steps=40"
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# One stamp per install level: .[cpu] for train, .[cpu,test] for test. The test stamp
# implies the train one, so `make train` after `make test` installs nothing.
STAMP_TRAIN := $(VENV)/.installed-cpu
STAMP_TEST  := $(VENV)/.installed-cpu-test
MODEL_DIR ?= /tmp/mesh_tf_readme_lm
TRAIN_FLAGS ?=
PIP_FLAGS ?= --quiet
# Three workers on two cores: many tests wait on subprocesses or sockets, so a third
# worker fills those gaps (the idle suite, 2026-12-04: 24 min 39 s with -n 3, 26 min 48 s
# with -n 2). Wall time is about the suite's CPU-seconds / 2, and this host's speed
# varies by up to half between runs of the same code. 2026-12-05, measured with
# /usr/bin/time around `make test`: 59.8 CPU-minutes (29 min 44 s, idle) at 14:10; 30.1
# CPU-minutes at 16:08 after the tests shared more of their runs and XLA/GC settings in
# tests/conftest.py (24 min 51 s, with two other test runs sharing the cores); the same
# code idle at 16:38: 16 min 40 s, 32.2 CPU-minutes. 2026-12-05 18:39, idle, after the
# line-count cut of issue 33: 16 min 13 s, 31.4 CPU-minutes (CI took 21 min 28 s at
# stop 45). 2026-12-05 21:40, idle, on another host (AMD EPYC, 2 cores): 7 min 41 s,
# 14.4 CPU-minutes, all three passes; 2026-12-06 00:28 on that host, with the new tests
# and the memory-peak test's 3 runs: 9 min 22 s, 17.7 CPU-minutes; 2026-12-06 02:06,
# after the default corpus was packed in memory: 8 min 21 s, 15.6 CPU-minutes; at 02:30
# with this stop's last tests: 8 min 21 s, 15.8 CPU-minutes; at 02:50 after the review:
# 7 min 48 s, 14.6 CPU-minutes; at 04:22, with stop 50's tests (random generators on both
# sides of the whole-draw limit, loop draws, decode_speed's per-mesh processes):
# 9 min 18 s, 17.4 CPU-minutes; at 04:35 after its review: 8 min 54 s, 16.8 CPU-minutes;
# 2026-12-06 06:01, with stop 51's memory-peak runs (5 per dtype, one thread per pool)
# and plain TF's decoding in decode_speed's test: 9 min 9 s, 17.0 CPU-minutes; at 06:18
# on its code before the review: 9 min 49 s, 18.3 CPU-minutes; at 06:32 after the
# review: 9 min 35 s, 18.0 CPU-minutes.
TEST_ARGS ?= -n 3 --dist loadfile --no-loadscope-reorder -m "not alone" tests
MAIN   := $(PY) -m models.transformer.main --model_dir=$(MODEL_DIR) \
          --gin_file=models/lm_cpu_small.gin --gin_file=problems/pydoc_lm.gin \
          --gin_file=layouts/2x2_dp_mp.gin --gin_file=readme_lm.gin

.PHONY: train test venv venv-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP_TRAIN): setup.py | $(PY)
	@if [ -f $(STAMP_TEST) ] && [ ! $(STAMP_TEST) -ot setup.py ]; then \
	  echo "$(VENV) already has .[cpu,test]"; \
	else \
	  echo "$(PY) -m pip install -e .[cpu]"; \
	  $(PY) -m pip install $(PIP_FLAGS) -e ".[cpu]" || exit 1; \
	fi
	touch $(STAMP_TRAIN)

$(STAMP_TEST): setup.py | $(PY)
	$(PY) -m pip install $(PIP_FLAGS) -e ".[cpu,test]"
	touch $(STAMP_TEST) $(STAMP_TRAIN)

venv: $(STAMP_TRAIN)

venv-test: $(STAMP_TEST)

train: $(STAMP_TRAIN)
	$(MAIN) --mode=train $(TRAIN_FLAGS)
	$(MAIN) --mode=decode $(TRAIN_FLAGS)

# The tests marked `alone` (pytest.ini) run first, with nothing beside them: a memory
# peak measured while other tests loaded the cores came out 27% over its prediction (the
# executor orders a step's ops differently), and 26% right after the parallel pass (what
# still ran then was not found), against 0-6% alone.
# `make test` last runs the lowering and the cheap backend tests again with the speed
# layer off (mesh_tf/lowering/speed_layer.py): the plain path must stay correct on its own.
# SPEED_LAYER_OFF_TESTS= (empty) leaves that run out.
SPEED_LAYER_OFF_TESTS ?= tests/lowering tests/backends/test_conformance.py \
  tests/backends/placement/test_placement_collectives.py \
  tests/backends/simd/test_simd_lm_scaling.py
# PYTHONDONTWRITEBYTECODE= (empty: unset for Python) lets the test processes cache their
# bytecode: where the environment sets it (as this machine's does), each of the suite's
# hundreds of processes otherwise recompiles this repository's modules, and each pytest
# worker re-does the assertion rewriting of every test file (~12 CPU-s per worker).
test: $(STAMP_TEST)
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -m alone tests
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q $(TEST_ARGS)
	$(if $(strip $(SPEED_LAYER_OFF_TESTS)),PYTHONDONTWRITEBYTECODE= MESH_TF_SPEED_LAYER=0 $(PY) -m pytest -q -n 2 $(SPEED_LAYER_OFF_TESTS))

clean:
	rm -rf $(VENV) .pytest_cache
