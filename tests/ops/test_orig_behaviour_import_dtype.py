"""mtf.import_tf_tensor of a Python value takes the dtype tf.convert_to_tensor gives
it, as the original's import did: int32 for (nested lists of) ints, bool for bools,
float32 for floats; so integer features given as lists (as the original's
transformer.utils tests give them) stay integers through lowering."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf

DIMS = [mtf.Dimension("batch", 2), mtf.Dimension("length", 3)]


@pytest.mark.parametrize("value", [[[3, 1, 4], [1, 5, 9]], [[True, False, True]] * 2,
                                   [[0.5, 1.0, 2.0], [3.0, 4.0, 5.0]]])
def test_python_values_import_with_tf_dtype(value):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, value, DIMS)
  expected = tf.convert_to_tensor(value)
  assert x.dtype == expected.dtype
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl([], {}, [""])})
  got = lowering.export_to_tf_tensor(x)
  assert got.dtype == expected.dtype
  np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_imported_int_list_feeds_integer_ops():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  ids = mtf.import_tf_tensor(mesh, [[3, 1, 0], [2, 2, 1]], DIMS)
  vocab = mtf.Dimension("vocab", 4)
  counts = mtf.reduce_sum(mtf.one_hot(ids, vocab, dtype=tf.int32), reduced_dim=DIMS[1])
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl([], {}, [""])})
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(counts).numpy(),
                                [[1, 1, 0, 1], [0, 1, 2, 0]])
