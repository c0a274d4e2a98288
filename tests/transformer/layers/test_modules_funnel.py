"""FunnelTransformerLayerStack and BitransformerFunnel: blocks with repeated (shared)
layers and length pooling after the first attention of every later block, forward and every gradient against plain TF
from the same weights (one device, dp+mp on placement and SIMD emulation); the pooled
context; an encoder-decoder whose decoder attends to the pooled encoder output."""
import collections

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from layers.layer_testing import check_layer
from models.transformer import funnel_transformer as ft
from models.transformer import transformer
from models.transformer import transformer_layers as tl
from models.transformer.context import Context

BATCH, LENGTH, D = mtf.Dimension("batch", 2), mtf.Dimension("length", 8), 8
D_DIM = mtf.Dimension("d_model", D)
HEADS, D_KV, D_FF = 2, 4, 8
CASES = [("placement", "", ""),
         ("placement", "rows:2;cols:4", "batch:rows;d_ff:cols"),
         ("simd", "rows:2;cols:4", "batch:rows;d_ff:cols")]
CASE_IDS = ["single", "placement_dp_mp", "simd_dp_mp"]
Model = collections.namedtuple("Model", ["model_dim", "autoregressive",
                                         "fully_autoregressive"])


def _layers(blocks):
  layers = []
  for b in range(blocks):
    attention = tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV)
    ffn = tl.DenseReluDense(hidden_size=D_FF)
    attention.set_name("block_%03d/layer_000" % b)
    ffn.set_name("block_%03d/layer_001" % b)
    layers += [attention, ffn]
  return layers


def _stack(pooling_type="mean", repeats=(2, 1)):
  return ft.FunnelTransformerLayerStack(
      _layers(2), n_blocks=2, block_param_size=[1, 1], block_repeat_size=list(repeats),
      pooling_size=2, pooling_type=pooling_type)


def rms(x, scale):
  return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + 1e-6) * scale


def attention(x, p, prefix):
  heads = lambda w: tf.reshape(w, [D, HEADS, D_KV])
  q = tf.einsum("bld,dhk->bhlk", x, heads(p[prefix + "q"]))
  k = tf.einsum("bld,dhk->bhlk", x, heads(p[prefix + "k"]))
  v = tf.einsum("bld,dhk->bhlk", x, heads(p[prefix + "v"]))
  o = tf.einsum("bhlm,bhmk->bhlk", tf.nn.softmax(tf.einsum("bhlk,bhmk->bhlm", q, k)), v)
  return tf.einsum("bhlk,hkd->bld", o, tf.reshape(p[prefix + "o"], [HEADS, D_KV, D]))


def tf_layer(x, p, block, submodule):
  prefix = "encoder/%s/" % ft.FunnelTransformerLayerStack.layer_name(block, 0, submodule)
  h = rms(x, p[prefix + "rms_norm/scale"])
  if submodule == 0:
    return x + attention(h, p, prefix + "SelfAttention/")
  ffn = prefix + "DenseReluDense/"
  return x + tf.nn.relu(h @ p[ffn + "wi/kernel"]) @ p[ffn + "wo/kernel"]


def tf_funnel(x, p, pool, repeats):
  for _ in range(repeats[0]):
    x = tf_layer(tf_layer(x, p, 0, 0), p, 0, 1)
  for r in range(repeats[1]):
    x = tf_layer(x, p, 1, 0)
    if r == 0:  # as the original: pooled after the block's first attention
      x = pool(tf.reshape(x, [2, 4, 2, D]), axis=2)
    x = tf_layer(x, p, 1, 1)
  return rms(x, p["encoder/rms_norm/scale"])


def _run(case, stack, reference):
  x = np.random.RandomState(0).normal(size=(2, 8, D)).astype(np.float32)
  contexts = []

  def build(xt):
    context = Context(Model(D_DIM, False, False), xt.mesh, [BATCH], LENGTH,
                      mtf.VariableDType(tf.float32), mode="eval",
                      position_is_default=True)
    contexts.append(context)
    with mtf.variable_scope("encoder"):
      return stack.call(context, xt)
  (got,), params = check_layer(mtf_testing.backend_mesh_impl(*case), [(x, [BATCH, LENGTH, D_DIM])], build,
                               lambda xs, p: reference(xs[0], p), rtol=1e-4, atol=1e-5)
  return got, params, contexts[0]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_funnel_stack_matches_tf(case):
  got, params, context = _run(case, _stack(),
                              lambda x, p: tf_funnel(x, p, tf.reduce_mean, (2, 1)))
  assert got.shape == (2, 4, D)
  assert context.length_dim == mtf.Dimension("length", 4)
  assert context.position.shape.dims == [mtf.Dimension("length", 4)]
  # Block 0 ran twice with one set of weights: q, k, v, o, wi, wo and two norms.
  assert sum(n.startswith("encoder/funnel_block_000/") for n in params) == 8, sorted(params)


def test_funnel_max_pooling_matches_tf():
  got, _, _ = _run(CASES[1], _stack("max", repeats=(1, 2)),
                   lambda x, p: tf_funnel(x, p, tf.reduce_max, (1, 2)))
  assert got.shape == (2, 4, D)


def test_funnel_configuration_errors():
  with pytest.raises(mtf.MtfError, match="needs 6"):
    ft.FunnelTransformerLayerStack(_layers(2), n_blocks=2, block_param_size=[2, 1],
                                   block_repeat_size=[1, 1])
  with pytest.raises(mtf.MtfError, match="pooling_type 'sum'"):
    ft.FunnelTransformerLayerStack(_layers(2), n_blocks=2, block_param_size=[1, 1],
                                   block_repeat_size=[1, 1], pooling_type="sum")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  odd = mtf.Dimension("length", 7)
  x = mtf.zeros(mesh, [BATCH, odd, D_DIM])
  with pytest.raises(mtf.ShapeError, match="length=7 is not divisible by pooling_size 2"):
    ft.pool_length(x, odd, 2)


# ------------------------------------------------------------ BitransformerFunnel
def _bitransformer():
  encoder = transformer.Unitransformer(
      layer_stack=ft.FunnelTransformerLayerStack(
          _layers(2), n_blocks=2, block_param_size=[1, 1], block_repeat_size=[1, 1]),
      d_model=D, input_vocab_size=16, output_vocab_size=None, autoregressive=False,
      max_length=8, vocab_divisor=8, name="encoder")
  layers = [tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV),
            tl.EncDecAttention(num_heads=HEADS, key_value_size=D_KV),
            tl.DenseReluDense(hidden_size=D_FF)]
  for i, layer in enumerate(layers):
    layer.set_name("block_000/layer_%03d" % i)
  decoder = transformer.Unitransformer(
      layer_stack=transformer.LayerStack(layers), d_model=D, input_vocab_size=16,
      output_vocab_size=16, autoregressive=True, max_length=8, vocab_divisor=8,
      name="decoder")
  return ft.BitransformerFunnel(encoder, decoder)


def _funnel_graph(with_decode=False):
  rng = np.random.RandomState(1)
  inputs = rng.randint(2, 16, size=(2, 8)).astype(np.int32)
  inputs[1, 5:] = 0  # padding: pooled windows 3 (ids 0, 0) and 2 (id, 0)
  targets = rng.randint(2, 16, size=(2, 8)).astype(np.int32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  model = _bitransformer()
  ins = mtf.import_tf_tensor(mesh, inputs, [BATCH, LENGTH])
  tgt = mtf.import_tf_tensor(mesh, targets, [BATCH, LENGTH])
  logits, loss = model.call_simple(ins, tgt, compute_loss=True, mode="eval")
  encoded, _ = model.encode(ins)
  grads = mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
  decoded = [model.decode(ins, max_decode_length=4)] if with_decode else []
  return graph, mesh, inputs, [logits, loss, encoded["encoder_sequence_id"],
                               encoded["encoder_output"]] + grads + decoded


def test_bitransformer_funnel_attends_to_the_pooled_encoder():
  graph, mesh, inputs, fetches = _funnel_graph(with_decode=True)
  assert fetches[3].shape.dims[1] == mtf.Dimension("memory_length", 4)
  lowering = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl(*CASES[0])})
  ref = [lowering.export_to_tf_tensor(t).numpy() for t in fetches]
  weights = {v.name: laid.read_full().numpy() for v, laid in lowering.variables.items()}
  np.testing.assert_array_equal(ref[2], np.minimum(inputs, 1)[:, ::2])
  # Pooled padding windows are zero in the encoder output.
  np.testing.assert_array_equal(ref[3][1, 3], 0.0)
  assert np.isfinite(ref[1]) and ref[1] > 0
  # Greedy decoding starts from the same pooled encoding as the teacher-forced pass.
  decoded, ref = ref[-1], ref[:-1]
  assert decoded.shape == (2, 4)
  np.testing.assert_array_equal(decoded[:, 0], ref[0][:, 0].argmax(-1))
  for case in CASES[1:]:
    graph, mesh, _, fetches = _funnel_graph()
    lowering = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl(*case)})
    for v, laid in lowering.variables.items():
      laid.assign_full(weights[v.name])
    for i, (t, r) in enumerate(zip(fetches, ref)):
      np.testing.assert_allclose(lowering.export_to_tf_tensor(t).numpy(), r, rtol=2e-4,
                                 atol=2e-5, err_msg="fetch %d on %s" % (i, case))
