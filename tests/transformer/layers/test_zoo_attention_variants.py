"""The attention variants of the Transformer zoo against plain TF on one device.

Each layer runs as a LayerStack runs it (inside "transformer/block_000/layer_000"),
lowered on a data+model-parallel layout of a 2x4 mesh, with placement and with SIMD
emulation; its output and gradients (input and every variable) are compared with the
same computation written in TF from the variables' values, whose names and shapes are
the original's checkpoint names.
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import transformer_layers as tl
from models.transformer.context import Context, ModeKeys
from test_transformer_layers import (BATCH, CAUSAL, D_FF, D_KV, D_MODEL, ENCODER, HEADS,
                                     LENGTH, SCOPE, Result, batch_dim, causal_mask,
                                     check_against_reference, ref_attention, _impl, _x)

MESH = "rows:2;cols:4"


def placement(layout):
  return _impl(MESH, layout)


def simd(layout):
  return mtf.SimdMeshImpl(MESH, layout)


DP_MP = "batch:rows;heads:cols;d_ff:cols"
BACKENDS = [placement, simd]
BACKEND_IDS = ["placement_dp_mp", "simd_dp_mp"]
MEMORY = 6


def run(layer, impl, x, model=CAUSAL, mode=ModeKeys.EVAL, extra=None, attrs=None,
        seed=5):
  """Like test_transformer_layers.run_layer; extra(mesh) gives more Context arguments
  (mtf tensors on the layer's mesh), attrs sets Context attributes."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  length = mtf.Dimension("length", x.shape[1])
  x_mtf = mtf.import_tf_tensor(mesh, x, [batch_dim, length, mtf.Dimension("d_model",
                                                                          x.shape[2])])
  losses = []
  context = Context(model, mesh, [batch_dim], length, mtf.VariableDType(tf.float32),
                    mode=mode, losses=losses, shared_params={},
                    **(extra(mesh) if extra else {}))
  for key, value in (attrs or {}).items():
    setattr(context, key, value)
  with mtf.variable_scope(SCOPE):
    y = layer.call(context, x_mtf)
  assert y.shape == x_mtf.shape
  variables = graph.trainable_variables
  w = np.random.RandomState(seed).normal(size=x.shape).astype(np.float32)
  grads = mtf.gradients([y], [x_mtf] + [v.outputs[0] for v in variables],
                        grad_ys=[mtf.import_tf_tensor(mesh, w, y.shape)])
  tf.random.set_seed(seed)
  lowering = mtf.Lowering(graph, {mesh: impl})
  export = lambda t: lowering.export_to_tf_tensor(t).numpy()
  return Result(export(y), export(grads[0]),
                {v.name: export(v.outputs[0]) for v in variables},
                {v.name: export(g) for v, g in zip(variables, grads[1:])},
                [export(l) for l in losses]), w


def shapes(result, prefix):
  """{short name: shape} of the variables under SCOPE/prefix/."""
  start = SCOPE + "/" + prefix + "/"
  assert all(n.startswith(start) for n in result.values), sorted(result.values)
  return {n[len(start):]: v.shape for n, v in result.values.items()}


def encoder_output(seed=14):
  return np.random.RandomState(seed).normal(size=[BATCH, MEMORY, D_MODEL]).astype(
      np.float32)


ENCODER_ID = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32)
ENCODER_MASK = np.broadcast_to((ENCODER_ID != 0)[:, None, None, :],
                               [BATCH, 1, LENGTH, MEMORY])


def with_encoder(memory=None, encoder_id=ENCODER_ID):
  memory = encoder_output() if memory is None else memory
  memory_length = mtf.Dimension("memory_length", memory.shape[1])
  model_dim = mtf.Dimension("d_model", D_MODEL)
  return lambda mesh: dict(
      encoder_output=mtf.import_tf_tensor(mesh, memory, [batch_dim, memory_length,
                                                         model_dim]),
      encoder_sequence_id=mtf.import_tf_tensor(mesh, encoder_id,
                                               [batch_dim, memory_length]))


