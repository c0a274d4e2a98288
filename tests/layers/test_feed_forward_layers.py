"""dense_relu_dense (mesh_tf/layers/feed_forward.py)."""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from layer_testing import check_layer
from mtf_testing import BATCH, HIDDEN, LENGTH, new_mesh, random_array

FF = mtf.Dimension("ff", 16)
X_SHAPE = [BATCH, LENGTH, HIDDEN]


def test_dense_relu_dense_every_layout(mesh_impl):
  def build(x):
    with mtf.variable_scope("block_000/layer_001"):
      return mtf.layers.dense_relu_dense(x, FF, is_training=False, dropout=0.5,
                                         name="DenseReluDense")

  def reference(xs, p):
    prefix = "block_000/layer_001/DenseReluDense/"
    h = tf.nn.relu(tf.einsum("blh,hf->blf", xs[0], p[prefix + "wi/kernel"]))
    return tf.einsum("blf,fh->blh", h, p[prefix + "wo/kernel"])
  _, params = check_layer(mesh_impl, [(random_array(X_SHAPE, 1), X_SHAPE)], build,
                          reference)
  # The names the original Transformer's checkpoints use.
  assert sorted(params) == ["block_000/layer_001/DenseReluDense/wi/kernel",
                            "block_000/layer_001/DenseReluDense/wo/kernel"]


def test_dense_relu_dense_dropout_shares_mask_over_broadcast_dims(make_mesh_impl):
  graph, mesh = new_mesh()
  x_val = np.abs(random_array(X_SHAPE, 2)) + 0.5
  x = mtf.import_tf_tensor(mesh, x_val, X_SHAPE)
  y = mtf.layers.dense_relu_dense(x, FF, is_training=True, dropout=0.5,
                                  dropout_broadcast_dims=[LENGTH])
  assert [v.name for v in graph.all_variables] == ["dense_relu_dense/wi/kernel",
                                                   "dense_relu_dense/wo/kernel"]
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  lowering = mtf.Lowering(graph, {mesh: impl})
  # Identity-like weights make the dropout mask visible in the output.
  impl.variable_store["dense_relu_dense/wi/kernel"].assign_full(
      np.concatenate([np.eye(8), np.zeros([8, 8])], 1).astype(np.float32))
  impl.variable_store["dense_relu_dense/wo/kernel"].assign_full(
      np.concatenate([np.eye(8), np.zeros([8, 8])], 0).astype(np.float32))
  got = lowering.export_to_tf_tensor(y).numpy()
  kept = got != 0
  # One mask per (batch, hidden), the same at every length position.
  np.testing.assert_array_equal(kept, np.broadcast_to(kept[:, :1, :], kept.shape))
  assert 0.2 < kept.mean() < 0.8
  np.testing.assert_allclose(got[kept], (x_val * 2.0)[kept], rtol=1e-5)
