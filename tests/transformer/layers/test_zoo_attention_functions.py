"""Synthesizer attention, span-relative encoder-decoder biases, the 2-D sharding
reshape and the relative-position hooks of SelfAttention, against plain TF / numpy on
placement and SIMD dp+mp layouts of a 2x4 mesh."""
import collections

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import attention
from models.transformer import transformer_layers as tl
from models.transformer.context import Context
from test_transformer_layers import (BATCH, CAUSAL, D_KV, D_MODEL, HEADS, LENGTH,
                                     batch_dim, causal_mask, check_against_reference,
                                     length_dim, np_bucket, ref_attention, _impl, _x)
from test_zoo_attention_variants import (BACKEND_IDS, BACKENDS, DP_MP,
                                         ENCODER_MASK, MEMORY, additive, encoder_output,
                                         placement, run, shapes, simd, with_encoder)

# ------------------------------------------------------------------- Synthesizer


def ref_synthesizer(x, v, mode, mask):
  p = lambda n: v["Synthesizer_" + n]
  heads = lambda w: tf.reshape(w, [D_MODEL, HEADS, D_KV])
  project = lambda name: tf.einsum("bld,dhk->bhlk", x, heads(p(name)))
  values = project("v" if "plus" in mode else "kv")
  logits = 0.0
  if "plus" in mode or mode == "dense_minus":
    q = project("q")
  if "plus" in mode:
    logits = tf.einsum("bhlk,bhmk->bhlm", q, project("k"))
  if mode.startswith("dense"):
    synthetic = tf.einsum("bhlk,km->bhlm", tf.nn.relu(q), p("pi_kernel"))
  elif mode == "factorized":
    synthetic = tf.einsum("thl,thm->hlm", p("R1"), p("R2"))[None]
  else:
    synthetic = tf.transpose(p("R"), [1, 0, 2])[None]
  if "alpha" in mode:
    a = tf.sigmoid(p("alpha")[0])
    logits = (1.0 - a) * logits + a * synthetic
  else:
    logits += synthetic
  weights = tf.broadcast_to(tf.nn.softmax(logits + additive(mask), axis=-1),
                            [BATCH, HEADS, LENGTH, LENGTH])
  o = tf.einsum("bhlm,bhmk->bhlk", weights, values)
  return tf.einsum("bhlk,hkd->bld", o, tf.reshape(p("o"), [HEADS, D_KV, D_MODEL]))


SYNTH_VARIABLES = {
    "random_plus_alpha": ["R", "alpha", "k", "o", "q", "v"],
    "random": ["R", "kv", "o"],
    "factorized": ["R1", "R2", "kv", "o"],
    "dense_minus": ["kv", "o", "pi/kernel", "q"],
    "dense_plus": ["k", "o", "pi/kernel", "q", "v"],
}


def _synthesizer(mode):
  return tl.Synthesizer(num_heads=HEADS, key_value_size=D_KV, synthesize_mode=mode,
                        attention_kwargs={"max_length": LENGTH, "factorized_dim": 3})


