"""Local attention and halo exchange (mesh_tf/layers/local_attention.py)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from layer_testing import check_layer
from mtf_testing import BATCH, HIDDEN, new_mesh, random_array

HEADS = mtf.Dimension("heads", 4)
KV = mtf.Dimension("kv", 4)
LONG = mtf.Dimension("length", 16)
X_SHAPE = [BATCH, LONG, HIDDEN]
# (mesh, layout, window_size, length_per_split): one block; blocks split over a mesh
# axis (halo via neighbour exchange); a halo wider than a block (two shifts).
LOCAL_CASES = [("", "", 4, None),
               ("rows:2;cols:4", "batch:rows;length:cols", 3, 4),
               ("all:8", "hidden:all", 6, 4)]
LOCAL_IDS = ["single/w4", "2x4/length:cols/w3", "8/hidden:all/w6"]


def _tf_local_attention(x, w, window):
  """Each position sees itself and window-1 earlier positions; earlier than the start
  are zero keys and values (logit 0), as in the original."""
  q = tf.einsum("blh,nhk->bnlk", x, w[0])
  k = tf.pad(tf.einsum("blh,nhk->bnlk", x, w[1]), [[0, 0], [0, 0], [window, 0], [0, 0]])
  v = tf.pad(tf.einsum("blh,nhk->bnlk", x, w[2]), [[0, 0], [0, 0], [window, 0], [0, 0]])
  length = x.shape[1]
  i = np.arange(length)[:, None]
  p = np.arange(length + window)[None, :]
  mask = np.where((p > i) & (p <= i + window), 0.0, -1e9).astype(np.float32)
  weights = tf.nn.softmax(tf.einsum("bnlk,bnmk->bnlm", q, k) + mask, axis=-1)
  return tf.einsum("bnlm,bnmk,nhk->blh", weights, v, w[3])


@pytest.mark.parametrize("mesh_shape,layout,window,per_split", LOCAL_CASES, ids=LOCAL_IDS)
def test_masked_local_attention_1d(make_mesh_impl, mesh_shape, layout, window,
                                   per_split):
  def build(x):
    return mtf.layers.masked_local_attention_1d(x, KV, HEADS, False, window_size=window,
                                                length_per_split=per_split)

  def reference(xs, p):
    return _tf_local_attention(xs[0], p["multihead_attention/qkvo"], window)
  check_layer(make_mesh_impl(mesh_shape, layout), [(random_array(X_SHAPE, 1), X_SHAPE)],
              build, reference, rtol=1e-4, atol=1e-5)


def test_masked_local_attention_1d_incremental_matches_full(make_mesh_impl):
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  window = 3
  x_val = random_array(X_SHAPE, 2)
  graph, mesh = new_mesh()
  y = mtf.layers.masked_local_attention_1d(mtf.import_tf_tensor(mesh, x_val, X_SHAPE), KV,
                                           HEADS, False, window_size=window,
                                           length_per_split=4)
  full = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(y).numpy()
  cache_shape = [BATCH, HEADS, mtf.Dimension("window_length", window), KV]
  k_val = v_val = np.zeros([8, 4, window, 4], np.float32)
  for t in range(7):
    graph, mesh = new_mesh()
    y, k, v = mtf.layers.masked_local_attention_1d_incremental(
        mtf.import_tf_tensor(mesh, x_val[:, t, :], [BATCH, HIDDEN]),
        mtf.import_tf_tensor(mesh, k_val, cache_shape),
        mtf.import_tf_tensor(mesh, v_val, cache_shape),
        mtf.constant(mesh, t, dtype=tf.int32))
    lowering = mtf.Lowering(graph, {mesh: impl})
    y_val, k_val, v_val = [lowering.export_to_tf_tensor(a).numpy() for a in (y, k, v)]
    np.testing.assert_allclose(y_val, full[:, t, :], rtol=1e-4, atol=1e-5,
                               err_msg="step %d" % t)


def test_return_kv_and_given_params(make_mesh_impl):
  impl = make_mesh_impl("all:8", "batch:all")
  graph, mesh = new_mesh()
  x_val = random_array(X_SHAPE, 3)
  x = mtf.import_tf_tensor(mesh, x_val, X_SHAPE)
  qkvo = mtf.Dimension("qkvo", 4)
  w_val = random_array([qkvo, HEADS, HIDDEN, KV], 4, -0.5, 0.5)
  params = mtf.unstack(mtf.import_tf_tensor(mesh, w_val, [qkvo, HEADS, HIDDEN, KV]), qkvo)
  kv = []
  y = mtf.layers.masked_local_attention_1d(x, KV, HEADS, False, window_size=4,
                                           return_kv=kv, params=params)
  assert graph.all_variables == [] and len(kv) == 2
  lowering = mtf.Lowering(graph, {mesh: impl})
  np.testing.assert_allclose(lowering.export_to_tf_tensor(y).numpy(),
                             _tf_local_attention(x_val, w_val, 4).numpy(), rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(kv[0]).numpy(),
                             np.einsum("blh,nhk->bnlk", x_val, w_val[1]), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("mask_right", [True, False])
@pytest.mark.parametrize("with_blocks", [True, False])
def test_local_1d_halo_exchange(make_mesh_impl, mask_right, with_blocks):
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;length:cols")
  blocks = mtf.Dimension("length", 4)
  w_dim = mtf.Dimension("w", 3)
  shape = [BATCH, blocks, w_dim, HIDDEN]
  k_val, v_val = random_array(shape, 5), random_array(shape, 6)
  graph, mesh = new_mesh()
  k, v = mtf.layers.local_1d_halo_exchange(
      mtf.import_tf_tensor(mesh, k_val, shape), mtf.import_tf_tensor(mesh, v_val, shape),
      blocks if with_blocks else None, w_dim, mask_right)
  lowering = mtf.Lowering(graph, {mesh: impl})

  def expected(a):
    zero = np.zeros_like(a[:, :1])
    prev = np.concatenate([zero, a[:, :-1]], 1) if with_blocks else np.zeros_like(a)
    nxt = np.concatenate([a[:, 1:], zero], 1) if with_blocks else np.zeros_like(a)
    parts = [prev, a] if mask_right else [prev, a, nxt]
    return np.concatenate(parts, axis=2)
  for name, t, a in (("k", k, k_val), ("v", v, v_val)):
    assert t.shape.dims[2].size == (6 if mask_right else 9)
    np.testing.assert_array_equal(lowering.export_to_tf_tensor(t).numpy(), expected(a),
                                  err_msg=name)


def test_attention_bias_local_block():
  graph, mesh = new_mesh()
  block = mtf.Dimension("block_length", 3)
  bias = mtf.layers.attention_bias_local_block(mesh, block,
                                               mtf.Dimension("memory_length", 99))
  assert bias.shape == mtf.Shape([block, mtf.Dimension("memory_length", 6)])
  got = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", ["/cpu:0"])
                            }).export_to_tf_tensor(bias).numpy()
  future = np.arange(3)[None, :] > np.arange(3)[:, None]
  expected = np.concatenate([np.zeros([3, 3]), np.where(future, -1e9, 0.0)], axis=1)
  np.testing.assert_array_equal(got, expected.astype(np.float32))


def _tf_spatial_blocks(x, w, mask_right):
  """Reference on the flattened length: a query in block b sees blocks b-1 and b (and
  b+1 unless mask_right; nothing after itself if mask_right); zeros beyond the ends."""
  batch, blocks, width, io = x.shape
  flat = tf.reshape(x, [batch, blocks * width, io])
  after = 0 if mask_right else width
  q = tf.einsum("blh,nhk->bnlk", flat, w[0])
  pad = [[0, 0], [0, 0], [width, after], [0, 0]]
  k = tf.pad(tf.einsum("blh,nhk->bnlk", flat, w[1]), pad)
  v = tf.pad(tf.einsum("blh,nhk->bnlk", flat, w[2]), pad)
  i = np.arange(blocks * width)[:, None]
  p = np.arange(blocks * width + width + after)[None, :]
  start = (i // width) * width  # padded index of the previous block's first position
  visible = (p >= start) & (p <= i + width if mask_right else p < start + 3 * width)
  mask = np.where(visible, 0.0, -1e9).astype(np.float32)
  weights = tf.nn.softmax(tf.einsum("bnlk,bnmk->bnlm", q, k) + mask, axis=-1)
  out = tf.einsum("bnlm,bnmk,nhk->blh", weights, v, w[3])
  return tf.reshape(out, x.shape)


@pytest.mark.parametrize("mask_right", [True, False])
def test_local_self_attention_spatial_blocks(make_mesh_impl, mask_right):
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;num_blocks:cols")
  shape = [BATCH, mtf.Dimension("num_blocks", 4), mtf.Dimension("w", 3), HIDDEN]

  def build(x):
    # The original's positional order: (..., heads, is_training, memory_w_dim, mask_right)
    return mtf.layers.local_self_attention_spatial_blocks(x, KV, HEADS, False, None,
                                                          mask_right)

  def reference(xs, p):
    return _tf_spatial_blocks(xs[0], p["multihead_attention/qkvo"], mask_right)
  check_layer(impl, [(random_array(shape, 12), shape)], build, reference, rtol=1e-4,
              atol=1e-5)
