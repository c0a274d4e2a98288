"""custom_gradient and recompute_grad (mesh_tf/ops/custom_gradient.py)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, HIDDEN, LENGTH, check_against_tf, lower_and_export,
                         new_mesh, random_array)

X_SHAPE = [BATCH, LENGTH, HIDDEN]
W_VALUE = random_array([HIDDEN, mtf.Dimension("out", 8)], 9)


def _block(x):
  """A little network that reads a variable and draws dropout noise inside."""
  w = mtf.get_variable(x.mesh, "w", [HIDDEN, mtf.Dimension("out", 8)],
                       initializer=tf.constant_initializer(W_VALUE))
  h = mtf.einsum([mtf.tanh(x), w], [BATCH, LENGTH, mtf.Dimension("out", 8)])
  h = mtf.rename_dimension(h, "out", "hidden")
  return mtf.dropout(h, rate=0.5) * x, mtf.reduce_sum(mtf.square(h), reduced_dim=LENGTH)


def test_recompute_grad_equals_plain_gradient(mesh_case, make_mesh_impl):
  def grads(recompute):
    # A fresh mesh impl each: its random step counter must start equal for both.
    mesh_impl = make_mesh_impl(mesh_case.mesh_shape, mesh_case.layout)
    graph, mesh = new_mesh()
    x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 1), X_SHAPE)
    ys = mtf.recompute_grad(_block, [x]) if recompute else _block(x)
    assert isinstance(ys, tuple) and len(ys) == 2
    loss = mtf.reduce_sum(ys[0] * 0.5) + mtf.reduce_sum(ys[1] * ys[1])
    w = graph.trainable_variables[0].outputs[0]
    gx, gw = mtf.gradients([loss], [x, w])
    return lower_and_export(graph, mesh, mesh_impl, list(ys) + [gx, gw])
  plain, recomputed = grads(False), grads(True)
  for what, a, b in zip(["output 0", "output 1", "d/dx", "d/dw"], recomputed, plain):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=what)
  assert np.any(plain[0] == 0) and np.any(plain[2] != 0)


def test_custom_gradient_replaces_the_backward_pass(mesh_impl):
  # Forward: x * y. Custom backward: d/dx = 3 * dy (ignores y), d/dy = dy * x.
  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs, output_grads):
    assert all_inputs == explicit_inputs and len(forward_operations) == 1
    assert len(outputs) == 1
    x, y = explicit_inputs
    return [output_grads[0] * 3.0, mtf.reduce_sum(output_grads[0] * x, output_shape=y.shape)]
  h = random_array([HIDDEN], 2)
  x = random_array(X_SHAPE, 3)

  @tf.custom_gradient
  def tf_mul(a, b):
    return a * b, lambda dy: (dy * 3.0, tf.reduce_sum(dy * a, [0, 1]))
  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (h, [HIDDEN])],
      lambda a, b: mtf.custom_gradient(lambda p, q: p * q, grad_fn, [a, b]),
      lambda a, b: tf_mul(a, b), input_labels=["x", "y"])


def test_custom_gradient_sees_implicit_inputs():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 4), X_SHAPE)
  z = mtf.import_tf_tensor(mesh, random_array([HIDDEN], 5), [HIDDEN])
  seen = {}

  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs, output_grads):
    seen["all"] = all_inputs
    return [output_grads[0], None]
  y = mtf.custom_gradient(lambda a: a + z, grad_fn, [x])
  assert isinstance(y.operation, mtf.CustomGradientOperation)
  gx, gz = mtf.gradients([mtf.reduce_sum(y)], [x, z])
  assert seen["all"] == [x, z] and gz is None
  got = lower_and_export(graph, mesh, mtf.PlacementMeshImpl("", ""), [y, gx])
  np.testing.assert_allclose(got[0], random_array(X_SHAPE, 4) + random_array([HIDDEN], 5))
  np.testing.assert_array_equal(got[1], np.ones([8, 3, 8], np.float32))


def test_clone_operations_shares_variables_and_randomness():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 6), X_SHAPE)
  x2 = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 7), X_SHAPE)
  (y, s), ops = graph.capture_operations(lambda: _block(x))
  mapping = mtf.clone_operations(graph, ops, {x: x2})
  assert mapping[y] is not y and mapping[s].shape == s.shape
  variables = [op for op in ops if isinstance(op, mtf.Variable)]
  assert len(variables) == 1 and mapping[variables[0].outputs[0]] is variables[0].outputs[0]
  got = lower_and_export(graph, mesh, mtf.PlacementMeshImpl("", ""), [y, mapping[y]])
  mask = got[0] != 0
  np.testing.assert_array_equal(got[1] != 0, mask)  # the same dropout draw


def test_custom_gradient_errors():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  with pytest.raises(mtf.ShapeError, match="explicit_inputs"):
    mtf.custom_gradient(lambda a: a, lambda **kw: [], [])
  y = mtf.custom_gradient(lambda a: a * 2.0, lambda **kw: [], [x])
  with pytest.raises(mtf.ShapeError, match="returned 0 gradients for 1 inputs"):
    mtf.gradients([mtf.reduce_sum(y)], [x])

  def makes_variable(**kw):
    mtf.get_variable(mesh, "sneaky", [HIDDEN])
    return kw["output_grads"]
  y = mtf.custom_gradient(lambda a: a * 2.0, makes_variable, [x])
  with pytest.raises(mtf.MtfError, match="created variables .*sneaky"):
    mtf.gradients([mtf.reduce_sum(y)], [x])
  assert graph is x.graph
