"""Assignment (mesh_tf/ops/assign.py): assign/assign_add/assign_sub, then reading back."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, LENGTH, new_mesh, random_array

X_SHAPE = [BATCH, LENGTH, HIDDEN]


def _read(graph, mesh, impl, tensors):
  """A fresh Lowering reads the variables' current values."""
  lowering = mtf.Lowering(graph, {mesh: impl})
  return [lowering.export_to_tf_tensor(t).numpy() for t in tensors]


def _run(graph, mesh, impl, op):
  mtf.Lowering(graph, {mesh: impl}).lowered_operation(op)


def test_assign_ops_then_read(mesh_impl):
  v0, d = random_array(X_SHAPE, 0), random_array(X_SHAPE, 1)
  u0 = random_array([HIDDEN, BATCH], 2)
  graph, mesh = new_mesh()
  v = mtf.get_variable(mesh, "v", X_SHAPE, initializer=tf.constant_initializer(v0))
  u = mtf.get_variable(mesh, "u", [HIDDEN, BATCH], initializer=tf.constant_initializer(u0))
  delta = mtf.import_tf_tensor(mesh, d, X_SHAPE)
  set_v = mtf.assign(v, delta)
  add_v = mtf.assign_add(v, delta * 2.0)
  sub_v = mtf.assign_sub(v.operation, delta)  # the Variable op works too
  scale_u = mtf.assign(u, u * 3.0 - mtf.reduce_sum(delta, output_shape=[HIDDEN, BATCH]))

  np.testing.assert_array_equal(_read(graph, mesh, mesh_impl, [v])[0], v0)
  _run(graph, mesh, mesh_impl, set_v)
  np.testing.assert_array_equal(_read(graph, mesh, mesh_impl, [v])[0], d)
  _run(graph, mesh, mesh_impl, add_v)
  np.testing.assert_allclose(_read(graph, mesh, mesh_impl, [v])[0], 3.0 * d, rtol=1e-6)
  _run(graph, mesh, mesh_impl, sub_v)
  np.testing.assert_allclose(_read(graph, mesh, mesh_impl, [v])[0], 2.0 * d, rtol=1e-6)
  _run(graph, mesh, mesh_impl, scale_u)
  np.testing.assert_allclose(_read(graph, mesh, mesh_impl, [u])[0],
                             3.0 * u0 - d.sum(axis=1).T, rtol=1e-5, atol=1e-6)


def test_assign_inside_tf_function(mesh_impl):
  graph, mesh = new_mesh()
  v = mtf.get_variable(mesh, "counter", [BATCH, HIDDEN], initializer=tf.zeros_initializer())
  inc = mtf.assign_add(v, mtf.ones(mesh, [BATCH, HIDDEN]))
  mtf.Lowering(graph, {mesh: mesh_impl})  # creates the variables, eagerly

  @tf.function
  def step():
    mtf.Lowering(graph, {mesh: mesh_impl}).lowered_operation(inc)

  step()
  step()
  np.testing.assert_array_equal(_read(graph, mesh, mesh_impl, [v])[0], np.full([8, 8], 2.0))


def test_assign_errors():
  graph, mesh = new_mesh()
  v = mtf.get_variable(mesh, "v", [BATCH, HIDDEN])
  x = mtf.ones(mesh, [HIDDEN, BATCH])
  with pytest.raises(ValueError, match="shapes differ"):
    mtf.assign(v, x)
  with pytest.raises(ValueError, match="not a variable"):
    mtf.assign(x, x)
  assert graph is v.graph


def test_custom_assign_fn_and_read_variable(mesh_impl):
  """assign with an explicit per-slice writer; read_variable reads the variable (a
  ReadVariable op, as in the original, whose gradient passes through)."""
  v0, d = random_array(X_SHAPE, 3), random_array(X_SHAPE, 4)
  graph, mesh = new_mesh()
  v = mtf.get_variable(mesh, "v", X_SHAPE, initializer=tf.constant_initializer(v0))
  delta = mtf.import_tf_tensor(mesh, d, X_SHAPE)
  writers = [(mtf.assign_slice, d), (mtf.assign_add_slice, 2.0 * d),
             (mtf.assign_sub_slice, d)]
  ops = [mtf.assign(v, delta, assign_fn=fn) for fn, _ in writers]
  read = mtf.read_variable(v.operation)
  assert isinstance(read.operation, mtf.ReadVariable) and read.shape == v.shape
  grad, = mtf.gradients([mtf.reduce_sum(read * 3.0)], [v])
  np.testing.assert_allclose(_read(graph, mesh, mesh_impl, [grad])[0],
                             np.full(v0.shape, 3.0, np.float32))
  for op, (_, expected) in zip(ops, writers):
    _run(graph, mesh, mesh_impl, op)
    np.testing.assert_allclose(_read(graph, mesh, mesh_impl, [read])[0], expected,
                               rtol=1e-6)


def test_depend_orders_a_read_after_an_assign(mesh_impl):
  """Inside tf.function, depend(x, [assign]) sees the assigned value."""
  v0, d = random_array(X_SHAPE, 5), random_array(X_SHAPE, 6)
  graph, mesh = new_mesh()
  v = mtf.get_variable(mesh, "v", X_SHAPE, initializer=tf.constant_initializer(v0))
  update = mtf.assign(v, mtf.import_tf_tensor(mesh, d, X_SHAPE))
  after = mtf.depend(mtf.constant(mesh, 1.0, X_SHAPE), [update])
  mtf.Lowering(graph, {mesh: mesh_impl})

  @tf.function
  def step():
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    return lowering.export_to_tf_tensor(after)
  np.testing.assert_array_equal(step().numpy(), np.ones(v0.shape, np.float32))
  # The dependency ran the assign even though only `after` was fetched.
  np.testing.assert_array_equal(_read(graph, mesh, mesh_impl, [v])[0], d)
  grad, = mtf.gradients([mtf.reduce_sum(mtf.depend(v * 2.0, [update]))], [v])
  np.testing.assert_allclose(_read(graph, mesh, mesh_impl, [grad])[0],
                             np.full(v0.shape, 2.0, np.float32))
