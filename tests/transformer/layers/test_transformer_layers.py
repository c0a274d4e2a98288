"""Transformer layers against plain TF on one device, with the layers' own weights.

Each layer is called the way a LayerStack calls it (inside "transformer/block_000/
layer_000"), lowered on several meshes and layouts, and its output and gradients (with
respect to the input and to every variable) are compared with the same computation
written in TF from the variables' values read back after lowering.
"""
import collections

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import transformer_layers as tl
from models.transformer.context import Context, ModeKeys

BATCH, LENGTH, D_MODEL, HEADS, D_KV, D_FF = 2, 8, 8, 4, 4, 16
batch_dim = mtf.Dimension("batch", BATCH)
length_dim = mtf.Dimension("length", LENGTH)
model_dim = mtf.Dimension("d_model", D_MODEL)
SCOPE = "transformer/block_000/layer_000"

# (mesh shape, layout): one device, data+model parallel, and the length and d_kv split.
LAYOUTS = [
    ("", ""),
    ("rows:2;cols:4", "batch:rows;heads:cols;d_ff:cols"),
    ("rows:2;cols:4", "length:rows;d_kv:cols"),
]
LAYOUT_IDS = ["single", "dp_mp", "length_split"]

FakeModel = collections.namedtuple(
    "FakeModel", ["fully_autoregressive", "autoregressive", "model_dim"])
CAUSAL = FakeModel(True, True, D_MODEL)
ENCODER = FakeModel(False, False, D_MODEL)

Result = collections.namedtuple("Result", ["out", "dx", "values", "grads", "losses"])


def _impl(mesh_shape, layout):
  n = mtf.convert_to_shape(mesh_shape).size
  return mtf.PlacementMeshImpl(mesh_shape, layout, ["/cpu:%d" % i for i in range(n)])


def _x(seed=0, length=LENGTH):
  return np.random.RandomState(seed).normal(size=[BATCH, length, D_MODEL]).astype(
      np.float32)


def run_layer(layer, impl, x, model=CAUSAL, mode=ModeKeys.EVAL, imports=None, seed=5,
              scope=SCOPE, with_grads=True, **context_kwargs):
  """Calls layer on x inside scope and lowers it; returns out, grads and variables.

  imports: {context argument: (numpy value, shape)} imported as mtf tensors.
  with_grads=False skips the gradients (dx and grads are then None / empty).
  """
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x_mtf = mtf.import_tf_tensor(mesh, x, [batch_dim, mtf.Dimension("length", x.shape[1]),
                                         mtf.Dimension("d_model", x.shape[2])])
  for key, (value, shape) in (imports or {}).items():
    context_kwargs[key] = mtf.import_tf_tensor(mesh, value, shape)
  losses = []
  context = Context(model, mesh, [batch_dim], x_mtf.shape.dims[1],
                    mtf.VariableDType(tf.float32), mode=mode, losses=losses,
                    **context_kwargs)
  with mtf.variable_scope(scope):
    y = layer.call(context, x_mtf)
  assert y.shape == x_mtf.shape
  variables = graph.trainable_variables
  w = np.random.RandomState(seed).normal(size=x.shape).astype(np.float32)
  grads = [None] * (len(variables) + 1)
  if with_grads:
    grads = mtf.gradients([y], [x_mtf] + [v.outputs[0] for v in variables],
                          grad_ys=[mtf.import_tf_tensor(mesh, w, y.shape)])
  tf.random.set_seed(seed)  # the same initial weights on every mesh and layout
  lowering = mtf.Lowering(graph, {mesh: impl})
  export = lambda t: None if t is None else lowering.export_to_tf_tensor(t).numpy()
  return Result(
      export(y), export(grads[0]),
      {v.name: export(v.outputs[0]) for v in variables},
      {v.name: export(g) for v, g in zip(variables, grads[1:])},
      [export(l) for l in losses]), w


