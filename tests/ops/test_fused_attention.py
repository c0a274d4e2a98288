"""Dot-product attention runs as one fused op (ops/fused_attention.py) where its dims
allow, and equals plain TF's einsum-softmax-einsum in output and in the gradients of q,
k, v and a learned bias, whatever the layout splits (split key, memory or length dims are
gathered); with dropout it draws its mask as mtf.dropout does (here, the graph's only
random op, the very mask of the composite) and equals the composite; elsewhere the
composite stays."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.ops import fused_attention
from mesh_tf.ops.fused_attention import AttentionGradOperation, DotProductAttentionOperation
from models.transformer import attention
from mtf_testing import assert_simd_replays_like_one_device

B, L, H, K, V = 2, 4, 4, 4, 2
DIMS = {n: mtf.Dimension(n, s) for n, s in [("batch", B), ("length", L), ("heads", H),
                                           ("memory_length", L), ("d_k", K), ("d_v", V)]}
RNG = np.random.RandomState(0)
Q = RNG.randn(B, L, H, K).astype(np.float32)
KEYS = RNG.randn(B, L, H, K).astype(np.float32)
VALUES = RNG.randn(B, L, H, V).astype(np.float32)
BIAS = RNG.randn(H, L, L).astype(np.float32)  # [heads, length, memory]: a learned bias
WEIGHTS = RNG.randn(B, L, H, V).astype(np.float32)  # loss = sum(out * WEIGHTS)


def _reference():
  q, k, v, bias = (tf.Variable(a) for a in (Q, KEYS, VALUES, BIAS))
  with tf.GradientTape() as tape:
    logits = tf.einsum("blhk,bmhk->blhm", q, k) + tf.transpose(bias, [1, 0, 2])[None]
    out = tf.einsum("blhm,bmhv->blhv", tf.nn.softmax(logits, -1), v)
    loss = tf.reduce_sum(out * WEIGHTS)
  return [out.numpy()] + [g.numpy() for g in tape.gradient(loss, [q, k, v, bias])]


def _variable(mesh, name, value, dims):
  return mtf.get_variable(mesh, name, [DIMS[d] for d in dims],
                          initializer=lambda shape, dtype, **_: tf.constant(value))


def _build(**attention_kwargs):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  q = _variable(mesh, "q", Q, ["batch", "length", "heads", "d_k"])
  k = _variable(mesh, "k", KEYS, ["batch", "memory_length", "heads", "d_k"])
  v = _variable(mesh, "v", VALUES, ["batch", "memory_length", "heads", "d_v"])
  bias = _variable(mesh, "bias", BIAS, ["heads", "length", "memory_length"])
  out = attention.attention(q, k, v, DIMS["memory_length"], DIMS["d_k"], DIMS["d_v"],
                            bias=bias, **attention_kwargs)
  weights = mtf.import_tf_tensor(mesh, tf.constant(WEIGHTS), out.shape)
  grads = mtf.gradients([mtf.reduce_sum(out * weights)], [q, k, v, bias])
  return graph, mesh, [out] + grads


def _fused(graph):
  kinds = {type(op) for op in graph.operations}
  return DotProductAttentionOperation in kinds and AttentionGradOperation in kinds


LAYOUTS = [("placement", "", ""), ("placement", "a:4", "heads:a"),
           ("placement", "a:2;b:2", "batch:a;length:b"),
           ("placement", "a:2", "memory_length:a"), ("simd", "a:2;b:2", "batch:a;heads:b"),
           ("simd", "a:2;b:2", "d_k:a;d_v:b"), ("gspmd", "a:2;b:2", "batch:a;heads:b")]


@pytest.mark.parametrize("backend,mesh_shape,layout", LAYOUTS,
                         ids=["%s-%s" % (b, l or "single") for b, _, l in LAYOUTS])
def test_fused_attention_matches_tf(backend, mesh_shape, layout):
  graph, mesh, tensors = _build()
  assert _fused(graph)
  size = mtf.convert_to_shape(mesh_shape).size
  devices = ["/cpu:%d" % i for i in range(size)] if mesh_shape else [""]
  lowering = mtf.Lowering(graph, {mesh: mtf.make_mesh_impl(backend, mesh_shape, layout,
                                                            devices)})
  labels = ["output", "d q", "d k", "d v", "d bias"]
  for label, t, want in zip(labels, tensors, _reference()):
    np.testing.assert_allclose(lowering.export_to_tf_tensor(t).numpy(), want, rtol=1e-5,
                               atol=1e-5, err_msg=label)


def test_simd_replays_the_fused_attention_without_fallback():
  impls = [mtf.make_mesh_impl("simd", "a:2;b:2", "batch:a;heads:b",
                              ["/cpu:%d" % i for i in range(4)]),
           mtf.make_mesh_impl("simd", "a:2;b:2", "length:a;memory_length:b",
                              ["/cpu:%d" % i for i in range(4)])]
  assert_simd_replays_like_one_device(_build, impls)


@pytest.mark.parametrize("kwargs", [{"extra_logit": 0.0}, {"z_loss_coeff": 1e-4}],
                         ids=["extra_logit", "z_loss"])
def test_what_the_fused_op_does_not_do_keeps_the_composite(kwargs):
  context = _TrainContext()
  graph, _, _ = _build(context=context, **kwargs)
  assert not any(isinstance(op, DotProductAttentionOperation) for op in graph.operations)


class _TrainContext:
  """What attention() reads of a Transformer layer's Context: training, with losses."""
  train = True
  mode = "train"
  losses = []
  model = None


