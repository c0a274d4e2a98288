"""Runs code in a fresh interpreter where importing TensorFlow fails, with the `mesh_tf`
package present but its __init__ (which imports TensorFlow) not run, so pure modules such
as mesh_tf.shapes can be imported and exercised on their own."""
import os
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PRELUDE = """
import sys, types
class _NoTF:
  def find_spec(self, name, path=None, target=None):
    if name == "tensorflow" or name.startswith("tensorflow."):
      raise ImportError("TensorFlow is blocked in this check")
    return None
sys.meta_path.insert(0, _NoTF())
pkg = types.ModuleType("mesh_tf")
pkg.__path__ = [%r]
sys.modules["mesh_tf"] = pkg
""" % os.path.join(_ROOT, "mesh_tf")


def run_without_tensorflow(code):
  """Runs `code` (a string) with TensorFlow unimportable; returns its stdout.

  Raises AssertionError with the child's stderr if the code fails.
  """
  proc = subprocess.run([sys.executable, "-c", _PRELUDE + code], capture_output=True,
                        text=True, cwd=_ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout
