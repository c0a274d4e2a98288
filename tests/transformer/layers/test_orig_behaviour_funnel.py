"""Issue 32, item 3: FunnelTransformerLayerStack as the original: the submodules are
renamed "funnel_block_<b>/param_idx_<p>/submodule_<s>" (so a list repeating the same
layer objects builds uniquely named variables instead of failing with "already exists"),
the first attention output of every later block is pooled, context.layer_outputs has
len(layers) + 1 entries, the pooled context has positions 0..pooled-1 and the windows'
first sequence ids; the stack's output is checked against plain TF from the same
weights. A layer without a set_name has name None, as the original's."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import test_utils
from models.transformer import funnel_transformer
from models.transformer import transformer
from models.transformer import transformer_layers

NAMES = ["outer_batch", "batch", "length", "d_model"]


def _dummy_model(mesh, shapes, block_param_size=(2, 2), block_repeat_size=(1, 1),
                 heads=8, kv=128, ff=4096):
  outer, batch, length, d_model = shapes
  length_dim = mtf.Dimension("length", length)
  submodules = [transformer_layers.SelfAttention(num_heads=heads, key_value_size=kv),
                transformer_layers.DenseReluDense(hidden_size=ff)]
  stack = funnel_transformer.FunnelTransformerLayerStack(
      layers=submodules * sum(block_param_size), n_blocks=2,
      block_param_size=list(block_param_size),
      block_repeat_size=list(block_repeat_size),
      sublayers_initial=[transformer.sublayer_dropout],
      sublayers_per_layer=[transformer.sublayer_rms_norm, transformer.sublayer_call_layer,
                           transformer.sublayer_dropout, transformer.sublayer_residual],
      sublayers_final=[transformer.sublayer_rms_norm, transformer.sublayer_dropout])
  model = transformer.Unitransformer(input_vocab_size=10, output_vocab_size=10,
                                     autoregressive=False, max_length=8, d_model=d_model,
                                     layer_stack=stack)
  context = transformer.Context(
      model=model, mesh=mesh,
      batch_dims=[mtf.Dimension("batch", batch), mtf.Dimension("outer_batch", outer)],
      length_dim=length_dim, variable_dtype=mtf.VariableDType(tf.float32),
      sequence_id=mtf.ones(mesh, mtf.Shape([length_dim])),
      position=mtf.range(mesh, length_dim, dtype=tf.int32))
  return stack, context


def _call(x, **kwargs):
  conv = test_utils.NumpyConverter()
  stack, context = _dummy_model(conv.mesh, x.shape, **kwargs)
  x_mtf = conv.convert_np_array_to_mtf_tensor(x, dim_names=NAMES, dtype=tf.float32)
  return conv, stack, context, stack.call(context, x_mtf)


def test_unnamed_layer_has_no_name():
  assert transformer_layers.SelfAttention().name is None


def test_repeated_layer_objects_get_unique_original_names():
  x = np.random.RandomState(0).randn(2, 3, 4, 5)
  conv, stack, context, out = _call(x)
  lowering, _ = conv.convert_mtf_tensor_to_tf_tensor(out)
  names = [v.name for v in lowering.graph.all_variables]
  attention = sorted({n.rsplit("/", 2)[0] for n in names if "/SelfAttention/" in n})
  assert attention == ["funnel_block_%03d/param_idx_%03d/submodule_000" % (b, p)
                       for b in (0, 1) for p in (0, 1)]
  assert sum("/SelfAttention/" in n for n in names) == 4 * 4
  assert len(context.layer_outputs) == len(stack.layers) + 1
  assert context.length_dim == mtf.Dimension("length", 2)
  np.testing.assert_array_equal(conv.convert_mtf_tensor_to_np_array(context.position),
                                [0, 1])
  assert conv.convert_mtf_tensor_to_np_array(out).shape == (2, 3, 2, 5)


def test_padding_stays_zero_after_pooling():
  rng = np.random.RandomState(1)
  x = rng.randn(2, 3, 4, 5)
  x[:, :, -2:, :] = 0
  conv = test_utils.NumpyConverter()
  stack, context = _dummy_model(conv.mesh, x.shape)
  sequence_id = np.ones_like(x, dtype=np.int32)
  sequence_id[:, :, -2:, :] = 0
  context.sequence_id = conv.convert_np_array_to_mtf_tensor(sequence_id, dim_names=NAMES)
  out = stack.call(context, conv.convert_np_array_to_mtf_tensor(x, dim_names=NAMES,
                                                                 dtype=tf.float32))
  got = conv.convert_mtf_tensor_to_np_array(out)
  np.testing.assert_allclose(got[:, :, -1, :], 0)
  assert np.abs(got[:, :, 0, :]).max() > 0


def _rms(x, scale):
  return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + 1e-6) * scale


@pytest.mark.parametrize("repeats", [(1, 1), (2, 1)])
def test_stack_matches_tf_with_pooling_after_first_attention(repeats):
  heads, kv, ff, d = 2, 3, 6, 4
  rng = np.random.RandomState(2)
  x = rng.randn(1, 2, 4, d).astype(np.float32)
  conv, stack, context, out = _call(x, block_param_size=(1, 1), block_repeat_size=repeats,
                                    heads=heads, kv=kv, ff=ff)
  lowering, got = conv.convert_mtf_tensor_to_tf_tensor(out)
  p = {v.name: tf.constant(laid.read_full()) for v, laid in lowering.variables.items()}

  def attention(h, prefix):
    w = lambda n: tf.reshape(p[prefix + n], [d, heads, kv])
    q = tf.einsum("obld,dhk->obhlk", h, w("q"))
    k = tf.einsum("obld,dhk->obhlk", h, w("k"))
    v = tf.einsum("obld,dhk->obhlk", h, w("v"))
    a = tf.nn.softmax(tf.einsum("obhlk,obhmk->obhlm", q, k))
    o = tf.einsum("obhlm,obhmk->obhlk", a, v)
    return tf.einsum("obhlk,hkd->obld", o, tf.reshape(p[prefix + "o"], [heads, kv, d]))

  def layer(h, block, sub):
    prefix = funnel_transformer.FunnelTransformerLayerStack.layer_name(block, 0, sub) + "/"
    normed = _rms(h, p[prefix + "rms_norm/scale"])
    if sub == 0:
      return h + attention(normed, prefix + "SelfAttention/")
    ffn = prefix + "DenseReluDense/"
    return h + tf.nn.relu(normed @ p[ffn + "wi/kernel"]) @ p[ffn + "wo/kernel"]

  h = tf.constant(x)
  for _ in range(repeats[0]):
    h = layer(layer(h, 0, 0), 0, 1)
  for r in range(repeats[1]):
    h = layer(h, 1, 0)
    if r == 0:  # pooled right after the block's first attention, as the original
      h = tf.reduce_mean(tf.reshape(h, [1, 2, 2, 2, d]), axis=3)
    h = layer(h, 1, 1)
  expected = _rms(h, p["rms_norm/scale"])
  np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-5)
