"""Ops lowered by GSPMD on every mesh/layout case of conftest.py, against plain TF.

GSPMD lowers each op once on global tensors, so ops that gather or exchange data on the
other backends (einsum over a split dim, slicing and shifting a split dim, reshapes that
move a split, reductions, random draws) must still give TF's numbers and gradients.
"""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, HIDDEN, LENGTH, check_against_tf, lower_and_export,
                         new_mesh, random_array)

X_SHAPE = [BATCH, LENGTH, HIDDEN]


@pytest.fixture
def gspmd_impl(mesh_case):
  """A GSPMDMeshImpl for the current (mesh shape, layout) case."""
  return mtf.GSPMDMeshImpl(mesh_case.mesh_shape, mesh_case.layout)


def test_einsum_and_reductions(gspmd_impl):
  w_shape = [HIDDEN, mtf.Dimension("out", 4)]
  check_against_tf(
      gspmd_impl, [(random_array(X_SHAPE, 0), X_SHAPE), (random_array(w_shape, 1), w_shape)],
      lambda x, w: [mtf.einsum([x, w], output_shape=[BATCH, LENGTH, w_shape[1]]),
                    mtf.reduce_sum(x, reduced_dim=HIDDEN),
                    mtf.softmax(x, HIDDEN), mtf.reduce_max(x, reduced_dim=BATCH)],
      lambda x, w: [tf.einsum("blh,ho->blo", x, w), tf.reduce_sum(x, 2),
                    tf.nn.softmax(x, 2), tf.reduce_max(x, 0)],
      labels=["einsum contracting hidden", "sum over hidden", "softmax", "max over batch"])


def test_slicing_shifting_and_reshape(gspmd_impl):
  hidden16 = mtf.Dimension("hidden", 16)
  shape = [BATCH, LENGTH, hidden16]
  flat = mtf.Dimension("flat", 8 * 3)
  check_against_tf(
      gspmd_impl, [(random_array(shape, 2), shape)],
      lambda x: [mtf.slice(x, 3, 8, "hidden"), mtf.shift(x, 1, "batch", wrap=True),
                 mtf.concat([x, x], "hidden"), mtf.reshape(x, [flat, hidden16])],
      lambda x: [x[:, :, 3:11], tf.roll(x, 1, 0), tf.concat([x, x], 2),
                 tf.reshape(x, [24, 16])],
      labels=["slice hidden", "shift batch", "concat hidden", "reshape"])


def test_random_values_do_not_depend_on_the_backend(mesh_case, gspmd_impl):
  def draw(impl):
    graph, mesh = new_mesh()
    x = mtf.random_uniform(mesh, X_SHAPE, seed=7)
    return lower_and_export(graph, mesh, impl, [x])[0]
  placement = mtf.PlacementMeshImpl(
      mesh_case.mesh_shape, mesh_case.layout,
      ["/cpu:%d" % i for i in range(mtf.convert_to_shape(mesh_case.mesh_shape).size)])
  np.testing.assert_array_equal(draw(gspmd_impl), draw(placement))
