"""The original's pattern: graph, MeshImpl and Lowering all built inside the model
function, which runs under tf.function. Variables are created once (on the first trace)
and every later trace -- whichever MeshImpl object it builds -- reuses them."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf

B, H, O = mtf.Dimension("batch", 4), mtf.Dimension("hidden", 8), mtf.Dimension("out", 8)
CPUS = ["/cpu:%d" % i for i in range(8)]
X = np.random.RandomState(0).uniform(-1, 1, size=[4, 8]).astype(np.float32)
W0 = np.random.RandomState(1).uniform(-0.5, 0.5, size=[8, 8]).astype(np.float32)


def make_model_fn(make_impl, built_impls):
  """A model function in the original's style: everything is built per call."""
  def model_fn(x, learning_rate):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    mesh_impl = make_impl()
    built_impls.append(mesh_impl)
    xm = mtf.import_tf_tensor(mesh, x, [B, H])
    w = mtf.get_variable(mesh, "w", [H, O], initializer=tf.constant_initializer(W0))
    loss = mtf.reduce_mean(mtf.square(mtf.einsum([xm, w], [B, O])))
    grad, = mtf.gradients([loss], [w])
    update = mtf.assign_sub(w, grad * learning_rate)
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    tf_update = lowering.lowered_operation(update)
    with tf.control_dependencies([tf_update]):
      return tf.identity(tf_loss)
  return model_fn


def reference_losses(learning_rates):
  w = tf.Variable(W0)
  losses = []
  for lr in learning_rates:
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(tf.matmul(X, w)))
    losses.append(loss.numpy())
    w.assign_sub(lr * tape.gradient(loss, w))
  return losses


@pytest.mark.parametrize("backend", ["placement", "simd"])
def test_mesh_impl_built_inside_tf_function(backend):
  def make_impl():
    if backend == "simd":
      return mtf.SimdMeshImpl("b1:2;b2:2", "batch:b1;out:b2")
    return mtf.PlacementMeshImpl("b1:2;b2:2", "batch:b1;out:b2", CPUS[:4])
  built = []
  step = tf.function(make_model_fn(make_impl, built))
  # A Python learning rate retraces the function for each new value.
  rates = [0.5, 0.5, 0.25, 0.5, 0.25]
  losses = [step(tf.constant(X), lr).numpy() for lr in rates]
  np.testing.assert_allclose(losses, reference_losses(rates), rtol=1e-5)
  assert len(built) >= 3  # several traces, each with its own MeshImpl object ...
  stores = {id(impl.variable_store) for impl in built}
  assert len(stores) == 1  # ... sharing one set of variables
  assert list(built[0].variable_store) == ["w"]


def test_a_new_tf_function_starts_with_fresh_variables():
  make_impl = lambda: mtf.PlacementMeshImpl("b1:2;b2:2", "batch:b1", CPUS[:4])
  first = tf.function(make_model_fn(make_impl, []))
  first(tf.constant(X), 0.5)
  second_impls = []
  second = tf.function(make_model_fn(make_impl, second_impls))
  # Starts from W0 again: the first function's training does not leak into it.
  np.testing.assert_allclose(second(tf.constant(X), 0.5).numpy(),
                             reference_losses([0.5])[0], rtol=1e-5)


def test_mesh_impls_built_eagerly_keep_their_own_variables():
  make_impl = lambda: mtf.PlacementMeshImpl("b1:2;b2:2", "batch:b1", CPUS[:4])
  fn = make_model_fn(make_impl, [])
  first = [fn(tf.constant(X), 0.5).numpy() for _ in range(2)]
  np.testing.assert_allclose(first, [reference_losses([0.5])[0]] * 2, rtol=1e-5)
