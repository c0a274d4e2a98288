"""The convolutional layers of the Transformer zoo against plain TF on one device, on
placement and SIMD dp+mp layouts of a 2x4 mesh; and their decoding states, stepped one
position at a time, against the full-length convolution."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import evolved_transformer as et
from models.transformer import transformer_layers as tl
from models.transformer.context import Context
from test_transformer_layers import (BATCH, CAUSAL, D_MODEL, LENGTH, SCOPE, batch_dim,
                                     check_against_reference, length_dim, model_dim, _x)
from test_zoo_attention_variants import BACKEND_IDS, BACKENDS, placement, run, shapes

LAYOUT = "batch:rows;d_model:cols"
IDS = np.array([[3, 4, 5, 6, 7, 8, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8]], np.int32)
MASK = (IDS != 0).astype(np.float32)[:, :, None]


def with_ids(mesh):
  return {"inputs": mtf.import_tf_tensor(mesh, IDS, [batch_dim, length_dim])}


def shift(x, r):
  """y[:, t] = x[:, t + r], zero beyond the ends."""
  if r == 0:
    return x
  zeros = tf.zeros_like(x[:, :abs(r)])
  return tf.concat([x[:, r:], zeros], 1) if r > 0 else tf.concat([zeros, x[:, :r]], 1)


SEPARABLE = {"depthwise_conv_hack/depthwise_dense_0/bias": (D_MODEL,),
             "pointwise_dense/kernel": (D_MODEL, D_MODEL), "pointwise_dense/bias": (D_MODEL,)}


def ref_separable(x, taps, min_pos, p):
  """taps[k] broadcastable to x: weights of relative position min_pos + k; p(name) the
  value of "separable_conv1d/<name>" (slashes as underscores)."""
  depthwise = tf.add_n([shift(x, min_pos + k) * t for k, t in enumerate(taps)])
  depthwise += p("separable_conv1d_depthwise_conv_hack_depthwise_dense_0_bias")
  return (depthwise @ p("separable_conv1d_pointwise_dense_kernel") +
          p("separable_conv1d_pointwise_dense_bias"))


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_conv1d_layer_matches_tf_and_masks_padding(backend):
  x = _x(70)
  layer = tl.Conv1DLayer(filter_size=3, output_size=D_MODEL, activation="relu")
  result, w = run(layer, backend("batch:rows"), x, extra=with_ids)
  assert shapes(result, "Conv1DLayer") == {"conv2d/kernel": (1, 3, D_MODEL, D_MODEL)}

  def ref(x, Conv1DLayer_conv2d_kernel):
    y = tf.nn.conv2d((x * MASK)[:, None], Conv1DLayer_conv2d_kernel, 1, "SAME")
    return tf.nn.relu(y[:, 0])
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_separable_conv1d_layer_matches_tf(backend):
  x = _x(71)
  layer = tl.SeparableConv1DLayer(min_relative_pos=-1, max_relative_pos=1,
                                  output_size=D_MODEL)
  result, w = run(layer, backend(LAYOUT), x, extra=with_ids)
  taps = "separable_conv1d/depthwise_conv_hack/depthwise_dense_%d/kernel"
  assert shapes(result, "SeparableConv1DLayer") == {
      **{taps % k: (D_MODEL,) for k in range(3)},
      **{"separable_conv1d/" + n: s for n, s in SEPARABLE.items()}}

  def ref(x, **v):
    p = lambda n: v["SeparableConv1DLayer_" + n]
    kernels = [p(taps.replace("/", "_") % k) for k in range(3)]
    return ref_separable(x * MASK, kernels, -1, p)
  check_against_reference(result, w, x, ref)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_lightweight_conv_softmaxes_repeated_taps(backend):
  x = _x(72)
  layer = tl.LightweightConv1DLocalAttn(min_relative_pos=-2, max_relative_pos=0,
                                        output_size=D_MODEL, num_unique_depth_filters=2)
  result, w = run(layer, backend(LAYOUT), x, extra=with_ids)
  names = shapes(result, "LightweightConv1DLocalAttn")
  assert names == {"kernel_0": (4,), "kernel_1": (4,), "kernel_2": (4,),
                   **{"separable_conv1d/" + n: s for n, s in SEPARABLE.items()}}

  def ref(x, **v):
    p = lambda n: v["LightweightConv1DLocalAttn_" + n]
    taps = tf.nn.softmax(tf.stack([tf.tile(p("kernel_%d" % k), [2]) for k in range(3)]),
                         axis=0)
    return ref_separable(x * MASK, tf.unstack(taps), -2, p)
  check_against_reference(result, w, x, ref)


def _dynamic_taps(x, v, prefix):
  logits = [tf.tile(x @ v[prefix + "dense_%d_kernel" % k] + v[prefix + "dense_%d_bias" % k],
                    [1, 1, 2]) for k in range(3)]
  return tf.unstack(tf.nn.softmax(tf.stack(logits), axis=0))


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_dynamic_conv_predicts_taps_from_each_position(backend):
  x = _x(73)
  layer = tl.DynamicConv1DLocalAttn(min_relative_pos=-2, max_relative_pos=0,
                                    output_size=D_MODEL, num_unique_depth_filters=2)
  result, w = run(layer, backend(LAYOUT), x, extra=with_ids)
  names = shapes(result, "DynamicConv1DLocalAttn")
  assert names["dense_1/kernel"] == (D_MODEL, 4) and names["dense_1/bias"] == (4,)

  def ref(x, **v):
    p = lambda n: v["DynamicConv1DLocalAttn_" + n]
    return ref_separable(x * MASK, _dynamic_taps(x, v, "DynamicConv1DLocalAttn_"), -2, p)
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_local_conv_attn_block_gates_convolves_and_projects(backend):
  x = _x(74)
  layer = tl.LocalConvAttnBlock(min_relative_pos=-1, max_relative_pos=1,
                                output_size=D_MODEL, num_unique_depth_filters=4,
                                attention_type="dynamic_conv")
  result, w = run(layer, backend(LAYOUT), x, extra=with_ids)
  names = shapes(result, "LocalConvAttnBlock")
  assert names["glu_0/kernel"] == names["glu_1/kernel"] == (D_MODEL, D_MODEL)
  assert names["op_projection/kernel"] == (D_MODEL, D_MODEL)
  assert names["dense_0/kernel"] == (D_MODEL, 2)

  def ref(x, **v):
    p = lambda n: v["LocalConvAttnBlock_" + n]
    gated = (x @ p("glu_0_kernel")) * tf.sigmoid(x @ p("glu_1_kernel"))
    logits = [tf.tile(gated @ p("dense_%d_kernel" % k) + p("dense_%d_bias" % k), [1, 1, 4])
              for k in range(3)]
    taps = tf.unstack(tf.nn.softmax(tf.stack(logits), axis=0))
    conv = ref_separable(gated * MASK, taps, -1, p)
    return conv @ p("op_projection_kernel")
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-5)


def test_conv_layer_arguments_are_checked():
  with pytest.raises(mtf.MtfError, match="unknown attention_type 'strided'"):
    tl.LocalConvAttnBlock(-1, 1, 8, attention_type="strided")
  with pytest.raises(mtf.MtfError, match="num_unique_depth_filters=3 does not divide"):
    tl.LightweightConv1DLocalAttn(-1, 1, 8, num_unique_depth_filters=3)
  with pytest.raises(mtf.MtfError, match="max_relative_pos -2 < min_relative_pos 1"):
    tl.SeparableConv1DLayer(1, -2, 8)


# ------------------------------------------------------------------ decoding states

START = 3


@pytest.mark.parametrize("layer_fn,offset", [
    (lambda: tl.SeparableConv1DLayer(-2, 0, D_MODEL), 0),
    # "SAME" padding centres the filter: a step's output is the full one a step back.
    (lambda: tl.Conv1DLayer(filter_size=3, output_size=D_MODEL), 1),
    # Three causal separable convolutions and a layer norm, each decoding from its state.
    (lambda: et.DecoderConvolutionalLayer(D_MODEL, dropout_rate=0.0), 0),
], ids=["separable_causal", "conv1d_centred", "evolved_decoder_block"])
def test_incremental_steps_match_the_full_convolution(layer_fn, offset):
  x_value = _x(75)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, x_value, [batch_dim, length_dim, model_dim])
  layer = layer_fn()
  states = []
  first = Context(CAUSAL, mesh, [batch_dim], length_dim, mtf.VariableDType(),
                  mode="first_part", new_states=states, initial_position=START)
  with mtf.variable_scope(SCOPE):
    full = layer.call(first, x)
  made = len(graph.trainable_variables)
  steps = []
  for t in range(START, LENGTH):
    step = Context(CAUSAL, mesh, [batch_dim], length_dim, mtf.VariableDType(),
                   mode="incremental", states=states, new_states=[], position=t)
    x_t = mtf.reduce_sum(mtf.slice(x, t, 1, "length"),
                         reduced_dim=mtf.Dimension("length", 1))
    with mtf.variable_scope(SCOPE, reuse=True):
      steps.append(layer.call(step, x_t))
    states = step.new_states
  assert len(graph.trainable_variables) == made  # the steps made no variables
  lowering = mtf.Lowering(graph, {mesh: placement("batch:rows")})
  full_value = lowering.export_to_tf_tensor(full).numpy()
  got = np.stack([lowering.export_to_tf_tensor(s).numpy() for s in steps], 1)
  np.testing.assert_allclose(got, full_value[:, START - offset:LENGTH - offset],
                             rtol=1e-5, atol=1e-5)


def test_first_part_state_holds_the_inputs_before_the_start():
  x_value = _x(76)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, x_value, [batch_dim, length_dim, model_dim])
  states = []
  context = Context(CAUSAL, mesh, [batch_dim], length_dim, mtf.VariableDType(),
                    mode="first_part", new_states=states, initial_position=2)
  tl.Conv1D().record_states_first_part_mode(context, x, filter_size=4)
  lowering = mtf.Lowering(graph, {mesh: placement("")})
  state = lowering.export_to_tf_tensor(states[0]).numpy()
  assert state.shape == (BATCH, 4, D_MODEL)
  np.testing.assert_array_equal(state[:, :2], 0.0)  # before the start: zeros
  np.testing.assert_array_equal(state[:, 2:], x_value[:, :2])
