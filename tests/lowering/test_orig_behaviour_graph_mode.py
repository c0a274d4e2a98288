"""Lowering under a tf.compat.v1 Graph and Session, as the original's tests ran it:
variables become graph variables that global_variables_initializer initializes,
NumpyConverter.convert_mtf_tensor_to_np_array evaluates there through a Session, the
mesh's BalancedVariablePlacer chooses each variable's master device in creation order
(least-loaded first), and the values equal numpy and the eager run's."""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import test_utils

SHAPE = mtf.Shape([mtf.Dimension("rows", 2), mtf.Dimension("cols", 3)])
VALUE = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5


def _program(converter):
  w = mtf.get_variable(converter.mesh, "w", SHAPE,
                       initializer=tf.compat.v1.constant_initializer(VALUE))
  x = converter.convert_np_array_to_mtf_tensor(np.ones((2, 3), np.float32),
                                               dim_names=["rows", "cols"],
                                               dtype=tf.float32)
  return mtf.reduce_sum(mtf.square(w) + x * w, reduced_dim=SHAPE.dims[1])


def test_numpy_converter_evaluates_in_a_tf1_graph():
  expected = (VALUE ** 2 + VALUE).sum(axis=1)
  with tf.Graph().as_default():
    converter = test_utils.NumpyConverter()
    y = _program(converter)
    got = converter.convert_mtf_tensor_to_np_array(y)
    names = [v.name for v in tf.compat.v1.global_variables()]
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  assert len(names) == 1 and names[0].startswith("w")  # the slice, in that graph
  eager = test_utils.NumpyConverter()
  np.testing.assert_allclose(eager.convert_mtf_tensor_to_np_array(_program(eager)),
                             got, rtol=1e-6)


def test_session_runs_a_lowered_training_step():
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    w = mtf.get_variable(mesh, "w", SHAPE,
                         initializer=tf.compat.v1.constant_initializer(VALUE))
    loss = mtf.reduce_sum(mtf.square(w))
    (grad,) = mtf.gradients([loss], [w])
    update = mtf.assign(w, w - 0.25 * grad)
    impl = mtf.PlacementMeshImpl(shape=[], layout={}, devices=[""])
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    tf_update = lowering.lowered_operation(update)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(lowering.copy_masters_to_slices())
      first = session.run(tf_loss)
      session.run(tf_update)
      second = session.run(tf_loss)
  np.testing.assert_allclose(first, (VALUE ** 2).sum(), rtol=1e-6)
  np.testing.assert_allclose(second, ((0.5 * VALUE) ** 2).sum(), rtol=1e-6)


def test_balanced_placer_places_in_creation_order_in_graph_mode():
  devices = ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
  with tf.Graph().as_default():
    placer = mtf.utils.BalancedVariablePlacer(devices, [100, 0, 0, 0])
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh", placer)
    shape = [mtf.Dimension("hidden", 10), mtf.Dimension("output_feature", 10)]
    variables = [mtf.get_variable(mesh, "w%d" % i, shape).operation for i in range(5)]
  # 400 bytes each: cpu:0 starts with 100, so w0..w2 go to cpu:1..3, then cpu:0, cpu:1.
  assert [v.name for v in variables] == ["w0", "w1", "w2", "w3", "w4"]
  assert [v.master_device for v in variables] == [
      "cpu:%d" % ((i + 1) % 4) for i in range(5)]
  assert placer.usage == [500, 800, 400, 400]
