"""The Evolved Transformer's four layers: forward and every gradient against plain TF
from the same weights, on one device and dp+mp layouts (placement and SIMD emulation),
called the way a LayerStack calls them."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from test_transformer_layers import (  # pylint: disable=g-multiple-import
    D_MODEL, LENGTH, SCOPE, _x, batch_dim, causal_mask, check_against_reference,
    model_dim, ref_attention, run_layer)
from models.transformer import evolved_transformer as et

CASES = [("placement", "", ""),
         ("placement", "rows:2;cols:4", "batch:rows;hidden_ffn:cols;heads:cols"),
         ("simd", "rows:2;cols:4", "batch:rows;hidden_conv_wide:cols")]
CASE_IDS = ["single", "placement_dp_mp", "simd_dp_mp"]


def layer_norm(x, scale, bias):
  mean, variance = tf.nn.moments(x, [-1], keepdims=True)
  return (x - mean) * tf.math.rsqrt(variance + 1e-6) * scale + bias


def separable(x, depthwise, pointwise, bias, lo, hi):
  """sum_k depthwise[k] * x[t + lo + k] (zeros past the ends), then pointwise + bias."""
  length = x.shape[1]
  padded = tf.pad(x, [[0, 0], [-lo, hi], [0, 0]])
  taps = sum(depthwise[k] * padded[:, k:k + length] for k in range(hi - lo + 1))
  return taps @ pointwise + bias


def pad_to(x, size):
  return tf.pad(x, [[0, 0], [0, 0], [0, size - x.shape[-1]]])


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_gated_linear_unit_matches_tf(case):
  x = _x(1)
  result, w = run_layer(et.GatedLinearUnitLayer(), mtf_testing.backend_mesh_impl(*case), x)
  assert sorted(n[len(SCOPE) + 1:] for n in result.values) == [
      "glu_0/bias", "glu_0/kernel", "glu_1/bias", "glu_1/kernel"]

  def ref(x, **v):
    return ((x @ v["glu_0_kernel"] + v["glu_0_bias"]) *
            tf.sigmoid(x @ v["glu_1_kernel"] + v["glu_1_bias"]))
  check_against_reference(result, w, x, ref)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_encoder_convolutional_layer_matches_tf(case):
  x = _x(2)
  layer = et.EncoderConvolutionalLayer(d_model=D_MODEL, dropout_rate=0.1)
  result, w = run_layer(layer, mtf_testing.backend_mesh_impl(*case), x)
  shapes = {n[len(SCOPE) + 1:]: v.shape for n, v in result.values.items()}
  assert shapes["dense_layer/kernel"] == (D_MODEL, 4 * D_MODEL)
  assert shapes["separable_conv1d/depthwise_filter"] == (9, 4 * D_MODEL)
  assert shapes["separable_conv1d/pointwise_filter"] == (4 * D_MODEL, D_MODEL // 2)

  def ref(x, **v):
    left = tf.nn.relu(x @ v["dense_layer_kernel"] + v["dense_layer_bias"])
    right = tf.nn.relu(tf.nn.conv2d(x[:, None], v["conv1d_kernel"], 1, "SAME")[:, 0])
    hidden = left + pad_to(right, 4 * D_MODEL)
    hidden = layer_norm(hidden, v["layer_norm_layer_norm_layer_norm_scale"],
                        v["layer_norm_layer_norm_layer_norm_bias"])
    hidden = separable(hidden, v["separable_conv1d_depthwise_filter"],
                       v["separable_conv1d_pointwise_filter"],
                       v["separable_conv1d_bias"], -4, 4)
    return pad_to(hidden, D_MODEL)
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_decoder_convolutional_layer_matches_tf(case):
  x = _x(3)
  layer = et.DecoderConvolutionalLayer(d_model=D_MODEL, dropout_rate=0.0)
  result, w = run_layer(layer, mtf_testing.backend_mesh_impl(*case), x)

  def ref(x, **v):
    conv = lambda t, name, width: separable(
        t, v[name + "_depthwise_filter"], v[name + "_pointwise_filter"],
        v[name + "_bias"], 1 - width, 0)
    left = tf.nn.relu(conv(x, "separable_conv_11x1", 11))
    right = conv(x, "separable_conv_7x1_1", 7)
    hidden = layer_norm(left + pad_to(right, 2 * D_MODEL),
                        v["layer_norm_layer_norm_layer_norm_scale"],
                        v["layer_norm_layer_norm_layer_norm_bias"])
    return conv(hidden, "separable_conv_7x1_2", 7)
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-4)
  # The reference is causal (taps t-width+1 .. t only); so the layer is.
  shapes = {n[len(SCOPE) + 1:]: v.shape for n, v in result.values.items()}
  assert [shapes["separable_conv_%s/depthwise_filter" % n][0]
          for n in ("11x1", "7x1_1", "7x1_2")] == [11, 7, 7]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_decoder_attention_layer_matches_tf(case):
  gin.parse_config("transformer_layers.SelfAttention.key_value_size = 2")
  try:
    layer = et.DecoderAttentionLayer(base_num_heads=4)
  finally:
    gin.clear_config()
  memory_dim = mtf.Dimension("memory_length", 6)
  encoder = np.random.RandomState(9).normal(size=(2, 6, D_MODEL)).astype(np.float32)
  x = _x(4)
  result, w = run_layer(layer, mtf_testing.backend_mesh_impl(*case), x, imports={
      "encoder_output": (encoder, [batch_dim, memory_dim, model_dim])})
  names = sorted(n[len(SCOPE) + 1:] for n in result.values)
  assert names == sorted(["enc_dec_attention/EncDecAttention/" + c for c in "qkvo"] +
                        ["self_attention/SelfAttention/" + c for c in "qkvo"]), names

  def ref(x, **v):
    s = lambda c: v["self_attention_SelfAttention_" + c]
    e = lambda c: v["enc_dec_attention_EncDecAttention_" + c]
    return (ref_attention(x, s("q"), s("k"), s("v"), s("o"), mask=causal_mask(LENGTH),
                          heads=8, d_kv=2) +
            ref_attention(x, e("q"), e("k"), e("v"), e("o"), memory=encoder, heads=4,
                          d_kv=2))
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-5)


def test_convolution_layers_refuse_single_positions():
  from models.transformer.context import Context  # pylint: disable=g-import-not-at-top
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, [batch_dim, model_dim])  # one position, as in incremental decoding
  context = Context(None, mesh, [batch_dim], mtf.Dimension("length", LENGTH),
                    mtf.VariableDType(tf.float32), mode="eval")
  for layer in (et.EncoderConvolutionalLayer(D_MODEL, 0.0),
                et.DecoderConvolutionalLayer(D_MODEL, 0.0)):
    with pytest.raises(mtf.ShapeError, match="need whole sequences"):
      layer.call(context, x)