def check_against_reference(result, w, x, ref_fn, rtol=2e-5, atol=2e-5):
  """ref_fn(x, **variables by short name) in TF; compares out and all gradients."""
  check_against_tf(result, w, x, lambda tf_x, tf_vars: ref_fn(tf_x, **{
      n[len(SCOPE) + 1:].replace("/", "_"): v for n, v in tf_vars.items()}), rtol, atol)


def check_against_tf(result, w, x, ref_fn, rtol=2e-5, atol=2e-5):
  """ref_fn(x, {full variable name: value}) in TF against result (of run): the output,
  and the gradients of sum(output * w) with respect to x and every variable."""
  names = sorted(result.values)
  tf_vars = {n: tf.constant(result.values[n]) for n in names}
  tf_x = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch([tf_x] + list(tf_vars.values()))
    ref = ref_fn(tf_x, tf_vars)
    loss = tf.reduce_sum(ref * w)
  np.testing.assert_allclose(result.out, ref.numpy(), rtol=rtol, atol=atol,
                             err_msg="forward")
  grads = tape.gradient(loss, [tf_x] + [tf_vars[n] for n in names])
  np.testing.assert_allclose(result.dx, grads[0].numpy(), rtol=rtol, atol=atol,
                             err_msg="gradient w.r.t. x")
  for n, g in zip(names, grads[1:]):
    np.testing.assert_allclose(result.grads[n], g.numpy(), rtol=rtol, atol=atol,
                               err_msg="gradient w.r.t. %s" % n)


def ref_attention(x, wq, wk, wv, wo, mask=None, bias=None, memory=None, heads=HEADS,
                  d_kv=D_KV):
  """Multi-head attention in TF from combined [d_model, heads*d_kv] weights."""
  memory = x if memory is None else memory
  d = x.shape[-1]
  q = tf.einsum("bld,dhk->bhlk", x, tf.reshape(wq, [d, heads, d_kv]))
  k = tf.einsum("bmd,dhk->bhmk", memory, tf.reshape(wk, [memory.shape[-1], heads, d_kv]))
  v = tf.einsum("bmd,dhk->bhmk", memory, tf.reshape(wv, [memory.shape[-1], heads, d_kv]))
  logits = tf.einsum("bhlk,bhmk->bhlm", q, k)
  if mask is not None:
    logits += tf.where(mask, 0.0, -1e9)
  if bias is not None:
    logits += bias
  o = tf.einsum("bhlm,bhmk->bhlk", tf.nn.softmax(logits, axis=-1), v)
  return tf.einsum("bhlk,hkd->bld", o, tf.reshape(wo, [heads, d_kv, d]))


def causal_mask(length):
  return np.tril(np.ones([length, length], bool))[None, None]


# ----------------------------------------------------------------- DenseReluDense


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS, ids=LAYOUT_IDS)
def test_dense_relu_dense_matches_tf(mesh_shape, layout):
  x = _x()
  result, w = run_layer(tl.DenseReluDense(hidden_size=D_FF), _impl(mesh_shape, layout), x)
  assert sorted(result.values) == [SCOPE + "/DenseReluDense/wi/kernel",
                                   SCOPE + "/DenseReluDense/wo/kernel"]
  assert result.values[SCOPE + "/DenseReluDense/wi/kernel"].shape == (D_MODEL, D_FF)
  check_against_reference(
      result, w, x, lambda x, DenseReluDense_wi_kernel, DenseReluDense_wo_kernel:
      tf.nn.relu(x @ DenseReluDense_wi_kernel) @ DenseReluDense_wo_kernel)