def _check_synthesizer(mode, impl):
  x = _x(60)
  result, w = run(_synthesizer(mode), impl, x)
  names = shapes(result, "Synthesizer")
  assert sorted(names) == SYNTH_VARIABLES[mode]
  if "R" in names:
    assert names["R"] == (LENGTH, HEADS, LENGTH)
  check_against_reference(result, w, x, lambda x, **v: ref_synthesizer(
      x, v, mode, causal_mask(LENGTH)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_synthesizer_random_plus_alpha_matches_tf(backend):
  _check_synthesizer("random_plus_alpha", backend(DP_MP))


@pytest.mark.parametrize("mode", ["random", "factorized", "dense_minus", "dense_plus"])
def test_synthesizer_modes_match_tf(mode):
  _check_synthesizer(mode, placement(DP_MP))


def test_synthesizer_unknown_mode_is_named():
  with pytest.raises(mtf.MtfError, match="synthesize_mode 'noise'"):
    tl.Synthesizer(synthesize_mode="noise")


# ------------------------------------------------------- span relative positions

VOCAB, SENTINELS = 20, 3  # sentinels: ids 17, 18, 19
ENCODER_IDS = np.array([[5, 6, 19, 7, 18, 8], [4, 19, 3, 3, 3, 2]], np.int32)
DECODER_IDS = np.array([[0, 19, 9, 9, 18, 9, 9, 1], [0, 2, 2, 19, 5, 5, 1, 0]], np.int32)

SpanModel = collections.namedtuple(
    "SpanModel", ["fully_autoregressive", "autoregressive", "model_dim",
                  "input_vocab_size"])


def np_spans(decoder_ids, encoder_ids):
  """Relative position of each (target token, input position), written with loops."""
  out = np.zeros(decoder_ids.shape + encoder_ids.shape[1:], np.int32)
  for b in range(decoder_ids.shape[0]):
    sentinel_positions = [j for j, t in enumerate(encoder_ids[b])
                          if t >= VOCAB - SENTINELS]
    seen = 0
    for i, t in enumerate(decoder_ids[b]):
      seen += t >= VOCAB - SENTINELS
      anchor = sentinel_positions[seen - 1] if 0 < seen <= len(sentinel_positions) else 0
      out[b, i] = np.arange(encoder_ids.shape[1]) - anchor
  return out


def _span_inputs(mesh):
  memory_length = mtf.Dimension("memory_length", MEMORY)
  return dict(inputs=mtf.import_tf_tensor(mesh, DECODER_IDS, [batch_dim, length_dim]),
              encoder_inputs=mtf.import_tf_tensor(mesh, ENCODER_IDS,
                                                  [batch_dim, memory_length]))


def test_relative_position_spans_anchor_targets_at_their_sentinel():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  context = Context(SpanModel(True, True, D_MODEL, VOCAB), mesh, [batch_dim], length_dim,
                    mtf.VariableDType(), **_span_inputs(mesh))
  rel = tl.relative_position_spans(context, num_sentinels=SENTINELS)
  lowering = mtf.Lowering(graph, {mesh: _impl(*("rows:2;cols:4", "batch:rows"))})
  expected = np_spans(DECODER_IDS, ENCODER_IDS)
  assert expected[0, 2, 2] == 0 and expected[0, 5, 4] == 0 and expected[1, 1, 3] == 3
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(rel).numpy(), expected)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_enc_dec_relative_attention_bias_uses_span_positions(backend):
  x = _x(61)
  buckets = 8
  layer = tl.EncDecAttention(num_heads=HEADS, key_value_size=D_KV,
                             relative_attention_type="bias",
                             relative_attention_num_buckets=buckets)

  def extra(mesh):
    return dict(with_encoder()(mesh), **_span_inputs(mesh))
  gin.clear_config()
  gin.parse_config("transformer_layers.relative_position_spans.num_sentinels = %d"
                   % SENTINELS)
  try:
    result, w = run(layer, backend(DP_MP), x, model=SpanModel(True, True, D_MODEL, VOCAB),
                    extra=extra)
  finally:
    gin.clear_config()
  names = shapes(result, "EncDecAttention")
  assert names["enc_dec_relative_attention_bias"] == (HEADS, buckets)
  bucket = np_bucket(np_spans(DECODER_IDS, ENCODER_IDS), bidirectional=True,
                     num_buckets=buckets)
  assert len(np.unique(bucket)) > 3

  def ref(x, **v):
    p = lambda n: v["EncDecAttention_" + n]
    bias = tf.transpose(tf.gather(p("enc_dec_relative_attention_bias"), bucket, axis=1),
                        [1, 0, 2, 3])
    return ref_attention(x, *[p(n) for n in "qkvo"], memory=tf.constant(encoder_output()),
                         mask=ENCODER_MASK, bias=bias)
  check_against_reference(result, w, x, ref)


def test_enc_dec_bias_shared_keeps_one_table():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  context = Context(SpanModel(True, True, D_MODEL, VOCAB), mesh, [batch_dim], length_dim,
                    mtf.VariableDType(), shared_params={},
                    **dict(with_encoder()(mesh), **_span_inputs(mesh)))
  for block in range(2):
    with mtf.variable_scope("decoder/block_%03d/layer_001" % block):
      tl.enc_dec_attention_bias(
          tl.EncDecAttention(relative_attention_type="bias_shared"), context,
          [mtf.Dimension("heads", HEADS)],
          relative_position_fn=lambda c: tl.relative_position_spans(c, SENTINELS))
  tables = [v.name for v in graph.trainable_variables]
  assert tables == ["decoder/block_000/layer_001/enc_dec_relative_attention_bias"]


# ------------------------------------------------------------- 2-D sharding reshape

ShardedModel = collections.namedtuple(
    "ShardedModel", ["fully_autoregressive", "autoregressive", "model_dim", "layout",
                     "mesh_shape"])
SHARDED_LAYOUT = "batch:rows;d_ff:cols"  # the attention itself leaves "cols" idle


def test_2d_sharding_reshape_splits_heads_over_the_idle_mesh_dim():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  heads, d_kv = mtf.Dimension("heads", HEADS), mtf.Dimension("d_kv", D_KV)
  memory = mtf.Dimension("memory_length", LENGTH)
  q = mtf.zeros(mesh, [batch_dim, length_dim, heads, d_kv])
  k = mtf.zeros(mesh, [batch_dim, memory, heads, d_kv])
  bias = mtf.zeros(mesh, [length_dim, memory])
  model = ShardedModel(True, True, D_MODEL, SHARDED_LAYOUT, "rows:2;cols:4")
  context = Context(model, mesh, [batch_dim], length_dim, mtf.VariableDType())
  q2, k2, v2, bias2 = attention.maybe_reshape_attention_input_for_2d_sharding(
      context, q, k, k, bias, [d_kv])
  assert q2.shape.dimension_names == ["batch", "length", "heads", "d_ff", "d_kv"]
  assert q2.shape.get_dim_by_name("heads").size == 1
  assert k2.shape == v2.shape and bias2 is bias
  no_layout = Context(CAUSAL, mesh, [batch_dim], length_dim, mtf.VariableDType())
  assert attention.maybe_reshape_attention_input_for_2d_sharding(
      no_layout, q, k, k, bias, [d_kv])[0] is q


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_self_attention_with_2d_sharding_reshape_matches_tf(backend):
  x = _x(63)
  model = ShardedModel(True, True, D_MODEL, SHARDED_LAYOUT, "rows:2;cols:4")
  result, w = run(tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV),
                  backend(SHARDED_LAYOUT), x, model=model)
  check_against_reference(result, w, x, lambda x, **v: ref_attention(
      x, *[v["SelfAttention_" + n] for n in "qkvo"], mask=causal_mask(LENGTH)))


