"""The coverage ledger: every public op of `mtf` is exercised by a test under tests/ops.

A public op is a function or Operation class that `mesh_tf/__init__.py` exports from
mesh_tf.ops or mesh_tf.autodiff. It counts as covered when a test file under tests/ops
refers to it as `mtf.<name>` (a call, or a row of a parametrized table). Names covered in another way are listed in INDIRECT with the
reason; a gap would be listed in GAPS with the reason, never skipped silently.
"""
import inspect
import pathlib
import re

import mesh_tf as mtf

OPS_TESTS = pathlib.Path(__file__).resolve().parent

# Covered, but not called by that name in tests/ops.
INDIRECT = {
    "mtf_abs": "alias of mtf.abs",
    "mtf_pow": "alias of mtf.pow",
    "mtf_slice": "alias of mtf.slice",
    "mtf_range": "exported as mtf.range too; both spellings point to one function",
    "binary_arguments_to_tensors": "runs inside every binary op with a Python scalar",
    "ones_like": "used by mtf.gradients for the default grad_ys",
}
# Public ops known not to work yet (none today).
GAPS = {}


def _public_ops():
  names = []
  for name, value in vars(mtf).items():
    if name.startswith("_") or not callable(value):
      continue
    module = getattr(value, "__module__", "") or ""
    if not module.startswith(("mesh_tf.ops", "mesh_tf.autodiff")):
      continue
    if inspect.isclass(value):
      continue  # classes are reached through their functions
    names.append(name)
  return sorted(set(names))


def test_every_public_op_is_tested_or_listed():
  sources = "\n".join(p.read_text() for p in OPS_TESTS.glob("test_*.py")
                      if p.name != pathlib.Path(__file__).name)
  untested = [n for n in _public_ops()
              if not re.search(r"\bmtf\.%s\b" % n, sources)
              and n not in INDIRECT and n not in GAPS]
  assert not untested, "public ops with no test in tests/ops: %s" % untested


def test_ledger_has_no_stale_entries():
  public = set(_public_ops())
  stale = [n for n in list(INDIRECT) + list(GAPS) if n not in public]
  assert not stale, "ledger names that are no longer public ops: %s" % stale
