"""Signatures that changed to the original's, called the original's way, against plain TF.

Each test calls an op as code written for mesh_tensorflow 0.1.21 would (positional
arguments in the original's order, the original's keyword names) and compares with the
same computation in TensorFlow on one device, on one device and on a 2x4 placement mesh.
"""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, HIDDEN, assert_close, lower_and_export, new_mesh,
                         random_array)

CPUS = ["/cpu:%d" % i for i in range(8)]
MESHES = pytest.mark.parametrize("mesh_shape,layout", [
    ("", ""), ("rows:2;cols:4", "batch:rows;hidden:cols")], ids=["single", "2x4"])
CLASSES = mtf.Dimension("classes", 4)


def _impl(mesh_shape, layout):
  n = mtf.convert_to_shape(mesh_shape).size
  return mtf.PlacementMeshImpl(mesh_shape, layout, CPUS[:n])


@MESHES
def test_argmax_and_top_1_take_name_third(mesh_shape, layout):
  x_np = random_array([BATCH, HIDDEN], 1)
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, HIDDEN])
  index = mtf.argmax(x, HIDDEN, "my_argmax")
  top_index, top_value = mtf.top_1(x, HIDDEN, "my_top_1")
  assert index.dtype == tf.int32 and top_index.dtype == tf.int32
  got = lower_and_export(graph, mesh, _impl(mesh_shape, layout),
                         [index, top_index, top_value])
  assert_close(got[0], tf.argmax(x_np, axis=1, output_type=tf.int32), "argmax")
  assert_close(got[1], got[0], "top_1 index")
  assert_close(got[2], tf.reduce_max(x_np, axis=1), "top_1 value")


@MESHES
def test_assign_fn_takes_variable_slice_and_value(mesh_shape, layout):
  """An original-style custom writer assign_fn(variable, slice_var, value)."""
  v0, d = random_array([BATCH, HIDDEN], 2), random_array([BATCH, HIDDEN], 3)
  graph, mesh = new_mesh()
  v = mtf.get_variable(mesh, "v", [BATCH, HIDDEN], initializer=tf.constant_initializer(v0))
  seen = []

  def scaled_add(variable, slice_var, value):
    seen.append(variable)
    return slice_var.assign_add(0.5 * value)
  update = mtf.assign(v, mtf.import_tf_tensor(mesh, d, [BATCH, HIDDEN]),
                      assign_fn=scaled_add)
  assert update.assign_fn is scaled_add
  impl = _impl(mesh_shape, layout)
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.lowered_operation(update)
  assert seen and all(s is v.operation for s in seen)
  assert_close(lower_and_export(graph, mesh, impl, [v])[0], v0 + 0.5 * d, "assigned")
  # The original's writers have the same contract.
  mtf.Lowering(graph, {mesh: impl}).lowered_operation(
      mtf.assign(v, mtf.import_tf_tensor(mesh, d, [BATCH, HIDDEN]),
                 assign_fn=mtf.assign_slice))
  assert_close(lower_and_export(graph, mesh, impl, [v])[0], d, "assign_slice")


@MESHES
def test_pool_backprop_takes_x_y_dy(mesh_shape, layout):
  h, w = mtf.Dimension("h", 4), mtf.Dimension("w", 4)
  ph, pw = mtf.Dimension("h", 2), mtf.Dimension("w", 2)
  x_np = random_array([BATCH, h, w, HIDDEN], 4)
  dy_np = random_array([BATCH, ph, pw, HIDDEN], 5)
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, h, w, HIDDEN])
  y = mtf.layers.max_pool2d(x, (2, 2))
  dy = mtf.import_tf_tensor(mesh, dy_np, [BATCH, ph, pw, HIDDEN])
  dx = mtf.pool_backprop(x, y, dy, [2, 2], [2, 2], "MAX_2D")
  got = lower_and_export(graph, mesh, _impl(mesh_shape, layout), [dx])[0]
  xt = tf.constant(x_np)
  with tf.GradientTape() as tape:
    tape.watch(xt)
    yt = tf.nn.max_pool2d(xt, 2, 2, "VALID")
  assert_close(got, tape.gradient(yt, xt, output_gradients=dy_np), "pool_backprop")