def test_gated_gelu_dense_relu_dense_has_wi_0_and_wi_1():
  x = _x(1)
  layer = tl.DenseReluDense(hidden_size=D_FF, activation=["gelu", "linear"], use_bias=True)
  result, w = run_layer(layer, _impl(*LAYOUTS[1]), x)
  prefix = SCOPE + "/DenseReluDense/"
  assert sorted(result.values) == [prefix + n for n in (
      "wi_0/bias", "wi_0/kernel", "wi_1/bias", "wi_1/kernel", "wo/bias", "wo/kernel")]

  def ref(x, **v):
    p = lambda n: v["DenseReluDense_" + n]
    gate = tf.nn.gelu(x @ p("wi_0_kernel") + p("wi_0_bias"), approximate=True)
    return (gate * (x @ p("wi_1_kernel") + p("wi_1_bias"))) @ p("wo_kernel") + p("wo_bias")
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-4)


def test_dense_relu_dense_dropout_only_in_training_and_layout_independent():
  x = _x(2)
  layer = tl.DenseReluDense(hidden_size=D_FF, dropout_rate=0.5)
  train = [run_layer(layer, _impl(*case), x, mode=ModeKeys.TRAIN, with_grads=False)[0].out
           for case in LAYOUTS[:2]]
  evaluated = run_layer(layer, _impl(*LAYOUTS[0]), x, with_grads=False)[0].out
  np.testing.assert_allclose(train[0], train[1], rtol=1e-5, atol=1e-5)
  assert np.abs(train[0] - evaluated).max() > 1e-3


# ------------------------------------------------------------------ SelfAttention


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS, ids=LAYOUT_IDS)
def test_causal_self_attention_matches_tf(mesh_shape, layout):
  x = _x(3)
  layer = tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV)
  result, w = run_layer(layer, _impl(mesh_shape, layout), x)
  prefix = SCOPE + "/SelfAttention/"
  assert sorted(result.values) == sorted(prefix + n for n in "qkvo")
  assert result.values[prefix + "q"].shape == (D_MODEL, HEADS * D_KV)
  assert result.values[prefix + "o"].shape == (HEADS * D_KV, D_MODEL)

  def ref(x, SelfAttention_q, SelfAttention_k, SelfAttention_v, SelfAttention_o):
    return ref_attention(x, SelfAttention_q, SelfAttention_k, SelfAttention_v,
                         SelfAttention_o, mask=causal_mask(LENGTH))
  check_against_reference(result, w, x, ref)


def test_encoder_self_attention_is_bidirectional_and_scaling_unfolded():
  x = _x(4)
  layer = tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV,
                           fold_scaling_into_initializer=False)
  result, w = run_layer(layer, _impl(*LAYOUTS[1]), x, model=ENCODER)

  def ref(x, SelfAttention_q, SelfAttention_k, SelfAttention_v, SelfAttention_o):
    return ref_attention(x, SelfAttention_q * D_KV ** -0.5, SelfAttention_k,
                         SelfAttention_v, SelfAttention_o)
  check_against_reference(result, w, x, ref)


def test_initializer_scale_folds_d_kv_into_q():
  # q's stddev is (d_model * d_kv)**-0.5 when folded and d_model**-0.5 when not.
  big = 64
  x = np.zeros([BATCH, LENGTH, big], np.float32)
  stds = []
  for fold in (True, False):
    layer = tl.SelfAttention(num_heads=8, key_value_size=16,
                             fold_scaling_into_initializer=fold)
    result, _ = run_layer(layer, _impl("", ""), x, model=FakeModel(True, True, big),
                          with_grads=False)
    stds.append(result.values[SCOPE + "/SelfAttention/q"].std())
    k_std = result.values[SCOPE + "/SelfAttention/k"].std()
    np.testing.assert_allclose(k_std, big ** -0.5, rtol=0.1)
  np.testing.assert_allclose(stds[0], (big * 16) ** -0.5, rtol=0.1)
  np.testing.assert_allclose(stds[1], big ** -0.5, rtol=0.1)


