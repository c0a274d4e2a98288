"""Multi-head attention of mtf.layers (mesh_tf/layers/attention.py)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from layer_testing import check_layer
from mtf_testing import BATCH, HIDDEN, LENGTH, new_mesh, random_array, random_ints

HEADS = mtf.Dimension("heads", 4)
KV = mtf.Dimension("kv", 4)
MEMORY = mtf.Dimension("memory_length", 5)
X_SHAPE = [BATCH, LENGTH, HIDDEN]
M_SHAPE = [BATCH, MEMORY, HIDDEN]
# Attention splits heads too (model parallelism over heads).
ATTENTION_CASES = [("", ""), ("rows:2;cols:4", "batch:rows;heads:cols"),
                   ("all:8", "hidden:all")]
ATTENTION_IDS = ["single", "2x4/batch:rows;heads:cols", "8/hidden:all"]
QKVO = "multihead_attention/qkvo"
W_VALUE = random_array([mtf.Dimension("qkvo", 4), HEADS, HIDDEN, KV], 6)


def _tf_attention(x, memory, w, mask=None, extra_logit=None):
  """Reference: w is [4, heads, io, kv]; mask broadcasts to [batch, heads, l, m]."""
  q = tf.einsum("blh,nhk->bnlk", x, w[0])
  k = tf.einsum("bmh,nhk->bnmk", memory, w[1])
  v = tf.einsum("bmh,nhk->bnmk", memory, w[2])
  logits = tf.einsum("bnlk,bnmk->bnlm", q, k)
  if mask is not None:
    logits += mask
  if extra_logit is None:
    weights = tf.nn.softmax(logits, axis=-1)
  else:
    extra = tf.fill(tf.concat([tf.shape(logits)[:-1], [1]], 0), extra_logit)
    weights = tf.nn.softmax(tf.concat([logits, extra], -1), axis=-1)[..., :-1]
  o = tf.einsum("bnlm,bnmk->bnlk", weights, v)
  return tf.einsum("bnlk,nhk->blh", o, w[3])


def _causal(n):
  return np.where(np.arange(n)[None, :] > np.arange(n)[:, None], -1e9, 0).astype(
      np.float32)


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=ATTENTION_IDS)
def test_self_attention_with_autoregressive_mask(make_mesh_impl, case):
  def build(x):
    mask = mtf.layers.attention_mask_autoregressive(
        mtf.range(x.mesh, LENGTH, tf.int32))
    return mtf.layers.multihead_attention(x, None, mask, KV, HEADS, is_training=False)

  def reference(xs, p):
    return _tf_attention(xs[0], xs[0], p[QKVO], mask=_causal(3))
  _, params = check_layer(make_mesh_impl(*case), [(random_array(X_SHAPE, 1), X_SHAPE)],
                          build, reference, rtol=1e-4, atol=1e-5)
  assert list(params) == [QKVO]
  # Initial stddevs of q, k, v, o as in the original.
  w = params[QKVO]
  for i, expected in enumerate([8 ** -0.5 * 4 ** -0.25] * 2 + [8 ** -0.5,
                                                               (8 * 4) ** -0.5]):
    assert 0.5 * expected < w[i].std() < 1.6 * expected


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=ATTENTION_IDS)
def test_encoder_decoder_attention_ignores_padding(make_mesh_impl, case):
  memory_ids = random_ints([BATCH, mtf.Dimension("length", 5)], 2, 0, 3)

  def build(x, memory, ids):
    mask = mtf.layers.attention_mask_ignore_padding(ids)
    return mtf.layers.multihead_attention(x, memory, mask, KV, HEADS, is_training=False,
                                          name="encdec")

  def reference(xs, p):
    mask = np.where(memory_ids == 0, -1e9, 0).astype(np.float32)[:, None, None, :]
    return _tf_attention(xs[0], xs[1], p["encdec/qkvo"], mask=mask)
  check_layer(make_mesh_impl(*case),
              [(random_array(X_SHAPE, 3), X_SHAPE), (random_array(M_SHAPE, 4), M_SHAPE),
               (memory_ids, [BATCH, mtf.Dimension("length", 5)])],
              build, reference, rtol=1e-4, atol=1e-5)


def test_attention_dropout_is_layout_independent(make_mesh_impl):
  outputs = []
  x_val = random_array(X_SHAPE, 5)
  for case in ATTENTION_CASES:
    graph, mesh = new_mesh()
    x = mtf.import_tf_tensor(mesh, x_val, X_SHAPE)
    y = mtf.layers.multihead_attention(x, None, None, KV, HEADS, is_training=True,
                                       dropout=0.5, dropout_broadcast_dims=[BATCH])
    impl = make_mesh_impl(*case)
    lowering = mtf.Lowering(graph, {mesh: impl})
    impl.variable_store[QKVO].assign_full(W_VALUE)
    outputs.append(lowering.export_to_tf_tensor(y).numpy())
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_val, X_SHAPE)
  no_dropout = mtf.layers.multihead_attention(x, None, None, KV, HEADS, False, dropout=0.5)
  impl = make_mesh_impl()
  lowering = mtf.Lowering(graph, {mesh: impl})
  impl.variable_store[QKVO].assign_full(W_VALUE)
  plain = lowering.export_to_tf_tensor(no_dropout).numpy()
  for other in outputs[1:]:
    np.testing.assert_allclose(other, outputs[0], rtol=1e-4, atol=1e-5)
  assert not np.allclose(outputs[0], plain, atol=1e-3)


def _lower_full_then(impl, build_full, build_steps):
  """Lowers a full-sequence graph, then a step graph reusing its variables by name."""
  graph, mesh = new_mesh()
  full = build_full(mesh)
  full_value = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(full).numpy()
  graph, mesh = new_mesh()
  steps = build_steps(mesh)
  lowering = mtf.Lowering(graph, {mesh: impl})
  return full_value, [lowering.export_to_tf_tensor(y).numpy() for y in steps]


def _causal_full_attention(impl, x_val):
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_val, X_SHAPE)
  mask = mtf.layers.attention_mask_autoregressive(mtf.range(mesh, LENGTH, tf.int32))
  y = mtf.layers.multihead_attention(x, None, mask, KV, HEADS, False)
  return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(y).numpy()


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=ATTENTION_IDS)
def test_self_attention_incremental_matches_full_decoding(make_mesh_impl, case):
  """Each step is its own graph (variables are found by name on the MeshImpl); the
  key/value caches are carried from step to step."""
  impl = make_mesh_impl(*case)
  x_val = random_array(X_SHAPE, 7)
  full = _causal_full_attention(impl, x_val)
  cache_shape = [BATCH, HEADS, mtf.Dimension("memory_length", 3), KV]
  k_val = v_val = np.zeros([8, 4, 3, 4], np.float32)
  for t in range(3):
    graph, mesh = new_mesh()
    x = mtf.import_tf_tensor(mesh, x_val[:, t, :], [BATCH, HIDDEN])
    y, k, v = mtf.layers.multihead_self_attention_incremental(
        x, mtf.import_tf_tensor(mesh, k_val, cache_shape),
        mtf.import_tf_tensor(mesh, v_val, cache_shape),
        mtf.constant(mesh, t, dtype=tf.int32))
    lowering = mtf.Lowering(graph, {mesh: impl})
    y_val, k_val, v_val = [lowering.export_to_tf_tensor(a).numpy() for a in (y, k, v)]
    np.testing.assert_allclose(y_val, full[:, t, :], rtol=1e-4, atol=1e-5,
                               err_msg="decoding step %d" % t)
    assert not np.any(k_val[:, :, t + 1:, :]), "cache filled beyond step %d" % t


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=ATTENTION_IDS)
def test_encdec_attention_incremental_matches_full(make_mesh_impl, case):
  x_val, m_val = random_array(X_SHAPE, 8), random_array(M_SHAPE, 9)

  def build_full(mesh):
    x = mtf.import_tf_tensor(mesh, x_val, X_SHAPE)
    memory = mtf.import_tf_tensor(mesh, m_val, M_SHAPE)
    return mtf.layers.multihead_attention(x, memory, None, KV, HEADS, False)

  def build_steps(mesh):
    memory = mtf.import_tf_tensor(mesh, m_val, M_SHAPE)
    with mtf.variable_scope("multihead_attention"):
      wq, wk, wv, wo = mtf.layers.multihead_attention_vars(
          mesh, HEADS, HIDDEN, KV, tf.float32, tf.float32, tf.float32)
    k = mtf.einsum([memory, wk], [BATCH, HEADS, MEMORY, KV])
    v = mtf.einsum([memory, wv], [BATCH, HEADS, MEMORY, KV])
    return [mtf.layers.multihead_encdec_attention_incremental(
        mtf.import_tf_tensor(mesh, x_val[:, t, :], [BATCH, HIDDEN]), wq, wo, k, v, None)
            for t in range(3)]
  full, steps = _lower_full_then(make_mesh_impl(*case), build_full, build_steps)
  for t, y in enumerate(steps):
    np.testing.assert_allclose(y, full[:, t, :], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_right", [True, False])
@pytest.mark.parametrize("case", ATTENTION_CASES[:2], ids=ATTENTION_IDS[:2])
def test_memory_compressed_attention(make_mesh_impl, case, mask_right):
  length = mtf.Dimension("length", 4)
  shape = [BATCH, length, HIDDEN]

  def build(x):
    return mtf.layers.multihead_self_attention_memory_compressed(
        x, mask_right, 2, KV, HEADS, is_training=False, name="mc")

  def reference(xs, p):
    memory = tf.reduce_mean(tf.reshape(xs[0], [8, 2, 2, 8]), axis=2)
    mask = None
    if mask_right:
      block_end = np.arange(2) * 2 + 1
      mask = np.where(block_end[None, :] > np.arange(4)[:, None], -1e9, 0).astype(
          np.float32)
    return _tf_attention(xs[0], memory, p["mc/qkvo"], mask=mask, extra_logit=0.0)
  got, _ = check_layer(make_mesh_impl(*case), [(random_array(shape, 10), shape)], build,
                       reference, rtol=1e-4, atol=1e-5)
  if mask_right:  # position 0 sees no complete block: the extra logit takes everything.
    np.testing.assert_allclose(got[0][:, 0, :], 0.0, atol=1e-6)


def test_compress_mean_and_rename(make_mesh_impl):
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  length = mtf.Dimension("length", 6)
  graph, mesh = new_mesh()
  x_val = random_array([BATCH, length, HIDDEN], 11)
  x = mtf.import_tf_tensor(mesh, x_val, [BATCH, length, HIDDEN])
  y = mtf.layers.compress_mean(x, length, 3)
  renamed = mtf.layers.rename_length_to_memory_length(y)
  assert y.shape == mtf.Shape([BATCH, mtf.Dimension("length", 2), HIDDEN])
  assert renamed.shape.dimension_names == ["batch", "memory_length", "hidden"]
  got = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(renamed).numpy()
  np.testing.assert_allclose(got, x_val.reshape(8, 2, 3, 8).mean(axis=2), rtol=1e-5)


def test_multihead_attention_params_separate_variables():
  graph, mesh = new_mesh()
  ws = mtf.layers.multihead_attention_params(mesh, HEADS, HIDDEN, KV,
                                             mtf.VariableDType(tf.float32), combine=False)
  assert [v.name for v in graph.all_variables] == ["q", "k", "v", "o"]
  assert all(w.shape == mtf.Shape([HEADS, HIDDEN, KV]) for w in ws)
  impl = mtf.PlacementMeshImpl("", "", ["/cpu:0"])
  mtf.Lowering(graph, {mesh: impl})
  assert 0.2 < impl.variable_store["v"].read_full().numpy().std() * np.sqrt(8) < 1.6
