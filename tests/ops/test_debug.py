"""Debugging (mesh_tf/ops/debug.py): Print passes values and gradients through."""

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, LENGTH, check_against_tf, random_array

X_SHAPE = [BATCH, LENGTH, HIDDEN]


def test_print_passes_values_through(mesh_impl, capfd):
  x = random_array(X_SHAPE, 0)
  h = random_array([HIDDEN], 1)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (h, [HIDDEN])],
      lambda a, b: [mtf.Print(a, [b], "mtf-print-marker", summarize=8) * b],
      lambda a, b: [a * b])
  assert "mtf-print-marker" in capfd.readouterr().err
