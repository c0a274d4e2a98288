"""Convolution ops (mesh_tf/ops/convolution.py) forward and gradient against plain TF.

Inputs are [batch, spatial..., channels]; the conftest layouts split "batch" and
"hidden", so each test uses "hidden" once as the input (contracted) channel dim and once
as the output channel dim of the filter.
"""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, CLASSES, check_against_tf, new_mesh, random_array

D, H, W = mtf.Dimension("d", 2), mtf.Dimension("h", 5), mtf.Dimension("w", 4)
FD, FH, FW = mtf.Dimension("fd", 2), mtf.Dimension("fh", 3), mtf.Dimension("fw", 2)
OUT = mtf.Dimension("out", 3)
X2 = [BATCH, H, W, HIDDEN]            # channel "hidden" (split in some layouts)
F2_IN = [FH, FW, HIDDEN, OUT]          # contracts the split channel
X2C = [BATCH, H, W, CLASSES]
F2_OUT = [FH, FW, CLASSES, HIDDEN]     # produces the split channel
X3 = [BATCH, D, H, W, HIDDEN]
F3_IN = [FD, FH, FW, HIDDEN, OUT]
X3C = [BATCH, D, H, W, CLASSES]
F3_OUT = [FD, FH, FW, CLASSES, HIDDEN]


def _inputs(*shapes):
  return [(random_array(s, 10 + i), s) for i, s in enumerate(shapes)]


def test_conv2d(mesh_impl):
  check_against_tf(
      mesh_impl, _inputs(X2, F2_IN, X2C, F2_OUT),
      lambda x, f, xc, fc: [
          mtf.Conv2dOperation(x, f, [1, 1, 1, 1], "SAME").outputs[0],
          mtf.Conv2dOperation(xc, fc, [1, 2, 1, 1], "VALID").outputs[0]],
      lambda x, f, xc, fc: [tf.nn.conv2d(x, f, [1, 1, 1, 1], "SAME"),
                            tf.nn.conv2d(xc, fc, [1, 2, 1, 1], "VALID")],
      labels=["SAME, hidden contracted", "VALID stride 2, hidden produced"],
      input_labels=["x", "filter", "x (classes)", "filter (-> hidden)"], rtol=1e-4,
      atol=1e-5)


def test_conv3d(mesh_impl):
  check_against_tf(
      mesh_impl, _inputs(X3, F3_IN, X3C, F3_OUT),
      lambda x, f, xc, fc: [
          mtf.Conv3dOperation(x, f, [1, 1, 2, 1, 1], "SAME").outputs[0],
          mtf.Conv3dOperation(xc, fc, [1, 1, 1, 1, 1], "VALID").outputs[0]],
      lambda x, f, xc, fc: [tf.nn.conv3d(x, f, [1, 1, 2, 1, 1], "SAME"),
                            tf.nn.conv3d(xc, fc, [1, 1, 1, 1, 1], "VALID")],
      rtol=1e-4, atol=1e-5)


def _tf_transpose(x, f, strides, padding, out_spatial):
  out_shape = [x.shape[0]] + out_spatial + [f.shape[-2]]
  fn = tf.nn.conv2d_transpose if len(out_spatial) == 2 else tf.nn.conv3d_transpose
  return fn(x, f, out_shape, strides, padding)


def test_conv2d_transpose(mesh_impl):
  ft_in = [FH, FW, OUT, HIDDEN]        # [fh, fw, out channels, in channels]
  ft_out = [FH, FW, HIDDEN, CLASSES]
  check_against_tf(
      mesh_impl, _inputs(X2, ft_in, X2C, ft_out),
      lambda x, f, xc, fc: [
          mtf.Conv2dTransposeOperation(x, f, [1, 2, 2, 1], "SAME").outputs[0],
          mtf.Conv2dTransposeOperation(xc, fc, [1, 1, 2, 1], "VALID").outputs[0]],
      lambda x, f, xc, fc: [_tf_transpose(x, f, [1, 2, 2, 1], "SAME", [10, 8]),
                            _tf_transpose(xc, fc, [1, 1, 2, 1], "VALID", [7, 8])],
      rtol=1e-4, atol=1e-5)


def test_conv3d_transpose(mesh_impl):
  ft_in = [FD, FH, FW, OUT, HIDDEN]
  check_against_tf(
      mesh_impl, _inputs(X3, ft_in),
      lambda x, f: mtf.Conv3dTransposeOperation(x, f, [1, 2, 1, 2, 1], "SAME").outputs[0],
      lambda x, f: _tf_transpose(x, f, [1, 2, 1, 2, 1], "SAME", [4, 5, 8]),
      rtol=1e-4, atol=1e-5)


