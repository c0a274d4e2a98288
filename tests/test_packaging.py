"""Keeps the install story true: setup.py's ranges, the Makefile's targets, the README's
"Supported:" line and tools/check_matrix.sh's pairs all say the same thing.

Reads files only (no install, no TensorFlow), so it runs in a blink on every Python.
"""
import os
import re
import runpy
import sys
import types
from unittest import mock

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The README line this test reads, e.g.
#   Supported: Python 3.10-3.13, TensorFlow 2.19-2.21 (...anything after...)
SUPPORTED_RE = re.compile(r"Supported:.*?Python (\d+\.\d+)-(\d+\.\d+),? "
                          r"(?:and )?TensorFlow (\d+\.\d+)-(\d+\.\d+)")


def _read(name):
  with open(os.path.join(ROOT, name), encoding="utf-8") as f:
    return f.read()


@pytest.fixture(scope="module")
def setup_kwargs():
  """The keyword arguments setup.py hands to setuptools.setup (setuptools not needed)."""
  captured = {}
  fake = types.ModuleType("setuptools")
  fake.setup = captured.update
  fake.find_packages = lambda **kwargs: []
  with mock.patch.dict(sys.modules, {"setuptools": fake}):
    runpy.run_path(os.path.join(ROOT, "setup.py"))
  return captured


def _minor_versions(lo, hi):
  """"3.10", "3.13" -> [3.10, 3.11, 3.12, 3.13] as Versions."""
  lo, hi = Version(lo), Version(hi)
  assert lo.major == hi.major
  return [Version("%d.%d" % (lo.major, m)) for m in range(lo.minor, hi.minor + 1)]


def _admitted(specifier, candidates):
  return [v for v in candidates if SpecifierSet(specifier).contains(v, prereleases=True)]


def _requirements(setup_kwargs, extra):
  return [Requirement(r) for r in setup_kwargs["extras_require"][extra]]


def _tf_specifier(setup_kwargs, extra="cpu"):
  (req,) = [r for r in _requirements(setup_kwargs, extra) if r.name.startswith("tensorflow")]
  return str(req.specifier)


def _readme_supported():
  lines = [l for l in _read("README.md").splitlines() if "Supported:" in l]
  assert lines, "README.md needs a line 'Supported: Python A-B, TensorFlow C-D'"
  match = SUPPORTED_RE.search(lines[0])
  assert match, "unparsable README line: %r" % lines[0]
  return match.groups()


def test_python_and_tf_ranges(setup_kwargs):
  assert setup_kwargs["python_requires"] == ">=3.10"
  grid = [Version("2.%d" % m) for m in range(10, 30)]
  assert _admitted(_tf_specifier(setup_kwargs, "cpu"), grid) == [
      Version("2.19"), Version("2.20"), Version("2.21")]
  # gpu asks for the same range; tpu stops where tensorflow-tpu wheels stop (2.20).
  assert _tf_specifier(setup_kwargs, "gpu") == _tf_specifier(setup_kwargs, "cpu")
  assert _admitted(_tf_specifier(setup_kwargs, "tpu"), grid) == [
      Version("2.19"), Version("2.20")]


def test_readme_supported_line_matches_setup(setup_kwargs):
  py_lo, py_hi, tf_lo, tf_hi = _readme_supported()
  assert "Python >=" + py_lo == "Python " + setup_kwargs["python_requires"]
  grid = [Version("2.%d" % m) for m in range(10, 30)]
  admitted = _admitted(_tf_specifier(setup_kwargs), grid)
  assert (str(admitted[0]), str(admitted[-1])) == (tf_lo, tf_hi)
  assert Version(py_hi) >= Version(py_lo)


def test_matrix_script_covers_the_supported_range():
  py_lo, py_hi, tf_lo, tf_hi = _readme_supported()
  script = _read("tools/check_matrix.sh")
  block = re.search(r'PAIRS_ALL="([^"]*)"', script).group(1)
  pairs = [tuple(p.split(":")) for p in block.split()]
  assert sorted({Version(p) for p, _ in pairs}) == _minor_versions(py_lo, py_hi)
  assert sorted({Version(t) for _, t in pairs}) == _minor_versions(tf_lo, tf_hi)
  # Every Python with every TF, except where PyPI has no wheel (TF 2.19 on 3.13).
  missing = {(p, t) for p in ("3.10", "3.11", "3.12", "3.13")
             for t in ("2.19", "2.20", "2.21")} - set(pairs)
  assert missing == {("3.13", "2.19")}