# ------------------------------------------------------ relative-position hooks


class WindowedSelfAttention(tl.SelfAttention):
  """Sees the query and the two positions before it, through the hooks only."""

  def min_relative_position(self, context):
    return -2


def test_min_max_relative_position_hooks_shape_the_mask():
  x = _x(64)
  result, w = run(WindowedSelfAttention(num_heads=HEADS, key_value_size=D_KV),
                  simd(DP_MP), x)
  i = np.arange(LENGTH)
  rel = i[None, :] - i[:, None]
  mask = ((rel <= 0) & (rel >= -2))[None, None]
  check_against_reference(result, w, x, lambda x, **v: ref_attention(
      x, *[v["WindowedSelfAttention_" + n] for n in "qkvo"], mask=mask))


def test_local_self_attention_window_members():
  layer = tl.LocalSelfAttention(radius=5)
  assert layer.window_dim == mtf.Dimension("window", 5)
  context = Context(CAUSAL, None, [batch_dim], length_dim, mtf.VariableDType())
  assert (layer.min_relative_position(context), layer.max_relative_position(context)) == (
      -4, 0)
  context.model = CAUSAL._replace(fully_autoregressive=False, autoregressive=False)
  assert layer.max_relative_position(context) == 5
  assert tl.SelfAttention().max_relative_position(context) is None