def test_conv2d_backprop_ops_and_their_gradients(mesh_impl):
  """The gradient ops on their own, with their own (second-order) gradients."""
  dy2 = [BATCH, H, W, OUT]
  s, p = [1, 1, 1, 1], "SAME"
  check_against_tf(
      mesh_impl, _inputs(F2_IN, dy2, X2),
      lambda f, dy, x: [
          mtf.conv2d_backprop_input(mtf.Shape(X2), f, dy, s, p),
          mtf.conv2d_backprop_filter(x, mtf.Shape(F2_IN), dy, s, p),
          mtf.conv2d_transpose_backprop_input(mtf.Shape(dy2), f, x, s, p),
          mtf.conv2d_transpose_backprop_filter(dy, mtf.Shape(F2_IN), x, s, p)],
      lambda f, dy, x: [
          tf.raw_ops.Conv2DBackpropInput(input_sizes=[8, 5, 4, 8], filter=f,
                                         out_backprop=dy, strides=s, padding=p),
          tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=[3, 2, 8, 3],
                                          out_backprop=dy, strides=s, padding=p),
          tf.nn.conv2d(x, f, s, p),
          tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=[3, 2, 8, 3],
                                          out_backprop=dy, strides=s, padding=p)],
      labels=["backprop_input", "backprop_filter", "transpose_backprop_input",
              "transpose_backprop_filter"], rtol=1e-4, atol=1e-4)


def test_conv3d_backprop_ops_and_their_gradients(mesh_impl):
  dy3 = [BATCH, D, H, W, OUT]
  s, p = [1, 1, 1, 1, 1], "SAME"
  check_against_tf(
      mesh_impl, _inputs(F3_IN, dy3, X3),
      lambda f, dy, x: [
          mtf.conv3d_backprop_input(mtf.Shape(X3), f, dy, s, p),
          mtf.conv3d_backprop_filter(x, mtf.Shape(F3_IN), dy, s, p),
          mtf.conv3d_transpose_backprop_input(mtf.Shape(dy3), f, x, s, p),
          mtf.conv3d_transpose_backprop_filter(dy, mtf.Shape(F3_IN), x, s, p)],
      lambda f, dy, x: [
          tf.raw_ops.Conv3DBackpropInputV2(input_sizes=[8, 2, 5, 4, 8], filter=f,
                                           out_backprop=dy, strides=s, padding=p),
          tf.raw_ops.Conv3DBackpropFilterV2(input=x, filter_sizes=[2, 3, 2, 8, 3],
                                            out_backprop=dy, strides=s, padding=p),
          tf.nn.conv3d(x, f, s, p),
          tf.raw_ops.Conv3DBackpropFilterV2(input=x, filter_sizes=[2, 3, 2, 8, 3],
                                            out_backprop=dy, strides=s, padding=p)],
      rtol=1e-4, atol=1e-4)


SPATIAL_CASES = [("all:8", "h:all"), ("rows:2;cols:4", "w:rows;h:cols"),
                 ("rows:2;cols:4", "h:rows;fh:cols")]


@pytest.mark.parametrize("case", SPATIAL_CASES, ids=["h:8", "w:2,h:4", "h:2,fh:4"])
def test_split_spatial_dims_are_gathered(make_mesh_impl, case):
  """Layouts that split h, w or the filter window give the same numbers as one device."""
  h8, fh4, b2 = mtf.Dimension("h", 8), mtf.Dimension("fh", 4), mtf.Dimension("batch", 2)
  x_shape, f_shape = [b2, h8, W, HIDDEN], [fh4, FW, HIDDEN, OUT]
  check_against_tf(
      make_mesh_impl(*case), _inputs(x_shape, f_shape),
      lambda x, f: mtf.Conv2dOperation(x, f, [1, 1, 1, 1], "SAME").outputs[0],
      lambda x, f: tf.nn.conv2d(x, f, [1, 1, 1, 1], "SAME"), rtol=1e-4, atol=1e-5)


def test_several_batch_dims(mesh_impl):
  extra = mtf.Dimension("extra", 2)
  x_shape = [extra, BATCH, H, W, CLASSES]
  check_against_tf(
      mesh_impl, _inputs(x_shape, F2_OUT),
      lambda x, f: mtf.Conv2dOperation(x, f, [1, 1, 1, 1], "SAME").outputs[0],
      lambda x, f: tf.reshape(tf.nn.conv2d(tf.reshape(x, [16, 5, 4, 4]), f, [1] * 4,
                                           "SAME"), [2, 8, 5, 4, 8]),
      rtol=1e-4, atol=1e-5)


def test_batch_split_filter_gradient_allreduces(make_mesh_impl):
  """The filter gradient sums over the split batch: one SUM allreduce over that axis."""
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X2C, 1), X2C)
  f = mtf.import_tf_tensor(mesh, random_array(F2_OUT, 2), F2_OUT)
  y = mtf.Conv2dOperation(x, f, [1, 1, 1, 1], "SAME").outputs[0]
  df = mtf.gradients([y], [f])[0]
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.export_to_tf_tensor(df)
  kinds = [(r.kind, r.mesh_axes) for r in lowering.comm_records]
  assert ("allreduce", (0,)) in kinds, kinds


def _build(fn):
  graph, mesh = new_mesh()
  del graph
  return fn(mesh)