def _packed_ids():
  segment = np.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 2, 2, 2]], np.int32)
  position = np.array([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 0, 1, 2]], np.int32)
  return segment, position


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS[:2], ids=LAYOUT_IDS[:2])
def test_packed_causal_self_attention_stays_in_segment(mesh_shape, layout):
  x = _x(5)
  segment, position = _packed_ids()
  shape = [batch_dim, length_dim]
  result, w = run_layer(tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV),
                        _impl(mesh_shape, layout), x,
                        imports={"sequence_id": (segment, shape),
                                 "position": (position, shape)})
  mask = ((segment[:, :, None] == segment[:, None, :]) &
          (position[:, None, :] <= position[:, :, None]))[:, None]

  def ref(x, SelfAttention_q, SelfAttention_k, SelfAttention_v, SelfAttention_o):
    return ref_attention(x, SelfAttention_q, SelfAttention_k, SelfAttention_v,
                         SelfAttention_o, mask=mask)
  check_against_reference(result, w, x, ref)


def test_packed_encoder_self_attention_masks_other_segments_only():
  x = _x(6)
  segment, _ = _packed_ids()
  result, w = run_layer(tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV),
                        _impl(*LAYOUTS[2]), x, model=ENCODER,
                        imports={"sequence_id": (segment, [batch_dim, length_dim])})
  mask = (segment[:, :, None] == segment[:, None, :])[:, None]

  def ref(x, SelfAttention_q, SelfAttention_k, SelfAttention_v, SelfAttention_o):
    return ref_attention(x, SelfAttention_q, SelfAttention_k, SelfAttention_v,
                         SelfAttention_o, mask=mask)
  check_against_reference(result, w, x, ref)


@pytest.mark.parametrize("layer_cls", ["SelfAttention", "LocalSelfAttention"])
def test_prefix_lm_priorities_give_full_attention_over_the_inputs(layer_cls):
  # Positions 0-2 are the inputs (priority 0, seen by all); the rest are causal.
  x = _x(23)
  priority = np.array([0, 0, 0, 3, 4, 5, 6, 7], np.int32)
  prefix_lm = FakeModel(False, True, D_MODEL)
  layer = getattr(tl, layer_cls)(num_heads=HEADS, key_value_size=D_KV)
  if layer_cls == "LocalSelfAttention":
    layer.radius = LENGTH
  result, w = run_layer(layer, _impl(*LAYOUTS[2]), x, model=prefix_lm,
                        imports={"read_priority": (priority, [length_dim]),
                                 "write_priority": (priority, [length_dim])})
  mask = (priority[None, :] <= priority[:, None])[None, None]
  assert not mask.all() and mask[:, :, 0, 2].all()

  def ref(x, **v):
    return ref_attention(x, *[v["%s_%s" % (layer_cls, n)] for n in "qkvo"], mask=mask)
  check_against_reference(result, w, x, ref)


def test_multi_query_attention_shares_one_key_value_head():
  x = _x(7)
  layer = tl.SelfAttention(num_heads=HEADS, num_memory_heads=1, key_value_size=D_KV)
  result, w = run_layer(layer, _impl(*LAYOUTS[1]), x)
  assert result.values[SCOPE + "/SelfAttention/k"].shape == (D_MODEL, D_KV)

  def ref(x, SelfAttention_q, SelfAttention_k, SelfAttention_v, SelfAttention_o):
    tile = lambda t: tf.tile(t, [1, HEADS])  # the one head, repeated for every query head
    return ref_attention(x, SelfAttention_q, tile(SelfAttention_k), tile(SelfAttention_v),
                         SelfAttention_o, mask=causal_mask(LENGTH))
  check_against_reference(result, w, x, ref)


