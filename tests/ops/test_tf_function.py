"""One program using every op family, lowered eagerly, inside tf.function, and with XLA.

The op tests run eagerly; this checks that graph-mode lowering (static slice shapes,
control dependencies, variable reads) and XLA compilation give the same numbers.
"""
import numpy as np

import mesh_tf as mtf
from every_op_program import OUTPUT_NAMES, run_eager, run_in_function
from mtf_testing import assert_close

DEVICES = ["/cpu:%d" % i for i in range(8)]


def test_graph_mode_and_xla_match_eager():
  reference = run_eager(mtf.PlacementMeshImpl("", "", [""]))
  cases = {
      "tf.function on 2x4 (hidden split)": run_in_function(mtf.PlacementMeshImpl(
          "rows:2;cols:4", "batch:rows;hidden:cols", DEVICES)),
      "tf.function on 2x4 (vocab split)": run_in_function(mtf.PlacementMeshImpl(
          "rows:2;cols:4", "batch:rows;vocab:cols", DEVICES)),
      "tf.function on 8": run_in_function(mtf.PlacementMeshImpl(
          "all:8", "batch:all", DEVICES)),
      "XLA on one device": run_in_function(mtf.PlacementMeshImpl("", "", [""]),
                                           jit_compile=True),
  }
  for case, values in cases.items():
    for name, got, want in zip(OUTPUT_NAMES, values, reference):
      assert_close(got, want, "%s: %s" % (case, name), rtol=1e-4, atol=1e-5)
  assert np.isfinite(reference[0]) and reference[0] > 0