@MESHES
def test_renamed_keywords(mesh_shape, layout):
  """ones_like(t=), zeros_like(t=), pow(x=, y=), list_product(l=),
  tensor_dim_to_mesh_dim_size(layout=, ...), Lowering.set_tensor_lowering(tensor=,
  laid_out_tensor=)."""
  x_np = np.abs(random_array([BATCH, HIDDEN], 6)) + 0.5
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, HIDDEN])

  class Negate(mtf.Operation):
    """A user-written op lowering itself the original's way."""

    def __init__(self, t):
      super().__init__([t], name="negate")
      self._add_output(t.shape, t.dtype)

    def lower(self, lowering):
      impl = lowering.mesh_impl(self)
      lowering.set_tensor_lowering(
          tensor=self.outputs[0],
          laid_out_tensor=impl.slicewise(tf.negative, lowering.tensors[self.inputs[0]]))
  outs = [mtf.ones_like(t=x), mtf.zeros_like(t=x), mtf.pow(x=x, y=1.5),
          Negate(x).outputs[0]]
  got = lower_and_export(graph, mesh, _impl(mesh_shape, layout), outs)
  assert_close(got[0], np.ones_like(x_np), "ones_like")
  assert_close(got[1], np.zeros_like(x_np), "zeros_like")
  assert_close(got[2], tf.pow(x_np, 1.5), "pow", rtol=1e-5)
  assert_close(got[3], -x_np, "set_tensor_lowering")
  assert mtf.list_product(l=[2, 3, 4]) == 24
  expected_split = 4 if layout else 1
  assert mtf.tensor_dim_to_mesh_dim_size(
      layout=layout, mesh_shape=mesh_shape, tensor_dim=HIDDEN) == expected_split
  assert mtf.tensor_dim_to_size_per_split(layout, mesh_shape, HIDDEN) == 8 // expected_split


@pytest.mark.parametrize("name", ["identity", "negative", "exp", "log", "sqrt", "rsqrt",
                                  "square", "reciprocal", "sigmoid", "tanh", "sin", "cos",
                                  "relu", "sign", "logical_not", "leaky_relu", "cast",
                                  "transpose"])
def test_default_op_names_are_the_originals(name):
  import inspect  # pylint: disable=g-import-not-at-top
  fn = getattr(mtf, name)
  assert inspect.signature(fn).parameters["name"].default == name
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, np.ones([8, 8], np.float32), [BATCH, HIDDEN])
  if name == "logical_not":
    x = mtf.cast(x, tf.bool)
  args = {"cast": (tf.int32,), "transpose": ([HIDDEN, BATCH],)}.get(name, ())
  y = fn(x, *args)
  assert y.operation.name.split("/")[-1].startswith(name)
  assert graph is y.graph


@MESHES
def test_unary_ops_under_their_default_names_match_tf(mesh_shape, layout):
  x_np = np.abs(random_array([BATCH, HIDDEN], 7)) + 0.25
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, HIDDEN])
  pairs = [(mtf.rsqrt, tf.math.rsqrt), (mtf.log, tf.math.log), (mtf.sigmoid, tf.sigmoid),
           (mtf.squared_relu, lambda t: tf.square(tf.nn.relu(t)))]
  got = lower_and_export(graph, mesh, _impl(mesh_shape, layout), [f(x) for f, _ in pairs])
  for value, (_, tf_fn) in zip(got, pairs):
    assert_close(value, tf_fn(x_np), "unary")


@MESHES
def test_random_ops_take_the_tf_sampler_kwargs(mesh_shape, layout):
  graph, mesh = new_mesh()
  u = mtf.random_uniform(mesh, [BATCH, HIDDEN], minval=2.0, maxval=3.0, dtype=tf.float32,
                         seed=7)
  n = mtf.random_normal(mesh, [BATCH, HIDDEN], mean=5.0, stddev=0.01, seed=8)
  truncated = mtf.RandomOperation(mesh, [BATCH, HIDDEN], tf.random.truncated_normal,
                                  stddev=1.0, seed=3).outputs[0]
  impl = _impl(mesh_shape, layout)
  u_np, n_np, t_np = lower_and_export(graph, mesh, impl, [u, n, truncated])
  assert u_np.min() >= 2.0 and u_np.max() < 3.0 and u_np.std() > 0.1
  assert abs(n_np.mean() - 5.0) < 0.01
  assert np.abs(t_np).max() <= 2.0 and t_np.std() > 0.3
  # Layout independence of the counter-based samplers (same seed, one device).
  graph1, mesh1 = new_mesh()
  u1 = mtf.random_uniform(mesh1, [BATCH, HIDDEN], minval=2.0, maxval=3.0, seed=7)
  assert_close(lower_and_export(graph1, mesh1, _impl("", ""), [u1])[0], u_np, "uniform")
  with pytest.raises(mtf.ShapeError, match="no argument"):
    mtf.random_uniform(mesh, [BATCH], mean=1.0)


def test_mesh_impl_random_agrees_across_replicas():
  impl = mtf.PlacementMeshImpl("rows:2;cols:4", "batch:rows", CPUS)
  laid_out = impl.random(mtf.Shape([BATCH, HIDDEN]), tf.random.uniform, {"seed": 1})
  slices = [s.numpy() for s in laid_out.tensor_list]
  for pnum in range(8):  # processors of one row hold the same rows of the batch
    assert_close(slices[pnum], slices[pnum - pnum % 4], "replica %d" % pnum, exact=True)
  assert not np.array_equal(slices[0], slices[4])
