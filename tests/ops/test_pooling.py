"""Pooling ops (mesh_tf/ops/pooling.py) forward and gradient against plain TF."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, check_against_tf, new_mesh, random_array

D, H, W = mtf.Dimension("d", 4), mtf.Dimension("h", 4), mtf.Dimension("w", 6)
X2 = [BATCH, H, W, HIDDEN]
X3 = [BATCH, D, H, mtf.Dimension("w", 2), HIDDEN]


def _pool(x, ksize, strides, kind):
  return mtf.PoolOperation(x, ksize, strides, kind).outputs[0]


def test_pool_2d(mesh_impl):
  x = random_array(X2, 0)
  check_against_tf(
      mesh_impl, [(x, X2)] * 3,
      lambda a, b, c: [_pool(a, [2, 3], [2, 3], "MAX_2D"), _pool(b, [2, 2], None, "AVG_2D"),
                       _pool(c, [3, 2], [1, 2], "MAX_2D")],
      lambda a, b, c: [tf.nn.max_pool2d(a, [2, 3], [2, 3], "VALID"),
                       tf.nn.avg_pool2d(b, [2, 2], [2, 2], "VALID"),
                       tf.nn.max_pool2d(c, [3, 2], [1, 2], "VALID")],
      labels=["max 2x3", "avg 2x2", "max 3x2 overlapping"])


def test_pool_3d(mesh_impl):
  x = random_array(X3, 1)
  check_against_tf(
      mesh_impl, [(x, X3)] * 2,
      lambda a, b: [_pool(a, [2, 2, 2], None, "MAX_3D"),
                    _pool(b, [2, 1, 2], None, "AVG_3D")],
      lambda a, b: [tf.nn.max_pool3d(a, [2, 2, 2], [2, 2, 2], "VALID"),
                    tf.nn.avg_pool3d(b, [2, 1, 2], [2, 1, 2], "VALID")])


@pytest.mark.parametrize("kind", ["MAX", "AVG"])
def test_pool_backprop_op_and_its_gradient(mesh_impl, kind):
  x = random_array(X2, 2)
  dy_shape = [BATCH, mtf.Dimension("h", 2), mtf.Dimension("w", 3), HIDDEN]
  dy = random_array(dy_shape, 3)
  window = [1, 2, 2, 1]

  def mtf_fn(a, g):
    y = _pool(a, [2, 2], None, kind + "_2D")
    return [mtf.pool_backprop(a, y, g, [2, 2], [2, 2], kind + "_2D")]

  def tf_fn(a, g):
    if kind == "AVG":
      return [tf.raw_ops.AvgPoolGrad(orig_input_shape=[8, 4, 6, 8], grad=g, ksize=window,
                                     strides=window, padding="VALID")]
    return [tf.raw_ops.MaxPoolGrad(orig_input=a, orig_output=tf.nn.max_pool2d(a, 2, 2,
                                                                              "VALID"),
                                   grad=g, ksize=window, strides=window, padding="VALID")]
  check_against_tf(mesh_impl, [(x, X2), (dy, dy_shape)], mtf_fn, tf_fn,
                   input_labels=["x", "dy"])


# (mesh, layout, ksize and strides of an average pooling); each case also max-pools 2x2.
SPLIT_CASES = [("all:8", "h:all", [2, 1], [2, 1]),
               ("rows:2;cols:4", "h:rows;w:cols", [3, 2], [1, 2]),
               ("rows:2;cols:4", "h:rows;batch:cols", [3, 3], [1, 1])]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=["h:8", "h:2,w:4", "h:2,batch:4"])
def test_split_spatial_dims(make_mesh_impl, case):
  """Windows tiling a split dim pool locally; overlapping windows gather it."""
  mesh_shape, layout, ksize, strides = case
  shape = [BATCH, mtf.Dimension("h", 16), mtf.Dimension("w", 8), mtf.Dimension("c", 2)]
  x = random_array(shape, 4)
  check_against_tf(
      make_mesh_impl(mesh_shape, layout), [(x, shape)] * 2,
      lambda a, b: [_pool(a, [2, 2], None, "MAX_2D"), _pool(b, ksize, strides, "AVG_2D")],
      lambda a, b: [tf.nn.max_pool2d(a, 2, 2, "VALID"),
                    tf.nn.avg_pool2d(b, ksize, strides, "VALID")])


def test_tiled_split_dim_needs_no_communication(make_mesh_impl):
  impl = make_mesh_impl("all:8", "h:all")
  graph, mesh = new_mesh()
  shape = [BATCH, mtf.Dimension("h", 16), W, HIDDEN]
  x = mtf.import_tf_tensor(mesh, random_array(shape, 5), shape)
  y = _pool(x, [2, 3], None, "MAX_2D")
  dx = mtf.gradients([y], [x])[0]
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.export_to_tf_tensor(dx)
  assert not lowering.comm_records


def test_pool_fn():
  x = tf.constant(np.random.RandomState(6).uniform(size=[1, 4, 4, 1]).astype(np.float32))
  np.testing.assert_array_equal(mtf.pool_fn("MAX_2D")(x, 2, 2, "VALID"),
                                tf.nn.max_pool2d(x, 2, 2, "VALID"))
  assert mtf.pool_fn("AVG_3D") is tf.nn.avg_pool3d
  with pytest.raises(mtf.ShapeError, match="unknown pooling 'SUM_2D'"):
    mtf.pool_fn("SUM_2D")


def test_bad_pool_arguments_raise():
  _, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X2, 7), X2)
  with pytest.raises(mtf.ShapeError, match="window 5 does not fit in dim h:4"):
    _pool(x, [5, 2], None, "MAX_2D")
  with pytest.raises(mtf.ShapeError, match="ksize .* 2 positive ints"):
    _pool(x, [2, 2, 2], None, "MAX_2D")
  with pytest.raises(mtf.ShapeError, match="needs \\[batch dims"):
    _pool(mtf.import_tf_tensor(mesh, random_array([H, HIDDEN], 8), [H, HIDDEN]), [2, 2],
          None, "AVG_2D")
  y = _pool(x, [2, 2], None, "MAX_2D")
  with pytest.raises(mtf.ShapeError, match="pooling .* gives"):
    mtf.pool_backprop(x, y, x, [2, 2], None, "MAX_2D")