def _imp(mesh, shape):
  return mtf.import_tf_tensor(mesh, np.zeros(mtf.convert_to_shape(shape).to_integer_list,
                                             np.float32), shape)


def test_mismatched_channel_dims_raise():
  with pytest.raises(mtf.ShapeError,
                     match=r"channel dim of .* is hidden:8 but .* has classes:4"):
    _build(lambda m: mtf.Conv2dOperation(_imp(m, X2), _imp(m, F2_OUT), None, "SAME"))
  with pytest.raises(mtf.ShapeError, match="channel dim"):
    _build(lambda m: mtf.Conv2dTransposeOperation(_imp(m, X2), _imp(m, F2_IN), None,
                                                  "SAME"))


def test_bad_conv_arguments_raise():
  with pytest.raises(mtf.ShapeError, match="filter .* has shape"):
    _build(lambda m: mtf.Conv2dOperation(_imp(m, X2), _imp(m, F3_IN), None, "SAME"))
  with pytest.raises(mtf.ShapeError, match="input .* has shape"):
    _build(lambda m: mtf.Conv3dOperation(_imp(m, [H, W, HIDDEN]), _imp(m, F3_IN), None,
                                         "SAME"))
  with pytest.raises(mtf.ShapeError, match="padding 'FULL'"):
    _build(lambda m: mtf.Conv2dOperation(_imp(m, X2), _imp(m, F2_IN), None, "FULL"))
  with pytest.raises(mtf.ShapeError, match="strides"):
    _build(lambda m: mtf.Conv2dOperation(_imp(m, X2), _imp(m, F2_IN), [2, 1, 1, 1],
                                         "SAME"))
  big = [mtf.Dimension("fh", 7), FW, HIDDEN, OUT]
  with pytest.raises(mtf.ShapeError, match="no output along h"):
    _build(lambda m: mtf.Conv2dOperation(_imp(m, X2), _imp(m, big), None, "VALID"))
  clash = [FH, FW, HIDDEN, mtf.Dimension("batch", 3)]
  with pytest.raises(mtf.ShapeError, match="output channel dim batch"):
    _build(lambda m: mtf.Conv2dOperation(_imp(m, X2), _imp(m, clash), None, "SAME"))


def test_bad_backprop_arguments_raise():
  dy_bad = [BATCH, mtf.Dimension("h", 4), W, OUT]
  with pytest.raises(mtf.ShapeError, match="spatial dim h:4 .* should be h:5"):
    _build(lambda m: mtf.conv2d_backprop_input(mtf.Shape(X2), _imp(m, F2_IN),
                                               _imp(m, dy_bad), None, "SAME"))
  with pytest.raises(mtf.ShapeError, match="batch dims"):
    _build(lambda m: mtf.conv2d_backprop_filter(
        _imp(m, X2), mtf.Shape(F2_IN),
        _imp(m, [mtf.Dimension("batch", 4), H, W, OUT]), None, "SAME"))
  with pytest.raises(mtf.ShapeError, match="output channel dim"):
    _build(lambda m: mtf.conv3d_backprop_filter(
        _imp(m, X3), mtf.Shape(F3_IN), _imp(m, [BATCH, D, H, W, CLASSES]), None, "SAME"))


def test_conv_pool_halo_under_xla(make_mesh_impl):
  """conv, transpose, pooling and a halo exchange with their gradients: XLA-compiled
  tf.function on one device gives the eager numbers."""
  impl = make_mesh_impl("", "")
  graph, mesh = new_mesh()
  blocks = mtf.Dimension("hb", 2)
  x = mtf.import_tf_tensor(mesh, tf.TensorSpec([8, 2, 5, 4, 8]),
                           [BATCH, blocks, H, W, HIDDEN])
  f = mtf.import_tf_tensor(mesh, random_array(F2_IN, 1), F2_IN)
  halo = mtf.halo_exchange(x, blocks, H, 2)
  y = mtf.Conv2dOperation(halo, f, None, "VALID").outputs[0]
  y = mtf.Conv2dTransposeOperation(y, mtf.import_tf_tensor(mesh, random_array(
      [FH, FW, HIDDEN, OUT], 2), [FH, FW, HIDDEN, OUT]), [1, 1, 2, 1], "SAME").outputs[0]
  z = mtf.PoolOperation(y, [2, 2], None, "MAX_2D").outputs[0]
  loss = mtf.reduce_sum(z)
  outputs = [z] + mtf.gradients([loss], [x, f])
  value = tf.constant(random_array([BATCH, blocks, H, W, HIDDEN], 3))
  eager = mtf.Lowering(graph, {mesh: impl}, feeds={x: value})
  expected = [eager.export_to_tf_tensor(t).numpy() for t in outputs]

  @tf.function(jit_compile=True)
  def run(v):
    lowering = mtf.Lowering(graph, {mesh: impl}, feeds={x: v})
    return [lowering.export_to_tf_tensor(t) for t in outputs]
  for got, want in zip(run(value), expected):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
