"""tests/conftest.py's lean_subprocesses: the Python subprocesses that tests start find
this repository first on their path and cannot import the test extra's jax, matplotlib
and IPython (tests/lean_site/sitecustomize.py), unless a test drops the variable."""
import os
import subprocess
import sys

# tests/conftest.py's names (`import conftest` may find another folder's conftest.py)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEAN_SITE = os.path.join(REPO_ROOT, "tests", "lean_site")
HIDDEN_MODULES_VAR = "MESH_TF_TEST_HIDDEN_MODULES"

# For each name: "hidden" if importing it raises ImportError because sys.modules holds
# None for it, "not hidden" otherwise (without importing: jax and matplotlib take a
# second each).
PROBE = ("import sys\n"
         "for name in ('jax', 'matplotlib', 'IPython'):\n"
         "  if sys.modules.get(name, 0) is not None:\n"
         "    print(name, 'not hidden')\n"
         "    continue\n"
         "  try:\n"
         "    __import__(name)\n"
         "    print(name, 'imported')\n"
         "  except ImportError:\n"
         "    print(name, 'hidden')\n"
         "import models\n"
         "print(models.__file__)\n")


def _probe(env):
  out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd="/", capture_output=True,
                       text=True, timeout=60, check=True).stdout
  return out.splitlines()


def test_subprocesses_start_with_the_repository_first_and_the_extras_hidden():
  assert os.environ["PYTHONPATH"].split(os.pathsep)[:2] == [REPO_ROOT,
                                                             LEAN_SITE]
  lines = _probe(dict(os.environ))
  assert lines[:3] == ["jax hidden", "matplotlib hidden", "IPython hidden"], lines
  # cwd is "/": the repository's models package came through PYTHONPATH
  assert lines[3] == os.path.join(REPO_ROOT, "models", "__init__.py"), lines


def test_a_subprocess_without_the_variable_hides_nothing():
  env = dict(os.environ)
  del env[HIDDEN_MODULES_VAR]
  lines = _probe(env)
  assert lines[:3] == ["jax not hidden", "matplotlib not hidden", "IPython not hidden"], lines