def test_grouped_memory_heads_share_keys_within_a_group():
  x = _x(24)
  layer = tl.SelfAttention(num_heads=HEADS, num_memory_heads=2, key_value_size=D_KV)
  result, w = run_layer(layer, _impl("rows:2;cols:4", "heads:rows;d_kv:cols"), x)
  assert result.values[SCOPE + "/SelfAttention/k"].shape == (D_MODEL, 2 * D_KV)
  assert result.values[SCOPE + "/SelfAttention/q"].shape == (D_MODEL, HEADS * D_KV)

  def ref(x, SelfAttention_q, SelfAttention_k, SelfAttention_v, SelfAttention_o):
    # Query head h (memory-head major) uses memory head h // (HEADS // 2).
    def repeat(t):
      t = tf.reshape(t, [D_MODEL, 2, 1, D_KV])
      return tf.reshape(tf.tile(t, [1, 1, HEADS // 2, 1]), [D_MODEL, HEADS * D_KV])
    return ref_attention(x, SelfAttention_q, repeat(SelfAttention_k),
                         repeat(SelfAttention_v), SelfAttention_o, mask=causal_mask(LENGTH))
  check_against_reference(result, w, x, ref)


def test_uncombined_and_shared_kv_variables():
  x = _x(8)
  layer = tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV, shared_kv=True,
                           combine_dims=False)
  result, w = run_layer(layer, _impl(*LAYOUTS[1]), x)
  prefix = SCOPE + "/SelfAttention/"
  assert sorted(result.values) == [prefix + n for n in ("kv", "o", "q")]
  assert result.values[prefix + "q"].shape == (D_MODEL, HEADS, D_KV)
  assert result.values[prefix + "o"].shape == (HEADS, D_KV, D_MODEL)

  def ref(x, SelfAttention_q, SelfAttention_kv, SelfAttention_o):
    flat = lambda t: tf.reshape(t, [D_MODEL, HEADS * D_KV])
    return ref_attention(x, flat(SelfAttention_q), flat(SelfAttention_kv),
                         flat(SelfAttention_kv), tf.reshape(SelfAttention_o, [-1, D_MODEL]),
                         mask=causal_mask(LENGTH))
  check_against_reference(result, w, x, ref)


def test_attention_z_loss_goes_to_context_losses_in_training():
  x = _x(9)
  coeff = 1e-2
  layer = tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV, z_loss_coeff=coeff)
  result, _ = run_layer(layer, _impl(*LAYOUTS[1]), x, mode=ModeKeys.TRAIN,
                        with_grads=False)
  assert len(result.losses) == 1
  p = lambda n: tf.constant(result.values[SCOPE + "/SelfAttention/" + n])
  q = tf.einsum("bld,dhk->bhlk", x, tf.reshape(p("q"), [D_MODEL, HEADS, D_KV]))
  k = tf.einsum("bld,dhk->bhlk", x, tf.reshape(p("k"), [D_MODEL, HEADS, D_KV]))
  logits = tf.einsum("bhlk,bhmk->bhlm", q, k) + tf.where(causal_mask(LENGTH), 0.0, -1e9)
  expected = coeff * tf.reduce_mean(tf.square(tf.reduce_logsumexp(logits, -1)))
  np.testing.assert_allclose(result.losses[0], expected.numpy(), rtol=1e-5)
  assert not run_layer(layer, _impl("", ""), x, with_grads=False)[0].losses  # eval mode


def test_attention_dropout_is_layout_independent_and_train_only():
  x = _x(10)
  layer = tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV, dropout_rate=0.5)
  train = [run_layer(layer, _impl(*case), x, mode=ModeKeys.TRAIN, with_grads=False)[0].out
           for case in (LAYOUTS[0], LAYOUTS[2])]
  np.testing.assert_allclose(train[0], train[1], rtol=1e-5, atol=1e-5)
  evaluated = run_layer(layer, _impl("", ""), x, with_grads=False)[0].out
  assert np.abs(train[0] - evaluated).max() > 1e-3


def test_layer_in_a_scope_already_named_after_it_does_not_nest_it():
  x = _x(11)
  layer = tl.DenseReluDense(hidden_size=D_FF)
  result, _ = run_layer(layer, _impl("", ""), x, scope=SCOPE + "/DenseReluDense",
                        with_grads=False)
  assert sorted(result.values) == [SCOPE + "/DenseReluDense/wi/kernel",
                                   SCOPE + "/DenseReluDense/wo/kernel"]