DROPOUT_LAYOUTS = [("placement", "", ""), ("placement", "a:2;b:2", "batch:a;heads:b"),
                   ("placement", "a:2", "memory_length:a"),
                   ("simd", "a:2;b:2", "length:a;heads:b")]


@pytest.mark.parametrize("backend,mesh_shape,layout", DROPOUT_LAYOUTS,
                         ids=["%s-%s" % (b, l or "single") for b, _, l in DROPOUT_LAYOUTS])
def test_fused_dropout_equals_the_composite_with_its_mask(backend, mesh_shape, layout,
                                                          monkeypatch):
  kwargs = {"dropout_rate": 0.5, "dropout_broadcast_dims": [DIMS["heads"]]}
  fused_graph, fused_mesh, fused = _build(**kwargs)
  assert _fused(fused_graph)
  with monkeypatch.context() as patch:
    patch.setattr(fused_attention, "dot_product_attention", lambda *a, **k: None)
    composite_graph, composite_mesh, composite = _build(**kwargs)
  assert not _fused(composite_graph)
  size = mtf.convert_to_shape(mesh_shape).size
  devices = ["/cpu:%d" % i for i in range(size)] if mesh_shape else [""]
  got = mtf.Lowering(fused_graph, {fused_mesh: mtf.make_mesh_impl(
      backend, mesh_shape, layout, devices)})
  want = mtf.Lowering(composite_graph, {composite_mesh: mtf.make_mesh_impl(
      "placement", "", "", [""])})
  labels = ["output", "d q", "d k", "d v", "d bias"]
  for label, g, w in zip(labels, fused, composite):
    np.testing.assert_allclose(got.export_to_tf_tensor(g).numpy(),
                               want.export_to_tf_tensor(w).numpy(), rtol=1e-5, atol=1e-5,
                               err_msg=label)
  # the dropout is in effect: without it the output is plain TF's, here it is not
  assert not np.allclose(got.export_to_tf_tensor(fused[0]).numpy(), _reference()[0],
                         atol=1e-3)


