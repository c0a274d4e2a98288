#!/usr/bin/env bash
# Installs and checks mesh_tf on every admitted (Python, TensorFlow) pair, one venv each.
#
#   tools/check_matrix.sh                       # every admitted pair (see PAIRS below)
#   tools/check_matrix.sh 3.12:2.19 3.10:2.21   # just these
#   tools/check_matrix.sh --clean 3.13:2.21     # delete each pair's venv after its row
#   tools/check_matrix.sh --clean-all           # delete every venv under $MATRIX_DIR
#
# Per pair it builds $MATRIX_DIR/venvs/pyX-tfY from pyenv's interpreter for X (the newest
# $(pyenv root)/versions/X.* that exists, else pythonX on PATH), then
#   install: `make venv-test` with that venv and tensorflow-cpu==Y.* pinned through a pip
#            constraints file (so .[cpu,test] exactly as `make test` installs it), and
#            checks that tensorflow, tensorflow_datasets.core and mesh_tf import;
#   train:   `make train` against that venv, shortened through TRAIN_FLAGS (40 steps, a
#            checkpoint and an eval every 20), then decode, exactly as the README runs it;
#   tests:   the fast half of the suite (FAST_TESTS below, 2-3 min on 2 idle cores):
#            every op on every mesh/layout case, lowering, the backends' TF-internal
#            paths (GSPMD shardings and XLA's partitioner through jax, sharded resource
#            variables, placement slice segments), checkpoints, the TFDS/vocabulary
#            tests and tests/test_packaging.py; not the multi-process cluster tests, the
#            Transformer zoo, the trainer tests (`make train` stands in) or the Colab
#            notebook run. pytest -n 2 -rs; junit.xml in the logs has per-test times.
# and prints one table row: Python | TF | install | train | tests | seconds. A failing
# step is a row with the failure (logs in $MATRIX_DIR/logs/<pair>/), never an abort; the
# script exits 1 if any row failed. Downloads are cached in $PIP_CACHE_DIR.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MATRIX_DIR=${MATRIX_DIR:-/tmp/matrix}
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$MATRIX_DIR/pipcache}
export PIP_DISABLE_PIP_VERSION_CHECK=1

# Every pair that setup.py admits and PyPI has wheels for (no TF 2.19 for Python 3.13).
PAIRS_ALL="3.10:2.19 3.10:2.20 3.10:2.21 3.11:2.19 3.11:2.20 3.11:2.21
3.12:2.19 3.12:2.20 3.12:2.21 3.13:2.20 3.13:2.21"
FAST_TESTS=${FAST_TESTS:-"tests/test_packaging.py tests/ops tests/lowering
tests/backends/gspmd/test_gspmd_partitioned.py tests/backends/gspmd/test_gspmd_ops.py
tests/backends/gspmd/test_gspmd_hlo_shardings.py tests/backends/gspmd/test_gspmd_errors.py
tests/backends/tpu_contract/test_gspmd_variables.py
tests/backends/placement/test_placement_slice_segments.py
tests/backends/test_tf_version_compat.py tests/checkpoint
tests/transformer/data/test_dataset.py tests/transformer/data/test_vocabulary.py"}
TRAIN_FLAGS=${TRAIN_FLAGS:-"--gin_param=utils.run.train_steps=40 \
--gin_param=utils.run.save_checkpoints_steps=20 --gin_param=utils.run.iterations_per_loop=20 \
--gin_param=utils.run.eval_steps=2"}
INSTALL_TIMEOUT=${INSTALL_TIMEOUT:-1200}
TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-600}
TEST_TIMEOUT=${TEST_TIMEOUT:-900}
PYTEST_WORKERS=${PYTEST_WORKERS:-2}

clean_each=0
pairs=()
for arg in "$@"; do
  case "$arg" in
    --clean) clean_each=1 ;;
    --clean-all)
      echo "removing $MATRIX_DIR/venvs and $MATRIX_DIR/models"
      rm -rf "$MATRIX_DIR/venvs" "$MATRIX_DIR/models"
      exit 0 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 0 ;;
    *:*) pairs+=("$arg") ;;
    *) echo "unknown argument: $arg (want PY:TF, e.g. 3.12:2.19)" >&2; exit 2 ;;
  esac
done
if [ ${#pairs[@]} -eq 0 ]; then
  # shellcheck disable=SC2206
  pairs=($PAIRS_ALL)
fi

find_python() {  # newest pyenv interpreter X.*, else pythonX on PATH
  local want=$1 root cand best=""
  if command -v pyenv >/dev/null 2>&1; then
    root=$(pyenv root)
    for cand in "$root"/versions/"$want".*/bin/python; do
      [ -x "$cand" ] || continue
      case "$cand" in *"/versions/$want".[0-9]*) best=$cand ;; esac
    done
  fi
  if [ -z "$best" ] && command -v "python$want" >/dev/null 2>&1; then
    best=$(command -v "python$want")
  fi
  echo "$best"
}

pytest_counts() {  # "P/F/S" from pytest's closing line (errors count as failed)
  python3 - "$1" <<'PYEOF'
import re, sys
text = open(sys.argv[1], errors="replace").read()
lines = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", l)
         and re.search(r" in [\d.]+s", l)]
if not lines:
  print("no summary"); sys.exit()
counts = {k: 0 for k in ("passed", "failed", "skipped", "error")}
for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1]):
  counts[k.rstrip("s") if k.startswith("error") else k] += int(n)