def additive(mask):
  return tf.where(mask, 0.0, -1e9)


# ------------------------------------------------------------------- talking heads

KEY_HEADS, SOFTMAX_HEADS, VALUE_HEADS, D_K, D_V = 2, 4, 2, 3, 5
TALKING = dict(key_heads_dims=[("key_heads", KEY_HEADS)],
               softmax_heads_dims=[("softmax_heads", SOFTMAX_HEADS)],
               value_heads_dims=[("value_heads", VALUE_HEADS)], key_size=D_K,
               value_size=D_V)
TALKING_LAYOUT = "batch:rows;softmax_heads:cols"


def ref_talking_heads(x, v, name, memory=None, mask=None, bias=None, x2l=None, m2w=None):
  memory = x if memory is None else memory
  p = lambda n: v["%s_%s" % (name, n)]
  q = tf.einsum("bld,dhk->blhk", x, p("q_kernel"))
  k = tf.einsum("bmd,dhk->bmhk", memory, p("k_kernel"))
  val = tf.einsum("bmd,dhk->bmhk", memory, p("v_kernel"))
  logits = tf.einsum("blhk,bmhk->blhm", q, k)
  if x2l is None:
    logits = tf.einsum("blhm,hs->blsm", logits, p("logits_kernel"))
  else:
    dynamic = tf.einsum("bld,dhs->blhs", x, p(x2l)) + p("logits_kernel")
    logits = tf.einsum("blhm,blhs->blsm", logits, dynamic)
  if mask is not None:
    logits += additive(mask)
  if bias is not None:
    logits += bias
  h = tf.nn.softmax(logits, axis=-1)
  if m2w is None:
    weights = tf.einsum("blsm,sv->blvm", h, p("weights_kernel"))
  else:
    dynamic = tf.einsum("bmd,dsv->bmsv", memory, p(m2w)) + p("weights_kernel")
    weights = tf.einsum("blsm,bmsv->blvm", h, dynamic)
  u = tf.einsum("blvm,bmvk->blvk", weights, val)
  return tf.einsum("blvk,vkd->bld", u, p("y_kernel"))


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_talking_heads_self_attention_matches_tf(backend):
  x = _x(30)
  result, w = run(tl.TalkingHeadsSelfAttention(**TALKING), backend(TALKING_LAYOUT), x)
  assert shapes(result, "TalkingHeadsSelfAttention") == {
      "q/kernel": (D_MODEL, KEY_HEADS, D_K), "k/kernel": (D_MODEL, KEY_HEADS, D_K),
      "v/kernel": (D_MODEL, VALUE_HEADS, D_V), "y/kernel": (VALUE_HEADS, D_V, D_MODEL),
      "logits/kernel": (KEY_HEADS, SOFTMAX_HEADS),
      "weights/kernel": (SOFTMAX_HEADS, VALUE_HEADS)}
  check_against_reference(result, w, x, lambda x, **v: ref_talking_heads(
      x, v, "TalkingHeadsSelfAttention", mask=causal_mask(LENGTH)[0, 0][None, :, None]))


def test_talking_heads_dynamic_projections_and_relative_bias():
  x = _x(31)
  layer = tl.TalkingHeadsSelfAttention(dynamic_projections=["x2l", "m2w"],
                                       relative_attention_type="bias",
                                       relative_attention_num_buckets=4, **TALKING)
  result, w = run(layer, placement(TALKING_LAYOUT), x, model=ENCODER)
  names = shapes(result, "TalkingHeadsSelfAttention")
  assert names["logits/logits_dynamic_0/kernel"] == (D_MODEL, KEY_HEADS, SOFTMAX_HEADS)
  assert names["weights/weights_dynamic_0/kernel"] == (D_MODEL, SOFTMAX_HEADS,
                                                       VALUE_HEADS)
  assert names["relative_attention_bias"] == (SOFTMAX_HEADS, 4)
  i = np.arange(LENGTH)
  rel = i[None, :] - i[:, None]
  # 4 bidirectional buckets: 2 per side, one exact distance each then the rest.
  buckets = np.where(rel > 0, 2, 0) + np.minimum(np.abs(rel), 1)

  def ref(x, **v):
    table = v["TalkingHeadsSelfAttention_relative_attention_bias"]
    bias = tf.transpose(tf.gather(table, buckets, axis=1), [1, 0, 2])[None]
    return ref_talking_heads(x, v, "TalkingHeadsSelfAttention", bias=bias,
                             x2l="logits_logits_dynamic_0_kernel",
                             m2w="weights_weights_dynamic_0_kernel")
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-4)


