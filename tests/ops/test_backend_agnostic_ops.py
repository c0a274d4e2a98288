"""The ops of control_flow, sorting, scan, sampling and custom_gradient use only mesh
primitives and the LaidOutTensor contract, so every backend gives the numbers that one
placement device gives."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, LENGTH, lower_and_export, new_mesh, random_array

X_SHAPE = [BATCH, LENGTH, HIDDEN]
LABELS = ["top_k values", "top_k indices", "sort", "log_cumsum_exp", "samples",
          "loop var", "accumulator", "gradient through recompute_grad and top_k"]


def _program():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  values, indices = mtf.top_k(x, HIDDEN, mtf.Dimension("k", 3))
  out = mtf.while_loop(
      lambda i, a: mtf.less(i, 3),
      lambda i, a: [i + 1, a * 1.5, mtf.reduce_sum(a, reduced_dim=LENGTH)],
      [mtf.constant(mesh, 0, dtype=tf.int32), x], has_accumulators=True)
  block = mtf.recompute_grad(lambda a: mtf.tanh(a) * a, [x])
  grad, = mtf.gradients([mtf.reduce_sum(values) + mtf.reduce_sum(block)], [x])
  return graph, mesh, [values, indices, mtf.sort(x, BATCH), mtf.log_cumsum_exp(x, HIDDEN),
                       mtf.sample_with_temperature(x, HIDDEN), out[1], out[2], grad]


BACKENDS = {
    "simd-emulation": lambda: mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols"),
    "gspmd": lambda: mtf.GSPMDMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols"),
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_new_ops_on_other_backends(backend):
  graph, mesh, tensors = _program()
  expected = lower_and_export(graph, mesh, mtf.PlacementMeshImpl("", ""), tensors)
  graph, mesh, tensors = _program()
  impl = BACKENDS[backend]()
  got = tf.function(lambda: [mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(t)
                             for t in tensors])()
  for g, e, label in zip(got, expected, LABELS):
    np.testing.assert_allclose(g.numpy(), e, rtol=1e-5, atol=1e-5, err_msg=label)
