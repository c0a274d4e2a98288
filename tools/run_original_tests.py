"""Run the original mesh-tensorflow's own test files against this port.

Downloads the original release from the package registry (nothing of it is kept in the
repository), unpacks it into a work directory, rewrites only the imports of each
`*_test.py` to this project's packages, runs each file as its own script (as the
original's test targets did, so a file's `__main__` block, e.g.
`tf.disable_v2_behavior()`, takes effect) and prints `passed N of M` per file and in
total (tf's run_in_graph_and_eager_modes runs, reported separately by absltest, are also
counted once per test method), then the failing tests with the last line of their
error.

    .venv/bin/python tools/run_original_tests.py [--work DIR] [--only SUBSTR ...]

Test-only packages the original's tests import and this project does not depend on
(tensorflow-probability and what it needs) are installed with pip into DIR/deps, never
into the environment. When a file does not import, its tests count as failed; their
number is then counted from the source (parameterized cases expanded).
"""

import argparse
import ast
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile

RELEASE = "mesh-tensorflow==0.1.21"
TEST_DEPS = ["tensorflow-probability", "cloudpickle", "decorator"]
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Module prefixes, longest first: the original's -> this port's.
MODULE_MAP = [
    ("mesh_tensorflow.transformer", "models.transformer"),
    ("mesh_tensorflow", "mesh_tf"),
]

# TF 2.16+ has no tf.compat.v1.estimator; the tests that use it fail with this message
# at the point of use instead of the whole file failing to import.
_ESTIMATOR_STUB = '''
class _NoEstimator:
  def __getattr__(self, name):
    raise AttributeError(
        "tf.compat.v1.estimator.%s: TensorFlow 2.16+ removed tf.estimator" % name)
tf_estimator = _NoEstimator()
'''


def rename_imports(source):
  """The test file's text with the original's package names replaced by the port's."""
  source = re.sub(r"^import mock\s*$", "from unittest import mock", source,
                  flags=re.M)
  source = re.sub(
      r"^from tensorflow\.compat\.v1 import estimator as tf_estimator\s*$",
      _ESTIMATOR_STUB, source, flags=re.M)
  for old, new in MODULE_MAP:
    source = re.sub(r"(?<![\w.])%s(?![\w])" % re.escape(old), new, source)
  return source


def download(work):
  """Path of the unpacked original release under `work` (downloaded once)."""
  dist = os.path.join(work, "dist")
  unpacked = os.path.join(work, "unpacked")
  if not os.path.isdir(os.path.join(unpacked, "mesh_tensorflow")):
    os.makedirs(dist, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", RELEASE, "--no-deps",
                    "-d", dist], check=True)
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    if not wheels:
      sys.exit("no wheel of %s downloaded into %s" % (RELEASE, dist))
    with zipfile.ZipFile(os.path.join(dist, wheels[0])) as zf:
      zf.extractall(unpacked)
  return unpacked


