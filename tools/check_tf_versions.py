"""Imports mesh_tf and trains a few steps on the oldest and newest TensorFlow setup.py
admits, with the speed layer (mesh_tf/lowering/speed_layer.py) on and off.

  python tools/check_tf_versions.py                # oldest and newest admitted TF
  python tools/check_tf_versions.py 2.19 2.20      # these
  python tools/check_tf_versions.py --python python3.12 --keep

For each version it makes a venv under --work (default /tmp/mesh_tf_tf_versions) from
--python (default: this interpreter), installs tensorflow-cpu==<version>.* with the
project's install_requires and its `cpu` extra as setup.py states them (read by running
setup.py against a stand-in setuptools), plus pytest and pytest-xdist, and then, with
the source tree on PYTHONPATH (nothing is installed into or written to the tree):
  import:  tensorflow and mesh_tf import; whether the speed layer is on, or which
           internal TF lacks (its fallback warning);
  train:   `python -m models.transformer.main` with the Makefile's README LM gin files
           for --steps steps, with MESH_TF_SPEED_LAYER=1 and =0;
  tests:   tests/backends/test_conformance.py with MESH_TF_SPEED_LAYER=1 and =0.
It prints one verdict line per version (logs under --work/logs/<version>/) and exits 1
if any step of any version failed. Downloads go to pip's cache ($PIP_CACHE_DIR).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIN_FILES = ["models/lm_cpu_small.gin", "problems/pydoc_lm.gin", "layouts/2x2_dp_mp.gin",
             "readme_lm.gin"]  # the Makefile's MAIN
TEST_FILES = ["tests/backends/test_conformance.py"]


def read_setup():
  """setuptools.setup's keyword arguments and setup.py's module globals."""
  captured = {}
  fake = types.ModuleType("setuptools")
  fake.setup = lambda **kwargs: captured.update(kwargs)
  fake.find_packages = lambda *a, **k: []
  saved = sys.modules.get("setuptools")
  sys.modules["setuptools"] = fake
  try:
    scope = {"__name__": "__main__", "__file__": os.path.join(ROOT, "setup.py")}
    with open(os.path.join(ROOT, "setup.py")) as f:
      exec(compile(f.read(), "setup.py", "exec"), scope)  # pylint: disable=exec-used
  finally:
    if saved is None:
      del sys.modules["setuptools"]
    else:
      sys.modules["setuptools"] = saved
  return captured, scope


def admitted_minors(spec):
  """['2.19', '2.20', '2.21'] of a specifier like '>=2.19,<2.22'."""
  low = re.search(r">=\s*2\.(\d+)", spec)
  high = re.search(r"<\s*2\.(\d+)", spec)
  le = re.search(r"<=\s*2\.(\d+)", spec)
  if not low or not (high or le):
    raise SystemExit("cannot read the TensorFlow range %r from setup.py" % spec)
  last = int(le.group(1)) if le else int(high.group(1)) - 1
  return ["2.%d" % m for m in range(int(low.group(1)), last + 1)]


def requirements(setup_kwargs, version):
  """(pip requirements, constraints) for one TF version."""
  extras = setup_kwargs.get("extras_require", {})
  reqs = list(setup_kwargs.get("install_requires", [])) + list(extras.get("cpu", []))
  for name in ("pytest", "pytest-xdist"):
    found = [r for r in extras.get("test", []) if re.match(re.escape(name) + r"\b", r)
             and not r[len(name):].startswith("-")]
    reqs.extend(found or [name])
  return reqs, ["tensorflow-cpu==%s.*" % version]


def run(cmd, log, env=None, timeout=None, cwd=ROOT):
  """(return code, output) of cmd, its output also written to log."""
  start = time.time()
  try:
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          check=False)
    rc, out = proc.returncode, proc.stdout
  except subprocess.TimeoutExpired as e:
    rc = 124
    out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (
        e.stdout or "")
    out += "\nTIMEOUT after %ds" % timeout
  with open(log, "w") as f:
    f.write("$ %s\n%s\n(rc=%d, %.0fs)\n" % (" ".join(cmd), out, rc, time.time() - start))
  return rc, out


def last_error(out):
  """The last line that names an error, else the last line."""
  lines = [l.strip() for l in out.splitlines() if l.strip()]
  errors = [l for l in lines if re.search(r"Error|error|FAILED|TIMEOUT", l)]
  return ((errors or lines or ["(no output)"])[-1])[:160]


def pytest_summary(out):
  lines = [l for l in out.splitlines() if re.search(r"\d+ (passed|failed|error)", l)]
  return re.sub(r"=+", "", lines[-1]).strip() if lines else "no summary"


def check(version, args, setup_kwargs):
  """One verdict line for one TF version."""
  start = time.time()
  tag = "tf" + version
  venv = os.path.join(args.work, "venvs", tag)
  logs = os.path.join(args.work, "logs", tag)
  os.makedirs(logs, exist_ok=True)
  py = os.path.join(venv, "bin", "python")
  parts = []

  def verdict(ok):
    return "TF %s: %s (%s) %.0fs" % (version, "ok" if ok else "FAIL", "; ".join(parts),
                                     time.time() - start)

  if args.fresh and os.path.isdir(venv):
    shutil.rmtree(venv)
  if not os.path.exists(py):
    rc, out = run([args.python, "-m", "venv", venv], os.path.join(logs, "venv.log"))
    if rc:
      parts.append("venv: " + last_error(out))
      return verdict(False)
  reqs, constraints = requirements(setup_kwargs, version)
  constraints_file = os.path.join(logs, "constraints.txt")
  with open(constraints_file, "w") as f:
    f.write("\n".join(constraints) + "\n")
  rc, out = run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 "-c", constraints_file] + reqs, os.path.join(logs, "install.log"),
                timeout=args.install_timeout)
  if rc:
    parts.append("install: " + last_error(out))
    return verdict(False)

  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
             TF_CPP_MIN_LOG_LEVEL="2")
  env.pop(_ENV_VAR, None)
  probe = ("import warnings; warnings.simplefilter('always')\n"
           "import tensorflow as tf, mesh_tf\n"
           "from mesh_tf.lowering import speed_layer\n"
           "print('TF', tf.__version__, 'speed layer', "
           "'on' if speed_layer.enabled() else 'OFF')\n")
  rc, out = run([py, "-W", "always", "-c", probe], os.path.join(logs, "import.log"),
                env=env, timeout=600)
  found = re.search(r"TF (\S+) speed layer (\w+)", out)
  if rc or not found:
    parts.append("import: " + last_error(out))
    return verdict(False)
  if not found.group(1).startswith(version + "."):
    parts.append("import: got TF %s" % found.group(1))
    return verdict(False)
  layer = "speed layer " + found.group(2)
  warned = re.search(r"mesh_tf: TensorFlow .* lacks .*\(slower\)", out)
  if warned:
    layer += " [%s]" % warned.group(0)
  parts.append("TF %s, %s" % (found.group(1), layer))
  ok = True

  for switch in args.switch:
    env_s = dict(env, **{_ENV_VAR: switch})
    model_dir = os.path.join(args.work, "models", "%s-sl%s" % (tag, switch))
    shutil.rmtree(model_dir, ignore_errors=True)
    cmd = [py, "-m", "models.transformer.main", "--model_dir=" + model_dir,
           "--mode=train"] + ["--gin_file=" + g for g in GIN_FILES] + [
               "--gin_param=utils.run.train_steps=%d" % args.steps,
               "--gin_param=utils.run.save_checkpoints_steps=%d" % args.steps,
               "--gin_param=utils.run.iterations_per_loop=%d" % args.steps,
               "--gin_param=utils.run.eval_steps=1"]
    rc, out = run(cmd, os.path.join(logs, "train-sl%s.log" % switch), env=env_s,
                  timeout=args.train_timeout)
    if rc:
      ok = False
      parts.append("train sl=%s: FAIL %s" % (switch, last_error(out)))
    else:
      loss = re.findall(r"loss[ =:]+([0-9.]+(?:e[-+]?\d+)?)", out)
      parts.append("train sl=%s: ok%s" % (switch, " (loss %s)" % loss[-1] if loss else ""))

  for switch in args.switch:
    env_s = dict(env, **{_ENV_VAR: switch})
    cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(args.workers)
           ] + TEST_FILES
    rc, out = run(cmd, os.path.join(logs, "tests-sl%s.log" % switch), env=env_s,
                  timeout=args.test_timeout)
    ok = ok and rc == 0
    parts.append("conformance sl=%s: %s%s" % (switch, pytest_summary(out),
                                              "" if rc == 0 else " (rc=%d)" % rc))
  if not args.keep:
    shutil.rmtree(venv, ignore_errors=True)
  return verdict(ok)


_ENV_VAR = "MESH_TF_SPEED_LAYER"


def main():
  setup_kwargs, scope = read_setup()
  spec = scope.get("TF_VERSION", "")
  minors = admitted_minors(spec)
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("versions", nargs="*",
                      help="TF versions (default: the oldest and newest of %s: %s)"
                      % (spec, ", ".join(minors)))
  parser.add_argument("--python", default=sys.executable,
                      help="interpreter the venvs are made from")
  parser.add_argument("--work", default="/tmp/mesh_tf_tf_versions")
  parser.add_argument("--steps", type=int, default=4, help="train steps")
  parser.add_argument("--switch", nargs="+", default=["1", "0"], choices=["1", "0"],
                      help="MESH_TF_SPEED_LAYER values to train and test with")
  parser.add_argument("--workers", type=int, default=2, help="pytest -n")
  parser.add_argument("--keep", action="store_true", help="keep the venvs")
  parser.add_argument("--fresh", action="store_true", help="rebuild kept venvs")
  parser.add_argument("--install-timeout", type=int, default=1200)
  parser.add_argument("--train-timeout", type=int, default=900)
  parser.add_argument("--test-timeout", type=int, default=900)
  args = parser.parse_args()
  versions = args.versions or sorted({minors[0], minors[-1]}, key=minors.index)
  for v in versions:
    if v not in minors:
      print("note: TF %s is outside setup.py's range %s" % (v, spec))
  verdicts = []
  for v in versions:
    print("=== TF %s: logs in %s" % (v, os.path.join(args.work, "logs", "tf" + v)),
          flush=True)
    line = check(v, args, setup_kwargs)
    print(line, flush=True)
    verdicts.append(line)
  print("\n".join(["", "verdicts:"] + verdicts))
  return 0 if all(" ok (" in l for l in verdicts) else 1


if __name__ == "__main__":
  sys.exit(main())