print("%d/%d/%d" % (counts["passed"], counts["failed"] + counts["error"], counts["skipped"]))
PYEOF
}

mkdir -p "$MATRIX_DIR/venvs" "$MATRIX_DIR/logs" "$MATRIX_DIR/models" "$PIP_CACHE_DIR"
TABLE="$MATRIX_DIR/matrix.md"
HEADER="| Python | TF | install | train | tests (passed/failed/skipped) | seconds |
|---|---|---|---|---|---|"
rows=()
any_failed=0
echo "$HEADER" > "$TABLE"

for pair in "${pairs[@]}"; do
  py_ver=${pair%%:*}
  tf_ver=${pair##*:}
  tag="py$py_ver-tf$tf_ver"
  venv="$MATRIX_DIR/venvs/$tag"
  logs="$MATRIX_DIR/logs/$tag"
  model_dir="$MATRIX_DIR/models/$tag"
  rm -rf "$logs" "$model_dir"
  mkdir -p "$logs"
  start=$(date +%s)
  install="-"; train="-"; tests="-"
  echo "=== $pair: logs in $logs" >&2

  python=$(find_python "$py_ver")
  if [ -z "$python" ]; then
    install="no python$py_ver"
  else
    echo "tensorflow-cpu==$tf_ver.*" > "$logs/constraints.txt"
    if timeout "$INSTALL_TIMEOUT" make -C "$ROOT" --no-print-directory VENV="$venv" \
         PYTHON="$python" PIP_FLAGS="--quiet -c $logs/constraints.txt" venv-test \
         > "$logs/install.log" 2>&1 &&
       "$venv/bin/python" - > "$logs/imports.log" 2>&1 <<'PYEOF'
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
import tensorflow_datasets.core  # the data extra's promise on every admitted TF
import mesh_tf
print("tf" + tf.__version__)
PYEOF
    then
      got=$(tail -n 1 "$logs/imports.log")
      case "$got" in
        "tf$tf_ver".*) install="ok $got" ;;
        *) install="FAIL wrong TF ($got)" ;;
      esac
    else
      if [ -s "$logs/imports.log" ]; then
        install="FAIL import: $(grep -E 'Error|error' "$logs/imports.log" | tail -n 1 | cut -c1-60)"
      else
        install="FAIL pip: $(grep -E 'ERROR|error' "$logs/install.log" | head -n 1 | cut -c1-60)"
      fi
    fi
  fi

  if [ "${install%% *}" = "ok" ]; then
    if timeout "$TRAIN_TIMEOUT" make -C "$ROOT" --no-print-directory VENV="$venv" \
         MODEL_DIR="$model_dir" TRAIN_FLAGS="$TRAIN_FLAGS" train > "$logs/train.log" 2>&1
    then
      ppl=$(grep -o "perplexity [0-9.]*" "$logs/train.log" | tail -n 1)
      if [ -n "$ppl" ] && grep -q -- "' -> '" "$logs/train.log"; then
        train="ok ($ppl)"
      else
        train="FAIL no eval/decode output"
      fi
    else
      train="FAIL rc=$?: $(grep -E 'Error' "$logs/train.log" | tail -n 1 | cut -c1-60)"
    fi
    # shellcheck disable=SC2086
    (cd "$ROOT" && timeout "$TEST_TIMEOUT" "$venv/bin/python" -m pytest -q \
       -n "$PYTEST_WORKERS" --dist loadfile -p no:cacheprovider -rfEs --durations=10 --junitxml="$logs/junit.xml" \
       -o "console_output_style=classic" $FAST_TESTS) > "$logs/tests.log" 2>&1
    rc=$?
    tests=$(pytest_counts "$logs/tests.log")
    [ $rc -eq 124 ] && tests="TIMEOUT $tests"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && tests="$tests (rc=$rc)"
    [ $rc -ne 0 ] && any_failed=1
  else
    any_failed=1
  fi
  case "$train" in FAIL*) any_failed=1 ;; esac

  secs=$(( $(date +%s) - start ))
  row="| $py_ver | $tf_ver | $install | $train | $tests | $secs |"
  rows+=("$row")
  echo "$row" >> "$TABLE"
  echo "$row" >&2
  if [ $clean_each -eq 1 ]; then
    rm -rf "$venv" "$model_dir"
  fi
done

echo
echo "mesh_tf matrix, $(date -u +%Y-%m-%d) ($(uname -m), $(nproc) cores; fast tests: $(echo $FAST_TESTS | wc -w) paths)"
echo "$HEADER"
printf '%s\n' "${rows[@]}"
exit $any_failed
