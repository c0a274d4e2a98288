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

# Every channel dim is named d_model, at each of its widths (8, 32, 16, 4), as in the
# original; splitting it splits them all.
CASES = [("placement", "", ""),
         ("placement", "rows:2;cols:4", "batch:rows;d_model:cols"),
         ("simd", "rows:2;cols:4", "batch:rows;d_model:cols")]
ATTENTION_CASES = [CASES[0], ("placement", "rows:2;cols:4", "batch:rows;heads:cols"),
                   CASES[2]]
CASE_IDS = ["single", "placement_dp_mp", "simd_dp_mp"]


def layer_norm(x, scale, bias):
  mean, variance = tf.nn.moments(x, [-1], keepdims=True)
  return (x - mean) * tf.math.rsqrt(variance + 1e-6) * scale + bias


def separable(x, v, scope, lo, hi):
  """The original's separable_conv1d from the variables v under scope: per-channel taps
  sum_k kernel_k * x[t + lo + k] (zeros past the ends) plus the tap-0 bias, then the
  pointwise dense layer."""
  p = lambda n: v[scope + "_separable_conv1d_" + n]
  length = x.shape[1]
  padded = tf.pad(x, [[0, 0], [-lo, hi], [0, 0]])
  taps = sum(p("depthwise_conv_hack_depthwise_dense_%d_kernel" % k) * padded[:, k:k + length]
             for k in range(hi - lo + 1))
  taps += p("depthwise_conv_hack_depthwise_dense_0_bias")
  return taps @ p("pointwise_dense_kernel") + p("pointwise_dense_bias")


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


def _relative(result, prefix):
  """{name under SCOPE/prefix: shape} of the layer's variables."""
  start = len(SCOPE) + 1 + len(prefix) + 1
  return {n[start:]: v.shape for n, v in result.values.items()}


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_encoder_convolutional_layer_matches_tf(case):
  x = _x(2)
  layer = et.EncoderConvolutionalLayer(d_model=D_MODEL, dropout_rate=0.1)
  result, w = run_layer(layer, mtf_testing.backend_mesh_impl(*case), x)
  shapes = _relative(result, "EncoderConvolutionalLayer")
  assert shapes["conv1x1/dense/kernel"] == (D_MODEL, 4 * D_MODEL)
  assert shapes["conv3x1/conv2d/kernel"] == (1, 3, D_MODEL, D_MODEL // 2)
  assert shapes["sep_conv9x1/separable_conv1d/pointwise_dense/kernel"] == (
      4 * D_MODEL, D_MODEL // 2)
  assert len(shapes) == 2 + 2 + 9 + 3  # kernels, layer norm, taps, biases and pointwise

  def ref(x, **v):
    v = {n[len("EncoderConvolutionalLayer_"):]: t for n, t in v.items()}
    left = tf.nn.relu(x @ v["conv1x1_dense_kernel"])
    right = tf.nn.relu(tf.nn.conv2d(x[:, None], v["conv3x1_conv2d_kernel"], 1,
                                    "SAME")[:, 0])
    hidden = left + pad_to(right, 4 * D_MODEL)
    norm = "layer_prepostprocess_layer_norm_layer_norm_"
    hidden = layer_norm(hidden, v[norm + "scale"], v[norm + "bias"])
    return pad_to(separable(hidden, v, "sep_conv9x1", -4, 4), D_MODEL)
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_decoder_convolutional_layer_matches_tf(case):
  x = _x(3)
  layer = et.DecoderConvolutionalLayer(d_model=D_MODEL, dropout_rate=0.0)
  result, w = run_layer(layer, mtf_testing.backend_mesh_impl(*case), x)
  shapes = _relative(result, "DecoderConvolutionalLayer")
  # The reference is causal (taps t-width+1 .. t only); so the layer is.
  assert [len([n for n in shapes if n.startswith(scope) and n.endswith("/kernel")]) - 1
          for scope in ("sep_conv11x1/", "sep_conv7x1_1/", "sep_conv7x1_2/")] == [11, 7, 7]

  def ref(x, **v):
    v = {n[len("DecoderConvolutionalLayer_"):]: t for n, t in v.items()}
    left = tf.nn.relu(separable(x, v, "sep_conv11x1", -10, 0))
    right = separable(x, v, "sep_conv7x1_1", -6, 0)
    norm = "layer_prepostprocess_layer_norm_layer_norm_"
    hidden = layer_norm(left + pad_to(right, 2 * D_MODEL), v[norm + "scale"],
                        v[norm + "bias"])
    return separable(hidden, v, "sep_conv7x1_2", -6, 0)
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=CASE_IDS)
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
  names = sorted(_relative(result, "DecoderAttentionLayer"))
  # The original's names: its attentions open no class-name scope inside this layer.
  assert names == sorted(["enc_dec_attention/" + c for c in "qkvo"] +
                        ["self_attention/" + c for c in "qkvo"]), names

  def ref(x, **v):
    s = lambda c: v["DecoderAttentionLayer_self_attention_" + c]
    e = lambda c: v["DecoderAttentionLayer_enc_dec_attention_" + c]
    return (ref_attention(x, s("q"), s("k"), s("v"), s("o"), mask=causal_mask(LENGTH),
                          heads=8, d_kv=2) +
            ref_attention(x, e("q"), e("k"), e("v"), e("o"), memory=encoder, heads=4,
                          d_kv=2))
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-5)
