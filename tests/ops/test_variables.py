"""Variables (mesh_tf/ops/variables.py): initial values, names, dtypes, on every layout."""
import functools

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, CLASSES, HIDDEN, lower_and_export, new_mesh, random_array


def _variables_graph():
  graph, mesh = new_mesh()
  with mtf.variable_scope("layer"):
    kernel = mtf.get_variable(mesh, "kernel", [HIDDEN, CLASSES])  # default: glorot
  bias = mtf.get_variable(mesh, "bias", [BATCH, HIDDEN], initializer=tf.ones_initializer())
  given = mtf.get_variable(mesh, "given", [BATCH, HIDDEN],
                           initializer=random_array([BATCH, HIDDEN], 0))
  half = mtf.get_variable(mesh, "half", [HIDDEN, BATCH], initializer=tf.constant_initializer(
      0.1), activation_dtype=tf.bfloat16)
  return graph, mesh, [kernel, bias, given, half]


@functools.lru_cache(maxsize=None)
def _single_device_values():
  graph, mesh, tensors = _variables_graph()
  return lower_and_export(graph, mesh, mtf.PlacementMeshImpl("", "", ["/cpu:0"]), tensors)


def test_variable_values_do_not_depend_on_layout(mesh_impl):
  graph, mesh, tensors = _variables_graph()
  kernel, bias, given, half = lower_and_export(graph, mesh, mesh_impl, tensors)
  for got, ref in zip([kernel, bias, given, half], _single_device_values()):
    np.testing.assert_array_equal(got, ref)
  limit = np.sqrt(6.0 / (8 + 4))
  assert kernel.shape == (8, 4) and np.abs(kernel).max() <= limit and kernel.std() > 0.1
  np.testing.assert_array_equal(bias, np.ones([8, 8], np.float32))
  np.testing.assert_array_equal(given, random_array([BATCH, HIDDEN], 0))
  assert half.dtype == tf.bfloat16.as_numpy_dtype
  assert [t.operation.name for t in tensors] == ["layer/kernel", "bias", "given", "half"]
  assert [v.name for v in graph.trainable_variables] == [
      "layer/kernel", "bias", "given", "half"]


def test_variable_errors():
  graph, mesh = new_mesh()
  mtf.get_variable(mesh, "w", [BATCH])
  with pytest.raises(ValueError, match="already exists"):
    mtf.get_variable(mesh, "w", [BATCH])
  bad = mtf.get_variable(mesh, "bad", [BATCH], initializer=np.zeros([3], np.float32))
  with pytest.raises(ValueError, match="initializer"):
    mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", ["/cpu:0"])})
  assert bad.graph is graph


def test_reuse_scope_returns_the_existing_variable():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  dim = mtf.Dimension("hidden", 8)
  with mtf.variable_scope("shared"):
    first = mtf.get_variable(mesh, "w", [dim])
  with mtf.variable_scope("shared", reuse=True):
    again = mtf.get_variable(mesh, "w", [dim])
  assert again is first and len(graph.all_variables) == 1
  with mtf.variable_scope("shared", reuse=tf.compat.v1.AUTO_REUSE):
    assert mtf.get_variable(mesh, "w", [dim]) is first
  with pytest.raises(mtf.ShapeError, match="already exists"):
    with mtf.variable_scope("shared"):
      mtf.get_variable(mesh, "w", [dim])
  with pytest.raises(mtf.ShapeError, match="reused with shape"):
    with mtf.variable_scope("shared", reuse=True):
      mtf.get_variable(mesh, "w", [mtf.Dimension("hidden", 16)])