def test_talking_heads_with_equal_heads_dims_is_multi_head_attention():
  x = _x(32)
  layer = tl.TalkingHeadsSelfAttention(
      key_heads_dims=[("heads", HEADS)], softmax_heads_dims=[("heads", HEADS)],
      value_heads_dims=[("heads", HEADS)], key_size=D_KV, value_size=D_KV)
  result, w = run(layer, placement(DP_MP), x)
  assert sorted(shapes(result, "TalkingHeadsSelfAttention")) == [
      "k/kernel", "q/kernel", "v/kernel", "y/kernel"]

  def ref(x, **v):
    flat = lambda n: tf.reshape(v["TalkingHeadsSelfAttention_%s_kernel" % n], [D_MODEL, -1])
    return ref_attention(x, flat("q"), flat("k"), flat("v"),
                         tf.reshape(v["TalkingHeadsSelfAttention_y_kernel"], [-1, D_MODEL]),
                         mask=causal_mask(LENGTH))
  check_against_reference(result, w, x, ref)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_talking_heads_enc_dec_attention_masks_encoder_padding(backend):
  x = _x(33)
  result, w = run(tl.TalkingHeadsEncDecAttention(**TALKING), backend(TALKING_LAYOUT), x,
                  extra=with_encoder())
  memory = tf.constant(encoder_output())
  check_against_reference(result, w, x, lambda x, **v: ref_talking_heads(
      x, v, "TalkingHeadsEncDecAttention", memory=memory,
      mask=np.transpose(ENCODER_MASK, [0, 2, 1, 3])))


# ---------------------------------------------------------------- general bilinear