def _tf_keras_requirement():
  """tf-keras of the installed TensorFlow's minor version (tensorflow-probability
  imports it)."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  for dist in ("tensorflow", "tensorflow-cpu"):
    try:
      major, minor = metadata.version(dist).split(".")[:2]
      return "tf-keras~=%s.%s.0" % (major, minor)
    except metadata.PackageNotFoundError:
      continue
  return "tf-keras"


def install_test_deps(work):
  """Directory holding the test-only packages (installed once)."""
  deps = os.path.join(work, "deps")
  if not os.path.isdir(os.path.join(deps, "tensorflow_probability")):
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target",
                    deps] + TEST_DEPS + [_tf_keras_requirement()], check=True)
  return deps


def _decorator_cases(decorator):
  """How many test cases a `parameterized.parameters(...)` decorator makes, else 1."""
  if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
          and decorator.func.attr in ("parameters", "named_parameters")):
    return 1
  args = decorator.args
  if len(args) == 1 and isinstance(args[0], (ast.List, ast.Tuple)) and all(
      isinstance(e, (ast.Tuple, ast.Dict, ast.List)) for e in args[0].elts):
    return len(args[0].elts)
  if any(isinstance(a, ast.Starred) for a in args):
    return 1  # unknown length; counted as one
  return len(args)


def count_tests(path):
  """Test cases defined in a test file, counted from its source."""
  tree = ast.parse(open(path).read())
  total = 0
  for node in ast.walk(tree):
    if isinstance(node, ast.ClassDef):
      for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
          cases = 1
          for dec in item.decorator_list:
            cases = max(cases, _decorator_cases(dec))
          total += cases
  return total


def _distinct(case_name):
  """A test's name without the mode that tf's run_in_graph_and_eager_modes appends."""
  return re.sub(r"\s*\[(graph|eager)_mode\]$", "", case_name)


def run_file(original, renamed, xml_path, env, timeout):
  """(passed, total, failures, distinct_passed, distinct_total) for one renamed test
  file run as a script; a distinct test (graph and eager runs of one method counted
  once) passes when all its runs pass."""
  if os.path.exists(xml_path):
    os.remove(xml_path)
  try:
    proc = subprocess.run([sys.executable, renamed, "--xml_output_file=" + xml_path],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    output = proc.stdout + proc.stderr
  except subprocess.TimeoutExpired:
    output = "timed out after %d s" % timeout
  if not os.path.exists(xml_path):
    total = count_tests(original)
    last = [l for l in output.strip().splitlines() if l.strip()][-1:] or ["no output"]
    return 0, total, [("<whole file>", "did not run: " + last[0][:300])], 0, total
  root = ET.parse(xml_path).getroot()
  passed, total, failures, ok = 0, 0, [], {}
  for case in root.iter("testcase"):
    total += 1
    name = "%s.%s" % (case.get("classname", "").split(".")[-1], case.get("name"))
    bad = case.find("failure")
    if bad is None:
      bad = case.find("error")
    ok[_distinct(name)] = ok.get(_distinct(name), True) and bad is None
    if bad is None:
      passed += 1
      continue
    text = (bad.get("message") or bad.text or "").strip().splitlines()
    failures.append((name, (text[-1] if text else "")[:300]))
  return passed, total, failures, sum(ok.values()), len(ok)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--work", default="/tmp/orig_mtf_tests",
                      help="work directory for the download and renamed files")
  parser.add_argument("--only", nargs="*", default=[],
                      help="run only test files whose path contains one of these")
  parser.add_argument("--timeout", type=int, default=900, help="seconds per file")
  args = parser.parse_args()

  unpacked = download(args.work)
  deps = install_test_deps(args.work)
  renamed_dir = os.path.join(args.work, "renamed")
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      [REPO_ROOT, deps] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

  originals = []
  for dirpath, _, files in os.walk(os.path.join(unpacked, "mesh_tensorflow")):
    originals += [os.path.join(dirpath, f) for f in files if f.endswith("_test.py")]
  originals.sort()
  if args.only:
    originals = [p for p in originals if any(s in p for s in args.only)]

  all_passed = all_total = distinct_passed = distinct_total = 0
  report = []
  for original in originals:
    rel = os.path.relpath(original, unpacked)
    renamed = os.path.join(renamed_dir, rel)
    os.makedirs(os.path.dirname(renamed), exist_ok=True)
    with open(original) as f:
      text = rename_imports(f.read())
    with open(renamed, "w") as f:
      f.write(text)
    xml_path = renamed + ".xml"
    passed, total, failures, d_passed, d_total = run_file(original, renamed, xml_path,
                                                          env, args.timeout)
    all_passed += passed
    all_total += total
    distinct_passed += d_passed
    distinct_total += d_total
    print("%-56s passed %d of %d" % (rel, passed, total), flush=True)
    report += [(rel, name, why) for name, why in failures]
  print("TOTAL passed %d of %d (distinct tests, graph and eager runs counted once: "
        "passed %d of %d)" % (all_passed, all_total, distinct_passed, distinct_total))
  if report:
    print("\nfailures:")
    for rel, name, why in report:
      print("  %s %s: %s" % (rel, name, why))


if __name__ == "__main__":
  main()
