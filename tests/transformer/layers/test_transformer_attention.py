"""models/transformer/attention.py and relative_position.py against plain TF / numpy.

attention() and local_attention_1d() run on the shared mesh/layout cases (forward and
gradient through tests/mtf_testing.check_against_tf); local attention also with its
length dim split over the mesh.
"""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import attention
from models.transformer import relative_position
from mtf_testing import check_against_tf

BATCH = mtf.Dimension("batch", 8)
HEADS = mtf.Dimension("hidden", 8)  # "hidden": the dim the shared layouts split
LENGTH = mtf.Dimension("length", 3)
MEMORY = mtf.Dimension("memory_length", 5)
KEY = mtf.Dimension("d_k", 4)
VALUE = mtf.Dimension("d_v", 2)


def _normal(shape, seed):
  sizes = mtf.convert_to_shape(shape).to_integer_list
  return np.random.RandomState(seed).normal(size=sizes).astype(np.float32)


def test_attention_matches_tf_on_every_layout(mesh_impl):
  q_shape = [BATCH, HEADS, LENGTH, KEY]
  k_shape = [BATCH, HEADS, MEMORY, KEY]
  v_shape = [BATCH, HEADS, MEMORY, VALUE]
  visible = np.random.RandomState(3).rand(LENGTH.size, MEMORY.size) > 0.3
  visible[:, 0] = True
  bias = np.where(visible, 0.0, -1e9).astype(np.float32)

  def mtf_fn(q, k, v, b):
    return attention.attention(q, k, v, MEMORY, KEY, VALUE, bias=b)

  def tf_fn(q, k, v, b):
    logits = tf.einsum("bhlk,bhmk->bhlm", q, k) + b
    return tf.einsum("bhlm,bhmv->bhlv", tf.nn.softmax(logits), v)

  check_against_tf(mesh_impl, [(_normal(q_shape, 0), q_shape), (_normal(k_shape, 1), k_shape),
                               (_normal(v_shape, 2), v_shape), (bias, [LENGTH, MEMORY])],
                   mtf_fn, tf_fn, rtol=2e-5, atol=2e-5)


def test_attention_extra_logit_and_bfloat16_inputs_with_float32_logits(make_mesh_impl):
  shape = [BATCH, HEADS, LENGTH, KEY]
  memory_shape = [BATCH, HEADS, MEMORY, KEY]
  q, k = _normal(shape, 4), _normal(memory_shape, 5)
  v = _normal([BATCH, HEADS, MEMORY, VALUE], 6)

  def mtf_fn(q, k, v):
    out = attention.attention(mtf.cast(q, tf.bfloat16), mtf.cast(k, tf.bfloat16), v, MEMORY,
                              KEY, VALUE, extra_logit=0.0)
    return out

  def tf_fn(q, k, v):
    rounded = lambda t: tf.cast(tf.cast(t, tf.bfloat16), tf.float32)
    logits = tf.einsum("bhlk,bhmk->bhlm", rounded(q), rounded(k))
    logits = tf.concat([logits, tf.zeros_like(logits[..., :1])], -1)
    weights = tf.nn.softmax(logits)[..., :-1]
    return tf.einsum("bhlm,bhmv->bhlv", weights, v)

  check_against_tf(make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols"),
                   [(q, shape), (k, memory_shape), (v, [BATCH, HEADS, MEMORY, VALUE])],
                   mtf_fn, tf_fn, grad=False, rtol=1e-4, atol=1e-4)


def test_attention_missing_dim_is_named():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  q = mtf.zeros(mesh, [BATCH, LENGTH, KEY])
  k = mtf.zeros(mesh, [BATCH, MEMORY, VALUE])
  with pytest.raises(mtf.ShapeError, match="lacks dim d_k"):
    attention.attention(q, k, k, MEMORY, KEY, VALUE)


def test_visibility_mask_to_attention_bias():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  visible = np.array([[True, False, True]])
  dims = [mtf.Dimension("a", 1), mtf.Dimension("b", 3)]
  bias = attention.visibility_mask_to_attention_bias(
      mtf.import_tf_tensor(mesh, visible, dims), tf.float32)
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", [""])})
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(bias).numpy(),
                                [[0.0, -1e9, 0.0]])


# -------------------------------------------------------------- local_attention_1d

LOCAL_LENGTH = mtf.Dimension("length", 16)


@pytest.mark.parametrize("mesh_shape,layout,splits,causal,radius", [
    ("", "", 1, True, 3),
    ("all:8", "length:all", 8, True, 3),  # blocks of 2, a halo wider than a block
    ("rows:2;cols:4", "length:cols;batch:rows", 4, False, 2),
    ("rows:2;cols:4", "length:rows", 2, True, 5),
], ids=["single", "split8_causal", "split4_bidirectional", "split2_causal"])
def test_local_attention_1d_matches_windowed_tf(make_mesh_impl, mesh_shape, layout, splits,
                                               causal, radius):
  batch = mtf.Dimension("batch", 2)
  q_shape = [batch, HEADS, LOCAL_LENGTH, KEY]
  v_shape = [batch, HEADS, LOCAL_LENGTH, VALUE]
  i = np.arange(LOCAL_LENGTH.size)
  rel = i[None, :] - i[:, None]
  mask = (rel > -radius) & (rel <= radius)  # (p - radius, p + radius], as the original
  if causal:
    mask &= rel <= 0

  def mtf_fn(q, k, v):
    return attention.local_attention_1d(q, k, v, LOCAL_LENGTH, KEY, VALUE,
                                        fully_autoregressive=causal,
                                        length_dim_num_splits=splits, radius=radius)

  def tf_fn(q, k, v):
    logits = tf.einsum("bhlk,bhmk->bhlm", q, k) + np.where(mask, 0.0, -1e9)
    return tf.einsum("bhlm,bhmv->bhlv", tf.nn.softmax(logits), v)

  check_against_tf(make_mesh_impl(mesh_shape, layout),
                   [(_normal(q_shape, 7), q_shape), (_normal(q_shape, 8), q_shape),
                    (_normal(v_shape, 9), v_shape)], mtf_fn, tf_fn, rtol=2e-5, atol=2e-5)