def test_layers_dot_product_attention_fuses_heads_major_and_multi_query():
  """mtf.layers.dot_product_attention ([batch, heads, length, kv]) fuses, also where k and
  v have no heads dim (multi-query attention), and equals plain TF."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  b, h, l, m, kv, vc = (mtf.Dimension(n, s) for n, s in [
      ("batch", B), ("heads", H), ("length", L), ("memory", L), ("kv", K), ("vc", V)])
  q = mtf.import_tf_tensor(mesh, tf.constant(Q.transpose(0, 2, 1, 3)), [b, h, l, kv])
  k = mtf.import_tf_tensor(mesh, tf.constant(KEYS[:, :, 0]), [b, m, kv])
  v = mtf.import_tf_tensor(mesh, tf.constant(VALUES[:, :, 0]), [b, m, vc])
  mask = mtf.import_tf_tensor(mesh, tf.constant(BIAS[0]), [l, m])
  out = mtf.layers.dot_product_attention(q, k, v, mask)
  assert any(isinstance(op, DotProductAttentionOperation) for op in graph.operations)
  assert out.shape.dimension_names == ["batch", "heads", "length", "vc"]
  impl = mtf.make_mesh_impl("placement", "a:2", "heads:a", ["/cpu:0", "/cpu:1"])
  got = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(out).numpy()
  logits = np.einsum("bhlk,bmk->bhlm", Q.transpose(0, 2, 1, 3), KEYS[:, :, 0]) + BIAS[0]
  want = np.einsum("bhlm,bmv->bhlv", tf.nn.softmax(logits, -1).numpy(), VALUES[:, :, 0])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_layers_dot_product_attention_with_dropout_fuses_and_equals_the_composite(
    monkeypatch):
  def build():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    b, h, l, m, kv = (mtf.Dimension(n, s) for n, s in [
        ("batch", B), ("heads", H), ("length", L), ("memory", L), ("kv", K)])
    q = mtf.import_tf_tensor(mesh, tf.constant(Q.transpose(0, 2, 1, 3)), [b, h, l, kv])
    k = mtf.import_tf_tensor(mesh, tf.constant(KEYS.transpose(0, 2, 1, 3)), [b, h, m, kv])
    v = mtf.import_tf_tensor(mesh, tf.constant(KEYS.transpose(0, 2, 1, 3)), [b, h, m, kv])
    out = mtf.layers.dot_product_attention(q, k, v, None, is_training=True, dropout=0.3,
                                           dropout_broadcast_dims=[l])
    return graph, mesh, out
  graph, mesh, out = build()
  assert any(isinstance(op, DotProductAttentionOperation) for op in graph.operations)
  impl = mtf.make_mesh_impl("placement", "a:2", "heads:a", ["/cpu:0", "/cpu:1"])
  got = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(out).numpy()
  monkeypatch.setattr(fused_attention, "dot_product_attention", lambda *a, **k: None)
  graph, mesh, out = build()
  assert not any(isinstance(op, DotProductAttentionOperation) for op in graph.operations)
  want = mtf.Lowering(graph, {mesh: mtf.make_mesh_impl("placement", "", "", [""])}
                      ).export_to_tf_tensor(out).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_keys_with_a_dim_of_their_own_keep_the_composite():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  b, l, m, kv, extra = (mtf.Dimension(n, s) for n, s in [("batch", B), ("length", L),
                                                          ("memory", L), ("kv", K),
                                                          ("extra", 2)])
  q = mtf.zeros(mesh, [b, l, kv])
  k = mtf.zeros(mesh, [b, extra, m, kv])
  v = mtf.zeros(mesh, [b, extra, m, kv])
  mtf.layers.dot_product_attention(q, k, v, None)
  assert not any(isinstance(op, DotProductAttentionOperation) for op in graph.operations)


def test_attention_without_batch_dims_replays_on_simd():
  """No dim shared by q, k and v: the slices' matmuls are 2-D (MatMul), which the SIMD
  replay runs as one batch matmul over the mesh axes."""
  def build():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    l, m, kv, vc = (mtf.Dimension(n, s) for n, s in [("length", L), ("memory", L),
                                                     ("kv", K), ("vc", V)])
    q = mtf.import_tf_tensor(mesh, tf.constant(Q[0, :, 0]), [l, kv])
    k = mtf.import_tf_tensor(mesh, tf.constant(KEYS[0, :, 0]), [m, kv])
    v = mtf.import_tf_tensor(mesh, tf.constant(VALUES[0, :, 0]), [m, vc])
    out = mtf.layers.dot_product_attention(q, k, v, None)
    assert any(isinstance(op, DotProductAttentionOperation) for op in graph.operations)
    return graph, mesh, [out]
  assert_simd_replays_like_one_device(build, [mtf.make_mesh_impl(
      "simd", "a:2", "length:a", ["/cpu:0", "/cpu:1"])])