def ref_bilinear(x, q_kernel, y_kernel, memory=None, mask=None):
  memory = x if memory is None else memory
  q = tf.einsum("bld,dhe->blhe", x, q_kernel)
  logits = tf.einsum("blhe,bme->blhm", q, memory)
  if mask is not None:
    logits += additive(mask)
  u = tf.einsum("blhm,bme->blhe", tf.nn.softmax(logits, axis=-1), memory)
  return tf.einsum("blhe,hef->blf", u, y_kernel)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_general_bilinear_self_attention_matches_tf(backend):
  x = _x(34)
  layer = tl.GeneralBilinearSelfAttention(heads_dims=[("heads", HEADS)])
  result, w = run(layer, backend(DP_MP), x)
  assert shapes(result, "GeneralBilinearSelfAttention") == {
      "q/kernel": (D_MODEL, HEADS, D_MODEL), "y/kernel": (HEADS, D_MODEL, D_MODEL)}
  check_against_reference(result, w, x, lambda x, **v: ref_bilinear(
      x, v["GeneralBilinearSelfAttention_q_kernel"],
      v["GeneralBilinearSelfAttention_y_kernel"],
      mask=causal_mask(LENGTH)[0, 0][None, :, None, :]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_general_bilinear_enc_dec_attention_matches_tf(backend):
  x = _x(35)
  layer = tl.GeneralBilinearEncDecAttention(heads_dims=[("heads", HEADS)])
  result, w = run(layer, backend(DP_MP), x, extra=with_encoder())
  check_against_reference(result, w, x, lambda x, **v: ref_bilinear(
      x, v["GeneralBilinearEncDecAttention_q_kernel"],
      v["GeneralBilinearEncDecAttention_y_kernel"], memory=tf.constant(encoder_output()),
      mask=np.transpose(ENCODER_MASK, [0, 2, 1, 3])), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------- transparent


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_transparent_attention_attends_to_its_modules_mix(backend):
  # 2 encoder modules of 2 layers: outputs 0, 2, 4 are mixed; decoder modules of 2
  # layers, so layer 3 attends to the mix of decoder module 1.
  x = _x(36)
  outputs = [encoder_output(40 + i) for i in range(5)]
  memory_length = mtf.Dimension("memory_length", MEMORY)
  model_dim = mtf.Dimension("d_model", D_MODEL)

  def extra(mesh):
    kwargs = with_encoder(outputs[-1])(mesh)
    kwargs["encoder_layer_outputs"] = [
        mtf.import_tf_tensor(mesh, o, [batch_dim, memory_length, model_dim])
        for o in outputs]
    return kwargs
  layer = tl.TransparentEncDecAttention(
      layers_per_encoder_module=2, layers_per_decoder_module=2, encoder_num_modules=2,
      decoder_num_modules=2, num_heads=HEADS, key_value_size=D_KV)
  result, w = run(layer, backend(DP_MP), x, extra=extra, attrs={"layer_index": 3})
  assert shapes(result, "TransparentEncDecAttention")["w"] == (3, 2)

  def ref(x, **v):
    p = lambda n: v["TransparentEncDecAttention_" + n]
    mix = tf.nn.softmax(p("w"), axis=0)[:, 1]
    memory = tf.einsum("e,ebmd->bmd", mix, tf.constant(np.stack(outputs[::2])))
    return ref_attention(x, *[p(n) for n in "qkvo"], memory=memory, mask=ENCODER_MASK)
  check_against_reference(result, w, x, ref)


def test_transparent_attention_needs_the_encoder_layer_outputs():
  layer = tl.TransparentEncDecAttention(
      layers_per_encoder_module=2, layers_per_decoder_module=3, encoder_num_modules=6,
      decoder_num_modules=6, num_heads=HEADS, key_value_size=D_KV)
  with pytest.raises(mtf.MtfError, match="encoder_layer_outputs with at least 13"):
    run(layer, placement(DP_MP), _x(37), extra=with_encoder())


# ------------------------------------------------------------------------ branched


def _constraint(z):
  z = tf.nn.relu(z)
  return z / tf.reduce_sum(z + 1e-4)


def ref_branched(x, v, name, memory=None, mask=None):
  memory = x if memory is None else memory
  p = lambda n: v["%s_%s" % (name, n)]
  q = tf.einsum("bld,dhk->bhlk", x, p("q"))
  k = tf.einsum("bmd,dhk->bhmk", memory, p("k"))
  val = tf.einsum("bmd,dhk->bhmk", memory, p("v"))
  logits = tf.einsum("bhlk,bhmk->bhlm", q, k) + additive(mask)
  o = tf.einsum("bhlm,bhmk->bhlk", tf.nn.softmax(logits, axis=-1), val)
  per_head = tf.einsum("bhlk,hkd->blhd", o, p("o")) * _constraint(p("kappa"))[:, None]
  ffn = tf.nn.relu(per_head @ p("wi_kernel")) @ p("wo_kernel")
  return tf.reduce_sum(ffn * _constraint(p("alpha"))[:, None], axis=2)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_branched_self_attention_matches_tf(backend):
  x = _x(38)
  layer = tl.BranchedSelfAttention(num_heads=HEADS, key_value_size=D_KV)
  layer.dense_layer = tl.DenseReluDense(hidden_size=D_FF)
  # Not d_ff:cols too: the feed-forward's hidden tensor has both heads and d_ff.
  result, w = run(layer, backend("batch:rows;heads:cols"), x)
  assert shapes(result, "BranchedSelfAttention") == {
      "q": (D_MODEL, HEADS, D_KV), "k": (D_MODEL, HEADS, D_KV), "v": (D_MODEL, HEADS, D_KV),
      "o": (HEADS, D_KV, D_MODEL), "kappa": (HEADS,), "alpha": (HEADS,),
      "wi/kernel": (D_MODEL, D_FF), "wo/kernel": (D_FF, D_MODEL)}
  check_against_reference(result, w, x, lambda x, **v: ref_branched(
      x, v, "BranchedSelfAttention", mask=causal_mask(LENGTH)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_branched_enc_dec_attention_matches_tf(backend):
  x = _x(39)
  layer = tl.BranchedEncDecAttention(num_heads=HEADS, key_value_size=D_KV)
  layer.dense_layer = tl.DenseReluDense(hidden_size=D_FF)
  result, w = run(layer, backend("batch:rows;d_ff:cols"), x, extra=with_encoder())
  check_against_reference(result, w, x, lambda x, **v: ref_branched(
      x, v, "BranchedEncDecAttention", memory=tf.constant(encoder_output()),
      mask=ENCODER_MASK), rtol=1e-4, atol=1e-4)


def test_branched_attention_refuses_memory_heads():
  with pytest.raises(mtf.MtfError, match="num_memory_heads to 0"):
    tl.BranchedSelfAttention(num_memory_heads=2)


# ------------------------------------------------------------------------ hybrid


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_hybrid_attention_blends_softmax_with_doubly_normalised(backend):
  x = _x(50)
  layer = tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV, attention_func="hybrid")
  result, w = run(layer, backend(DP_MP), x, model=ENCODER)
  assert shapes(result, "SelfAttention")["doubly_coeff"] == ()
  np.testing.assert_allclose(result.values[SCOPE + "/SelfAttention/doubly_coeff"], 0.5)

  def ref(x, **v):
    p = lambda n: tf.reshape(v["SelfAttention_" + n], [D_MODEL, HEADS, D_KV])
    q = tf.einsum("bld,dhk->bhlk", x, p("q"))
    k = tf.einsum("bld,dhk->bhlk", x, p("k"))
    val = tf.einsum("bld,dhk->bhlk", x, p("v"))
    logits = tf.einsum("bhlk,bhmk->bhlm", q, k)
    coeff = tf.clip_by_value(v["SelfAttention_doubly_coeff"], 0.0, 1.0)
    doubly = tf.nn.softmax(tf.nn.log_softmax(logits, axis=-2), axis=-1)
    weights = coeff * doubly + (1.0 - coeff) * tf.nn.softmax(logits, axis=-1)
    o = tf.einsum("bhlm,bhmk->bhlk", weights, val)
    return tf.einsum("bhlk,hkd->bld", o, tf.reshape(v["SelfAttention_o"],
                                                    [HEADS, D_KV, D_MODEL]))
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-4)


def test_gin_binds_the_zoo_layers_under_transformer_layers():
  gin.clear_config()
  try:
    gin.parse_config([
        "transformer_layers.TalkingHeadsSelfAttention.dropout_rate = 0.25",
        "transformer_layers.GeneralBilinearSelfAttention.dropout_rate = 0.5",
        "TransparentEncDecAttention.layers_per_encoder_module = 2",
        "TransparentEncDecAttention.layers_per_decoder_module = 3",
        "TransparentEncDecAttention.encoder_num_modules = 6",
        "TransparentEncDecAttention.decoder_num_modules = 6",
        "transformer_layers.Synthesizer.synthesize_mode = 'dense_plus'",
        "transformer_layers.LocalConvAttnBlock.attention_type = 'dynamic_conv'",
    ])
    talking, bilinear = tl.TalkingHeadsSelfAttention(), tl.GeneralBilinearSelfAttention()
    transparent, synthesizer = tl.TransparentEncDecAttention(), tl.Synthesizer()
    block = tl.LocalConvAttnBlock(min_relative_pos=-2, max_relative_pos=0, output_size=8)
  finally:
    gin.clear_config()
  assert (talking.dropout_rate, bilinear.dropout_rate) == (0.25, 0.5)
  assert (transparent.layers_per_decoder_module, transparent.decoder_num_modules) == (3, 6)
  assert synthesizer.synthesize_mode == "dense_plus"
  assert type(block.conv_attn_layer).__name__ == "DynamicConv1DLocalAttn"
