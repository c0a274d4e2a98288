"""Graph, Mesh, Tensor and Operation: naming, bookkeeping and Python operators."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf

B = mtf.Dimension("batch", 8)
H = mtf.Dimension("hidden", 4)


def test_unique_name_suffix_rules():
  graph = mtf.Graph()
  assert graph.unique_name("foo") == "foo"
  assert graph.unique_name("foo") == "foo_1"
  assert graph.unique_name("foo") == "foo_2"
  # Case-insensitive, like TF.
  assert graph.unique_name("Foo") == "Foo_3"
  # An explicit "bar_1" makes the second "bar" skip to "bar_2".
  assert graph.unique_name("bar_1") == "bar_1"
  assert graph.unique_name("bar") == "bar"
  assert graph.unique_name("bar") == "bar_2"
  # mark_as_used=False only peeks.
  assert graph.unique_name("baz", mark_as_used=False) == "baz"
  assert graph.unique_name("baz") == "baz"


def test_scopes_prefix_op_and_variable_names():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  with mtf.variable_scope("encoder"):
    with mtf.variable_scope("layer_000"):
      w = mtf.get_variable(mesh, "kernel", [H])
      y = mtf.relu(w)
  with tf.compat.v1.variable_scope("tf_scope"):
    v = mtf.get_variable(mesh, "bias", [H])
  assert w.operation.name == "encoder/layer_000/kernel"
  assert y.operation.name == "encoder/layer_000/relu"
  assert v.operation.name == "tf_scope/bias"
  assert graph.unique_name("x") == "x"  # scopes are popped


def test_operations_and_variable_lists():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", [H])
  s = mtf.get_variable(mesh, "step", [], dtype=tf.int32, trainable=False)
  y = w * 2.0
  assert [v.name for v in graph.trainable_variables] == ["w"]
  assert [v.name for v in graph.all_variables] == ["w", "step"]
  assert y.operation in graph.operations
  assert graph.operations.index(w.operation) < graph.operations.index(y.operation)
  graph.make_variables_untrainable([w.operation])
  assert graph.trainable_variables == []
  assert s.dtype == tf.int32
  assert "multiply" in graph.to_string


def test_tensor_properties():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x = mtf.import_tf_tensor(mesh, np.ones([8, 4], np.float32), [B, H], name="x")
  assert x.shape == mtf.Shape([B, H])
  assert x.dtype == tf.float32
  assert x.mesh is mesh and x.graph is graph
  assert x.size == 32
  assert x.name == "x:0"
  assert x.operation.outputs == [x]
  assert "batch:8;hidden:4" in repr(x)


def test_variable_dtypes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  v = mtf.get_variable(mesh, "v", [H], master_dtype=tf.bfloat16, slice_dtype=tf.float32,
                       activation_dtype=tf.bfloat16)
  op = v.operation
  assert (op.master_dtype, op.slice_dtype, op.activation_dtype) == (
      tf.bfloat16, tf.float32, tf.bfloat16)
  assert v.dtype == tf.bfloat16
  impl = mtf.PlacementMeshImpl("", "", [""])
  lowering = mtf.Lowering(graph, {mesh: impl})
  assert impl.variable_store["v"].slice_variables[0].dtype == tf.float32
  assert lowering.export_to_tf_tensor(v).dtype == tf.bfloat16


def test_python_operators_broadcast_by_name():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  a = np.arange(1, 9, dtype=np.float32)
  b = np.arange(1, 5, dtype=np.float32)
  x = mtf.import_tf_tensor(mesh, a, [B])
  y = mtf.import_tf_tensor(mesh, b, [H])
  results = {
      "add": (x + y, a[:, None] + b), "radd": (1.0 + x, 1.0 + a),
      "sub": (x - y, a[:, None] - b), "rsub": (10.0 - x, 10.0 - a),
      "mul": (x * y, a[:, None] * b), "rmul": (3.0 * x, 3.0 * a),
      "div": (x / y, a[:, None] / b), "rdiv": (1.0 / x, 1.0 / a),
      "floordiv": (x // 3.0, a // 3.0), "mod": (x % 3.0, a % 3.0),
      "neg": (-x, -a), "pow": (x ** 2.0, a ** 2), "abs": (abs(-x), a),
  }
  impl = mtf.PlacementMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols",
                               ["/cpu:%d" % i for i in range(8)])
  lowering = mtf.Lowering(graph, {mesh: impl})
  for name, (t, expected) in results.items():
    np.testing.assert_allclose(lowering.export_to_tf_tensor(t).numpy(), expected,
                               rtol=1e-6, err_msg=name)
  assert (x + y).shape == mtf.Shape([B, H])
  assert (y + x).shape == mtf.Shape([H, B])


def test_operation_rejects_non_tensors_and_mixed_meshes():
  graph = mtf.Graph()
  m1, m2 = mtf.Mesh(graph, "a"), mtf.Mesh(graph, "b")
  x = mtf.zeros(m1, [B])
  y = mtf.zeros(m2, [B])
  with pytest.raises(mtf.ShapeError, match="mixes meshes"):
    mtf.add(x, y)
  with pytest.raises(mtf.ShapeError, match="not an mtf.Tensor"):
    mtf.einsum([x, np.ones(8)])


def test_lowering_is_on_demand():
  """Exporting one tensor does not run unrelated ops (e.g. an assign)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", [H], initializer=tf.zeros_initializer())
  update = mtf.assign(w, w + 1.0)
  impl = mtf.PlacementMeshImpl("", "", [""])
  lowering = mtf.Lowering(graph, {mesh: impl})
  np.testing.assert_allclose(lowering.export_to_tf_tensor(w).numpy(), np.zeros(4))
  lowering.lowered_operation(update)
  lowering2 = mtf.Lowering(graph, {mesh: impl})
  np.testing.assert_allclose(lowering2.export_to_tf_tensor(w).numpy(), np.ones(4))
