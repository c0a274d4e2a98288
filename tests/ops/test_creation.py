"""Creating tensors (mesh_tf/ops/creation.py): constants, zeros/ones/fill, imports."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, HIDDEN, LENGTH, check_against_tf, new_mesh,
                         random_array)

X_SHAPE = [BATCH, LENGTH, HIDDEN]


def test_constants_and_fills(mesh_impl):
  arr = random_array([BATCH, HIDDEN], 0)
  check_against_tf(
      mesh_impl, [],
      lambda mesh: [
          mtf.constant(mesh, 3.5, X_SHAPE),
          mtf.constant(mesh, 7, [HIDDEN], dtype=tf.int32),
          mtf.constant(mesh, 2.0),  # a scalar
          mtf.constant(mesh, arr, [BATCH, HIDDEN]),  # an array of the full shape
          mtf.zeros(mesh, X_SHAPE), mtf.ones(mesh, [HIDDEN, BATCH], dtype=tf.int32),
          mtf.fill(mesh, [LENGTH, HIDDEN], -1.25),
          mtf.fill(mesh, [BATCH], True, dtype=tf.bool)],
      lambda: [tf.fill([8, 3, 8], 3.5), tf.fill([8], 7), tf.constant(2.0),
               tf.constant(arr), tf.zeros([8, 3, 8]), tf.ones([8, 8], tf.int32),
               tf.fill([3, 8], -1.25), tf.fill([8], True)],
      labels=["scalar constant", "int constant", "0-d constant", "array constant",
              "zeros", "int ones", "fill", "bool fill"], pass_mesh=True)


def test_imports(mesh_impl):
  arr = random_array(X_SHAPE, 1)
  var = tf.Variable(random_array([HIDDEN, BATCH], 2))
  check_against_tf(
      mesh_impl, [],
      lambda mesh: [
          mtf.import_fully_replicated(mesh, tf.constant(arr), X_SHAPE),
          mtf.import_tf_tensor(mesh, arr, X_SHAPE),
          mtf.import_tf_tensor(mesh, var, [HIDDEN, BATCH]),
          mtf.import_tf_tensor(mesh, tf.constant(4, tf.int64)),  # scalar, no shape
          mtf.import_tf_tensor(mesh, 2.5)],  # a Python number
      lambda: [tf.constant(arr), tf.constant(arr), var.read_value(),
               tf.constant(4, tf.int64), tf.constant(2.5)],
      labels=["import_fully_replicated", "import array", "import tf.Variable",
              "import scalar", "import Python number"], pass_mesh=True)


def test_imported_values_flow_into_gradients(mesh_impl):
  x = random_array(X_SHAPE, 3)
  c = random_array([HIDDEN], 4)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)],
      lambda a: [a * mtf.import_fully_replicated(a.mesh, tf.constant(c), [HIDDEN]) +
                 mtf.constant(a.mesh, 0.5, [BATCH]) * mtf.ones(a.mesh, X_SHAPE)],
      lambda t: [t * c + 0.5])


def test_creation_errors():
  _, mesh = new_mesh()
  with pytest.raises(ValueError, match="does not match"):
    mtf.import_tf_tensor(mesh, np.zeros([3, 3], np.float32), [BATCH, HIDDEN])
  with pytest.raises(ValueError, match="needs a shape"):
    mtf.import_tf_tensor(mesh, np.zeros([8], np.float32))


def test_import_laid_out_tensor_round_trips(mesh_impl):
  """A backend's laid-out value re-enters the graph unchanged."""
  x0 = np.arange(8 * 8, dtype=np.float32).reshape(8, 8)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  shape = [mtf.Dimension("batch", 8), mtf.Dimension("hidden", 8)]
  x = mtf.import_tf_tensor(mesh, x0, shape)
  first = mtf.Lowering(graph, {mesh: mesh_impl})
  first.export_to_tf_tensor(x)
  laid = first.tensors[x]
  graph2 = mtf.Graph()
  mesh2 = mtf.Mesh(graph2, "m")
  y = mtf.import_laid_out_tensor(mesh2, laid, shape) * 2.0
  out = mtf.Lowering(graph2, {mesh2: mesh_impl}).export_to_tf_tensor(y)
  np.testing.assert_array_equal(out.numpy(), 2.0 * x0)