def test_second_call_under_reuse_shares_variables():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, _x(12), [batch_dim, length_dim, model_dim])
  context = Context(CAUSAL, mesh, [batch_dim], length_dim, mtf.VariableDType())
  layer = tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV)
  with mtf.variable_scope(SCOPE):
    first = layer.call(context, x)
  with mtf.variable_scope(SCOPE, reuse=True):
    second = layer.call(context, x)
  assert len(graph.trainable_variables) == 4
  lowering = mtf.Lowering(graph, {mesh: _impl("", "")})
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(first).numpy(),
                                lowering.export_to_tf_tensor(second).numpy())


# --------------------------------------------------------------- EncDecAttention

MEMORY = 6
memory_length_dim = mtf.Dimension("memory_length", MEMORY)


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS[2:], ids=LAYOUT_IDS[2:])
def test_enc_dec_attention_matches_tf_and_masks_encoder_padding(mesh_shape, layout):
  x = _x(13)
  encoder = np.random.RandomState(14).normal(size=[BATCH, MEMORY, D_MODEL]).astype(
      np.float32)
  encoder_id = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32)
  result, w = run_layer(
      tl.EncDecAttention(num_heads=HEADS, key_value_size=D_KV), _impl(mesh_shape, layout),
      x, imports={"encoder_output": (encoder, [batch_dim, memory_length_dim, model_dim]),
                  "encoder_sequence_id": (encoder_id, [batch_dim, memory_length_dim])})
  prefix = SCOPE + "/EncDecAttention/"
  assert sorted(result.values) == sorted(prefix + n for n in "qkvo")
  mask = np.broadcast_to((encoder_id != 0)[:, None, None, :], [BATCH, 1, LENGTH, MEMORY])

  def ref(x, EncDecAttention_q, EncDecAttention_k, EncDecAttention_v, EncDecAttention_o):
    return ref_attention(x, EncDecAttention_q, EncDecAttention_k, EncDecAttention_v,
                         EncDecAttention_o, mask=mask, memory=tf.constant(encoder))
  check_against_reference(result, w, x, ref)


def test_enc_dec_attention_with_packed_segments_renames_encoder_length():
  # The encoder output may still carry its own "length" dim; the layer renames it.
  x = _x(15, length=LENGTH)
  encoder = np.random.RandomState(16).normal(size=[BATCH, LENGTH, D_MODEL]).astype(
      np.float32)
  decoder_id, _ = _packed_ids()
  encoder_id = np.array([[1, 1, 2, 2, 2, 2, 0, 0], [1, 1, 1, 2, 2, 2, 2, 2]], np.int32)
  shape = [batch_dim, length_dim]
  result, w = run_layer(
      tl.EncDecAttention(num_heads=HEADS, key_value_size=D_KV), _impl(*LAYOUTS[1]), x,
      imports={"encoder_output": (encoder, [batch_dim, length_dim, model_dim]),
               "encoder_sequence_id": (encoder_id, shape),
               "sequence_id": (decoder_id, shape)})
  mask = (decoder_id[:, :, None] == encoder_id[:, None, :])[:, None]

  def ref(x, EncDecAttention_q, EncDecAttention_k, EncDecAttention_v, EncDecAttention_o):
    return ref_attention(x, EncDecAttention_q, EncDecAttention_k, EncDecAttention_v,
                         EncDecAttention_o, mask=mask, memory=tf.constant(encoder))
  check_against_reference(result, w, x, ref)


def test_enc_dec_attention_without_encoder_output_names_the_layer():
  layer = tl.EncDecAttention(num_heads=HEADS, key_value_size=D_KV)
  layer.set_name("block_003/layer_001")
  with pytest.raises(mtf.MtfError, match="EncDecAttention.*block_003/layer_001.*"
                     "encoder_output"):
    run_layer(layer, _impl("", ""), _x(17))