def test_hyperprompt_parameters_are_kept():
  """(The prompts themselves are checked in test_zoo_hyper_prompts.py.)"""
  layer = tl.SelfAttention(use_hyperprompt=True, hyperprompt_task_num=4,
                           hyperprompt_hidden_dim=16, hyperprompt_length_encoder=3)
  assert (layer.hyperprompt_task_num, layer.hyperprompt_hidden_dim,
          layer.hyperprompt_length_encoder, layer.use_hyperprompt) == (4, 16, 3, True)
  assert tl.SelfAttention().use_hyperprompt is False


def test_attention_params_without_attention_vars_keeps_only_the_output_projection():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  heads, d_kv = mtf.Dimension("heads", HEADS), mtf.Dimension("d_kv", D_KV)
  d_model = mtf.Dimension("d_model", D_MODEL)
  params = attention.AttentionParams(
      mesh, d_model, d_model, d_model, d_kv, d_kv, [heads], [heads], mtf.VariableDType(),
      make_attention_vars=False)
  assert [v.name for v in graph.trainable_variables] == ["o"]
  assert params.wq is None and params.wkv is None


def test_keep_query_heads_dims_projects_each_head_on_its_own():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  heads, d_kv = mtf.Dimension("heads", HEADS), mtf.Dimension("d_kv", D_KV)
  d_model = mtf.Dimension("d_model", D_MODEL)
  params = attention.AttentionParams(
      mesh, d_model, d_model, d_model, d_kv, d_kv, [heads], [heads], mtf.VariableDType(),
      combine_dims=False, keep_query_heads_dims=True)
  o_value = np.random.RandomState(65).normal(size=[BATCH, HEADS, D_KV]).astype(np.float32)
  o = mtf.import_tf_tensor(mesh, o_value, [batch_dim, heads, d_kv])
  y = params.compute_output(o)
  assert y.shape.dimension_names == ["batch", "heads", "d_model"]
  lowering = mtf.Lowering(graph, {mesh: placement("batch:rows;heads:cols")})
  wo = lowering.export_to_tf_tensor(params.wo).numpy()
  assert wo.shape == (HEADS, D_KV, D_MODEL)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(y).numpy(),
                             np.einsum("bhk,hkd->bhd", o_value, wo), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_contextual_relative_attention_adds_query_dot_bucket_embedding(backend):
  x = _x(66)
  buckets = 8
  layer = tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV,
                           relative_attention_type="contextual",
                           relative_attention_num_buckets=buckets)
  result, w = run(layer, backend(DP_MP), x, model=CAUSAL._replace(
      fully_autoregressive=False, autoregressive=False))
  assert shapes(result, "SelfAttention")["relative_attention_ak/kernel"] == (
      HEADS, D_KV, buckets)
  i = np.arange(LENGTH)
  bucket = np_bucket(i[None, :] - i[:, None], bidirectional=True, num_buckets=buckets)
  one_hot = np.eye(buckets, dtype=np.float32)[bucket]  # [length, memory, buckets]

  def ref(x, **v):
    p = lambda n: v["SelfAttention_" + n]
    q = tf.einsum("bld,dhk->bhlk", x, tf.reshape(p("q"), [D_MODEL, HEADS, D_KV]))
    values = tf.einsum("bhlk,hkn->bhln", q, p("relative_attention_ak_kernel"))
    bias = tf.einsum("bhln,lmn->bhlm", values, one_hot)
    return ref_attention(x, *[p(n) for n in "qkvo"], bias=bias)
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-4)


def test_synthesizer_longer_than_max_length_and_contextual_talking_heads_are_named():
  layer = tl.Synthesizer(num_heads=HEADS, key_value_size=D_KV,
                         attention_kwargs={"max_length": LENGTH // 2})
  with pytest.raises(mtf.ShapeError, match="longer than max_length 4"):
    run(layer, placement(DP_MP), _x(67))
  with pytest.raises(mtf.MtfError, match="'contextual' is not one of"):
    tl.TalkingHeadsSelfAttention(relative_attention_type="contextual")