def test_every_jax_requirement_has_a_python_marker(setup_kwargs):
  jax_reqs = [Requirement(r) for reqs in setup_kwargs["extras_require"].values()
              for r in reqs if Requirement(r).name in ("jax", "jaxlib")]
  assert jax_reqs, "the test extra should install jax/jaxlib for the GSPMD tests"
  for req in jax_reqs:
    assert req.marker is not None, "%s needs a python_version marker" % req
    assert not req.marker.evaluate({"python_version": "3.10"}), req
    assert req.marker.evaluate({"python_version": "3.11"}), req


def test_tensorflow_datasets_always_comes_with_the_metadata_bound(setup_kwargs):
  for extra, reqs in setup_kwargs["extras_require"].items():
    names = {Requirement(r).name: Requirement(r) for r in reqs}
    if "tensorflow-datasets" in names:
      metadata = names.get("tensorflow-metadata")
      assert metadata is not None, extra
      # 1.18+ carries protobuf 6.31 generated code: no import on TF 2.19's protobuf 5.
      assert not metadata.specifier.contains("1.21.0"), extra
      assert metadata.specifier.contains("1.17.3"), extra


def test_test_extra_has_what_the_notebook_and_suite_need(setup_kwargs):
  names = {r.name for r in _requirements(setup_kwargs, "test")}
  assert {"pytest", "pytest-xdist", "matplotlib", "nbclient", "tensorflow-datasets",
          "jax", "jaxlib"} <= names


def _make_rules():
  """{target: (prerequisites, recipe lines)} with simple variables expanded."""
  text = _read("Makefile").replace("\\\n", " ")
  variables, rules, current = {}, {}, None

  def expand(s):
    for _ in range(5):
      s = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), ""), s)
    return s

  for line in text.splitlines():
    if line.startswith("\t") and current:
      rules[current][1].append(expand(line.strip()))
      continue
    current = None
    assignment = re.match(r"^(\w+)\s*(\?=|:=|=)\s*(.*)$", line)
    if assignment:
      variables[assignment.group(1)] = expand(assignment.group(3))
      continue
    rule = re.match(r"^([^\s:#=][^:=]*):(?!=)(.*)$", line)
    if rule and not line.startswith("."):
      prereqs = expand(rule.group(2)).replace("|", " ").split()
      for target in expand(rule.group(1)).split():
        rules[target] = (prereqs, [])
        current = target
  return variables, rules


def _installs(rules, target, seen=None):
  """Every `pip install` line that building target may run, through its prerequisites."""
  seen = set() if seen is None else seen
  if target in seen or target not in rules:
    return []
  seen.add(target)
  prereqs, recipe = rules[target]
  lines = [l for l in recipe if "pip install" in l and "--upgrade pip" not in l]
  for p in prereqs:
    lines += _installs(rules, p, seen)
  return lines


def test_make_train_installs_only_cpu_and_make_test_the_test_extra():
  variables, rules = _make_rules()
  assert variables["PYTHON"] == "python3"  # ?=, so `make PYTHON=python3.10 train` works
  train = _installs(rules, "train")
  assert train and all('".[cpu]"' in l for l in train), train
  assert not any("test" in l.split("-e", 1)[1] for l in train), train
  test = _installs(rules, "test")
  assert any('".[cpu,test]"' in l for l in test), test
  # Two stamps, each rebuilt when setup.py changes.
  stamps = [t for t in rules if "installed" in t]
  assert len(stamps) == 2 and all("setup.py" in rules[s][0] for s in stamps), stamps


def test_make_train_passes_train_flags_to_the_trainer():
  variables, rules = _make_rules()
  assert "TRAIN_FLAGS" in variables
  assert variables["TRAIN_FLAGS"] == ""  # ?=, empty: the README's full run by default
  raw = re.search(r"^train:.*\n((?:\t.*\n)+)", _read("Makefile"), re.M).group(1)
  trainer = raw.strip().splitlines()
  assert len(trainer) == 2 and all(l.rstrip().endswith("$(TRAIN_FLAGS)") for l in trainer)
  assert "models.transformer.main" in variables["MAIN"]