# ------------------------------------------------------- relative position biases


def np_bucket(relative, bidirectional, num_buckets=32, max_distance=128):
  """The T5 bucketing, written independently in numpy."""
  out = np.zeros_like(relative)
  for index, r in np.ndenumerate(relative):
    n, base = -int(r), 0
    buckets = num_buckets
    if bidirectional:
      buckets //= 2
      if n < 0:
        base = buckets
      n = abs(n)
    else:
      n = max(n, 0)
    exact = buckets // 2
    if n < exact:
      out[index] = base + n
    else:
      large = exact + int(np.log(n / exact) / np.log(max_distance / exact) *
                          (buckets - exact))
      out[index] = base + min(large, buckets - 1)
  return out


@pytest.mark.parametrize("model", [CAUSAL, ENCODER], ids=["causal", "bidirectional"])
def test_relative_attention_bias_matches_tf(model):
  x = _x(18)
  num_buckets = 8
  layer = tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV,
                           relative_attention_type="bias",
                           relative_attention_num_buckets=num_buckets)
  layout = LAYOUTS[1] if model.autoregressive else LAYOUTS[0]
  result, w = run_layer(layer, _impl(*layout), x, model=model)
  table_name = SCOPE + "/SelfAttention/relative_attention_bias"
  assert result.values[table_name].shape == (HEADS, num_buckets)
  positions = np.arange(LENGTH)
  buckets = np_bucket(positions[None, :] - positions[:, None],
                      bidirectional=not model.autoregressive, num_buckets=num_buckets)
  assert len(np.unique(buckets)) > 3
  mask = causal_mask(LENGTH) if model.fully_autoregressive else None

  def ref(x, SelfAttention_q, SelfAttention_k, SelfAttention_v, SelfAttention_o,
          SelfAttention_relative_attention_bias):
    bias = tf.gather(SelfAttention_relative_attention_bias, buckets, axis=1)[None]
    return ref_attention(x, SelfAttention_q, SelfAttention_k, SelfAttention_v,
                         SelfAttention_o, mask=mask, bias=bias)
  check_against_reference(result, w, x, ref)


def test_bias_shared_uses_one_table_from_shared_params():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, _x(19), [batch_dim, length_dim, model_dim])
  shared = {}
  context = Context(CAUSAL, mesh, [batch_dim], length_dim, mtf.VariableDType(),
                    shared_params=shared)
  for i in range(2):
    with mtf.variable_scope("transformer/block_%03d/layer_000" % i):
      x = tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV,
                           relative_attention_type="bias_shared").call(context, x)
  tables = [v.name for v in graph.trainable_variables if "relative" in v.name]
  assert tables == ["transformer/block_000/layer_000/SelfAttention/relative_attention_bias"]
  assert shared["relative_attention_bias"].shape.dims[0].name == "heads"
  no_dict = Context(CAUSAL, mesh, [batch_dim], length_dim, mtf.VariableDType())
  with pytest.raises(mtf.MtfError, match="bias_shared.*shared_params"):
    tl.SelfAttention(relative_attention_type="bias_shared").call(no_dict, x)


def test_unknown_relative_attention_type_is_named():
  with pytest.raises(mtf.MtfError, match="relative_attention_type 'sinusoidal'"):
    tl.SelfAttention(relative_attention_type="sinusoidal")
  with pytest.raises(mtf.MtfError, match="'nope'"):
    tl.EncDecAttention(relative_attention_type="nope")


# ------------------------------------------------------------- LocalSelfAttention

LocalModel = collections.namedtuple(
    "LocalModel", ["fully_autoregressive", "autoregressive", "model_dim", "layout",
                   "mesh_shape"])