def test_local_attention_1d_bad_splits_is_named():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  q = mtf.zeros(mesh, [LOCAL_LENGTH, KEY])
  with pytest.raises(mtf.ShapeError, match="3 splits do not divide length"):
    attention.local_attention_1d(q, q, q, LOCAL_LENGTH, KEY, KEY, length_dim_num_splits=3)


# -------------------------------------------------------------------- AttentionParams

D_MODEL = mtf.Dimension("d_model", 6)


def _params(**kwargs):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  heads, d_kv = mtf.Dimension("heads", 2), mtf.Dimension("d_kv", 3)
  args = dict(query_input_dim=D_MODEL, memory_input_dim=D_MODEL, output_dim=D_MODEL,
              key_dim=d_kv, value_dim=d_kv, query_heads_dims=[heads],
              memory_heads_dims=[heads], variable_dtype=mtf.VariableDType())
  args.update(kwargs)
  return graph, mesh, attention.AttentionParams(mesh, **args)


def test_attention_params_combined_variables_and_projection():
  graph, mesh, params = _params()
  shapes = {v.name: v.shape.to_integer_list for v in graph.trainable_variables}
  assert shapes == {"q": [6, 6], "k": [6, 6], "v": [6, 6], "o": [6, 6]}
  assert [d.name for d in params.q_dims] == ["heads", "d_kv"]
  x_value = np.random.RandomState(10).normal(size=[2, 6]).astype(np.float32)
  x = mtf.import_tf_tensor(mesh, x_value, [mtf.Dimension("batch", 2), D_MODEL])
  q = params.compute_q(x)
  y = params.compute_output(params.compute_v(x))
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl(
      "all:2", "heads:all", ["/cpu:0", "/cpu:1"])})
  read = lambda name: lowering.export_to_tf_tensor(
      graph.variable_by_name(name).outputs[0]).numpy()
  np.testing.assert_allclose(lowering.export_to_tf_tensor(q).numpy(),
                             (x_value @ read("q")).reshape(2, 2, 3), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(y).numpy(),
                             x_value @ read("v") @ read("o"), rtol=1e-5, atol=1e-6)


def test_attention_params_simple_and_multi_query_shapes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  attention.attention_params_simple(mesh, D_MODEL, mtf.Dimension("d_kv", 3),
                                    mtf.Dimension("heads", 2), mtf.VariableDType())
  assert sorted(v.name for v in graph.trainable_variables) == ["k", "o", "q", "v"]
  graph, _, params = _params(memory_heads_dims=[])
  shapes = {v.name: v.shape.to_integer_list for v in graph.trainable_variables}
  assert shapes["k"] == [6, 3] and shapes["q"] == [6, 6]
  assert [d.name for d in params.k_dims] == ["d_kv"]


def test_attention_params_bad_arguments_are_named():
  with pytest.raises(mtf.ShapeError, match="shared_kv.*d_kv.*d_v"):
    _params(shared_kv=True, value_dim=mtf.Dimension("d_v", 3))
  with pytest.raises(mtf.ShapeError, match="memory heads dim kv_heads"):
    _params(memory_heads_dims=[mtf.Dimension("kv_heads", 2)])
  _, mesh, params = _params()
  wrong = mtf.zeros(mesh, [mtf.Dimension("d_other", 6)])
  with pytest.raises(mtf.ShapeError, match="compute_q.*lacks dim d_model"):
    params.compute_q(wrong)


# ------------------------------------------------------------ relative positions


def test_relative_position_bucket_known_values():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  rel = np.array([0, -1, 1, -7, -8, -16, -200, 200, -127], np.int32)
  dim = [mtf.Dimension("n", rel.size)]
  rel_mtf = mtf.import_tf_tensor(mesh, rel, dim)
  both = relative_position.relative_position_bucket(rel_mtf, bidirectional=True)
  causal = relative_position.relative_position_bucket(rel_mtf, bidirectional=False)
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", [""])})
  # 16 buckets per side, 8 exact; 16 back: 8 + floor(log(2)/log(16) * 8) = 10.
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(both).numpy(),
                                [0, 1, 17, 7, 8, 10, 15, 31, 15])
  # 32 buckets, 16 exact: later positions fall into bucket 0; 16 back: 16 + 0.
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(causal).numpy(),
                                [0, 1, 0, 7, 8, 16, 31, 0, 31])
