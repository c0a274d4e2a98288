"""A checkpoint saved on mesh [2,4] restores on mesh [] and [8] with other layouts."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf

CPUS = ["/cpu:%d" % i for i in range(8)]
RNG = np.random.RandomState(0)
IMAGES = RNG.randn(8, 4, 4).astype(np.float32)
LABELS = RNG.randint(0, 4, size=8).astype(np.int32)


def _mlp():
  """2-layer MLP graph: (mesh, loss, update ops) with the data imported as constants."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  batch, rows, cols = (mtf.Dimension("batch", 8), mtf.Dimension("rows", 4),
                       mtf.Dimension("cols", 4))
  hidden, classes = mtf.Dimension("hidden", 16), mtf.Dimension("classes", 4)
  x = mtf.import_tf_tensor(mesh, tf.constant(IMAGES), [batch, rows, cols])
  labels = mtf.import_tf_tensor(mesh, tf.constant(LABELS), [batch])
  w1 = mtf.get_variable(mesh, "w1", [rows, cols, hidden])
  w2 = mtf.get_variable(mesh, "w2", [hidden, classes])
  h = mtf.relu(mtf.einsum([x, w1], output_shape=[batch, hidden]))
  logits = mtf.einsum([h, w2], output_shape=[batch, classes])
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(labels, classes), classes))
  g1, g2 = mtf.gradients([loss], [w1, w2])
  updates = [mtf.assign(w1, w1 - g1 * 0.5), mtf.assign(w2, w2 - g2 * 0.5)]
  return graph, mesh, loss, updates


def _values(impl):
  return {name: v.read_full().numpy() for name, v in impl.variable_store.items()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """Trains 2 SGD steps on mesh rows:2;cols:4 and saves; returns (prefix, values, loss)."""
  graph, mesh, loss, updates = _mlp()
  impl = mtf.PlacementMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols", CPUS)
  for _ in range(2):
    lowering = mtf.Lowering(graph, {mesh: impl})
    for op in updates:
      lowering.lowered_operation(op)
  lowering = mtf.Lowering(graph, {mesh: impl})
  final_loss = lowering.export_to_tf_tensor(loss).numpy()
  prefix = mtf.save_checkpoint(str(tmp_path_factory.mktemp("mlp")), lowering,
                               global_step=2)
  return prefix, _values(impl), final_loss


@pytest.mark.parametrize("mesh_shape,layout,devices", [
    ("", "", [""]),
    ("all:8", "hidden:all", CPUS),
    ("all:8", "batch:all", CPUS),
    ("a:4;b:2", "hidden:a;classes:b", CPUS[:8]),
], ids=["mesh=[]", "mesh=8/hidden:all", "mesh=8/batch:all", "mesh=4x2/hidden:a,classes:b"])
def test_restores_on_other_mesh_and_layout(trained, mesh_shape, layout, devices):
  prefix, saved, saved_loss = trained
  graph, mesh, loss, _ = _mlp()
  impl = mtf.PlacementMeshImpl(mesh_shape, layout, devices)
  lowering = mtf.Lowering(graph, {mesh: impl})
  fresh = _values(impl)
  assert not np.allclose(fresh["w1"], saved["w1"])  # training moved them
  result = mtf.restore_checkpoint(prefix, lowering)
  assert result.names == ["w1", "w2"] and result.global_step == 2
  for name, value in _values(impl).items():
    np.testing.assert_array_equal(value, saved[name])
  restored_loss = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(loss).numpy()
  np.testing.assert_allclose(restored_loss, saved_loss, rtol=1e-6, atol=1e-6)