@pytest.mark.parametrize("mesh_shape,layout,causal", [
    ("", "", True),
    ("rows:2;cols:4", "length:rows;heads:cols", False),
], ids=["single", "length_split_2_heads_4_bidirectional"])
def test_local_self_attention_matches_windowed_tf(mesh_shape, layout, causal):
  x = _x(20)
  radius = 2
  model = LocalModel(causal, causal, D_MODEL, layout, mesh_shape)
  layer = tl.LocalSelfAttention(radius=radius, num_heads=HEADS, key_value_size=D_KV)
  result, w = run_layer(layer, _impl(mesh_shape, layout), x, model=model)
  i = np.arange(LENGTH)
  rel = i[None, :] - i[:, None]
  mask = (rel > -radius) & (rel <= radius)  # (p - radius, p + radius], as the original
  if causal:
    mask &= rel <= 0

  def ref(x, LocalSelfAttention_q, LocalSelfAttention_k, LocalSelfAttention_v,
          LocalSelfAttention_o):
    return ref_attention(x, LocalSelfAttention_q, LocalSelfAttention_k,
                         LocalSelfAttention_v, LocalSelfAttention_o, mask=mask[None, None])
  check_against_reference(result, w, x, ref)


def test_local_self_attention_respects_packed_segments():
  x = _x(21)
  segment, _ = _packed_ids()
  model = LocalModel(True, True, D_MODEL, "length:rows", "rows:2;cols:4")
  layer = tl.LocalSelfAttention(radius=3, num_heads=HEADS, key_value_size=D_KV)
  result, w = run_layer(layer, _impl("rows:2;cols:4", "length:rows"), x, model=model,
                        imports={"sequence_id": (segment, [batch_dim, length_dim])})
  i = np.arange(LENGTH)
  rel = i[None, :] - i[:, None]
  mask = ((rel <= 0) & (rel > -3))[None] & (segment[:, :, None] == segment[:, None, :])

  def ref(x, LocalSelfAttention_q, LocalSelfAttention_k, LocalSelfAttention_v,
          LocalSelfAttention_o):
    return ref_attention(x, LocalSelfAttention_q, LocalSelfAttention_k,
                         LocalSelfAttention_v, LocalSelfAttention_o, mask=mask[:, None])
  check_against_reference(result, w, x, ref)


# ------------------------------------------------------------ ParallelLayer and gin


def test_parallel_layer_sums_scaled_outputs():
  x = _x(22)
  layer = tl.ParallelLayer([tl.DenseReluDense(hidden_size=D_FF),
                            tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV)])
  result, w = run_layer(layer, _impl(*LAYOUTS[1]), x)

  def ref(x, **v):
    p = lambda n: v["ParallelLayer_" + n]
    ffn = tf.nn.relu(x @ p("parallel_layer_0_wi_kernel")) @ p(
        "parallel_layer_0_wo_kernel")
    att = ref_attention(x, *[p("parallel_layer_1_" + n) for n in "qkvo"],
                        mask=causal_mask(LENGTH))
    return (ffn + att) * 2 ** -0.5
  check_against_reference(result, w, x, ref)


def test_layers_are_gin_configurable_under_transformer_layers():
  gin.clear_config()
  try:
    gin.parse_config([
        "transformer_layers.SelfAttention.num_heads = 2",
        "transformer_layers.SelfAttention.key_value_size = 3",
        "transformer_layers.DenseReluDense.activation = ['gelu', 'linear']",
        "transformer_layers.LocalSelfAttention.radius = 5",
        "transformer_layers.EncDecAttention.num_heads = 6",
    ])
    attention_layer, ffn = tl.SelfAttention(), tl.DenseReluDense()
    local, enc_dec = tl.LocalSelfAttention(), tl.EncDecAttention()
  finally:
    gin.clear_config()
  assert (attention_layer.num_heads, attention_layer.key_value_size) == (2, 3)
  assert ffn.activation == ["gelu", "linear"]
  assert local.radius == 5
  assert enc_dec.num_heads == 6
  with pytest.raises(ValueError, match="no_such_param"):
    gin.parse_config("transformer_layers.SelfAttention.no_such_param = 1")
