"""The Evolved Transformer's layers (So et al. 2019), used inside a LayerStack whose
sublayers normalize the input and add the residual.

- `GatedLinearUnitLayer`: d_model -> d_model GLU, dense "glu_0" times sigmoid of "glu_1".
- `EncoderConvolutionalLayer`: a ReLU dense branch to 4 * d_model ("dense_layer") plus
  a ReLU 3-wide convolution branch to d_model / 2 ("conv1d", zero-padded to 4 * d_model),
  layer norm ("layer_norm"), then a 9-wide separable convolution to d_model / 2
  ("separable_conv1d"), zero-padded to d_model. Dropout on both branches in training.
- `DecoderAttentionLayer`: self-attention with 2 * base_num_heads heads ("self_attention")
  plus encoder-decoder attention with base_num_heads ("enc_dec_attention").
- `DecoderConvolutionalLayer`: causal separable convolutions, 11 wide to 2 * d_model
  with ReLU ("separable_conv_11x1") plus 7 wide to d_model / 2 ("separable_conv_7x1_1",
  zero-padded), layer norm, then 7 wide to d_model ("separable_conv_7x1_2").
The convolution layers need the whole sequence (no incremental decoding).
"""
import math

import gin
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import decoding
from models.transformer import transformer_layers
from models.transformer.context import incremental_aware
from models.transformer.transformer_layer import TransformerLayer


def _initializer(scale):
  """Truncated normal with variance scale / fan_in (all but the last axis of the shape)."""
  def init(shape, dtype=tf.float32, **unused_kwargs):
    fan_in = max(1, math.prod(list(shape)[:-1]))
    # 0.8796 is the stddev of a unit normal truncated to [-2, 2].
    stddev = math.sqrt(scale / fan_in) / 0.87962566103423978
    return tf.cast(tf.random.truncated_normal(shape, stddev=stddev), dtype)
  return init


def _check_full_sequence(layer, context, x):
  if context.length_dim not in x.shape.dims:
    raise mtf.ShapeError("%s: input %s has no length dim %s; the convolution layers of "
                         "the Evolved Transformer need whole sequences (no incremental "
                         "decoding)" % (type(layer).__name__, x.shape, context.length_dim),
                         dim=context.length_dim.name)


def _pad_channels(x, dim, to_dim):
  """x with its channel dim `dim` zero-padded at the end and renamed to `to_dim`."""
  x = mtf.pad(x, [0, to_dim.size - dim.size], dim.name)
  return mtf.rename_dimension(x, dim.name, to_dim.name)


def _dropout(context, x, rate):
  if context.train and rate > 0:
    return mtf.dropout(x, is_training=True, rate=rate)
  return x


@gin.configurable(module="evolved_transformer")
class GatedLinearUnitLayer(TransformerLayer):
  """A gated linear unit d_model -> d_model; kwargs go to mtf.layers.dense_product."""

  def __init__(self, *args, **kwargs):
    if args:
      raise mtf.MtfError("GatedLinearUnitLayer: pass dense_product options by keyword, "
                         "got positional %r" % (args,))
    self._kwargs = kwargs

  @incremental_aware
  def call(self, context, x, losses=None):
    """dense(x) * sigmoid(dense(x)) (position-wise, so cached decoding needs nothing)."""
    del losses
    model_dim = x.shape.dims[-1]
    inner = mtf.Dimension("_glu_input", model_dim.size)
    x = mtf.rename_dimension(x, model_dim.name, inner.name)
    return mtf.layers.dense_product(
        x, [inner], [model_dim], activation_functions=["linear", "sigmoid"],
        variable_dtype=context.variable_dtype, name="glu", **self._kwargs)


@gin.configurable(module="evolved_transformer")
class EncoderConvolutionalLayer(TransformerLayer):
  """The Evolved Transformer's encoder convolution block (see the module docstring)."""

  def __init__(self, d_model, dropout_rate, initializer_scale=1.0, norm_epsilon=1e-6):
    self._d_model = d_model
    self._dropout_rate = dropout_rate
    self._initializer_scale = initializer_scale
    self._norm_epsilon = norm_epsilon

  def call(self, context, x, losses=None):
    """Dense and convolution branches, layer norm, separable convolution."""
    del losses
    _check_full_sequence(self, context, x)
    model_dim = x.shape.dims[-1]
    init = _initializer(self._initializer_scale)
    vdt = context.variable_dtype
    wide = mtf.Dimension("hidden_ffn", 4 * self._d_model)
    left = mtf.layers.dense(x, wide, activation=mtf.relu, use_bias=True,
                            kernel_initializer=init, variable_dtype=vdt,
                            name="dense_layer")
    left = _dropout(context, left, self._dropout_rate)
    half = mtf.Dimension("conv_half", self._d_model // 2)
    right = mtf.relu(mtf.layers.conv1d(x, half, filter_size=3, padding="SAME",
                                       filter_initializer=init, variable_dtype=vdt,
                                       name="conv1d"))
    right = _dropout(context, right, self._dropout_rate)
    hidden = left + _pad_channels(right, half, wide)
    hidden = mtf.layers.layer_norm(hidden, wide, epsilon=self._norm_epsilon,
                                   name="layer_norm")
    out_half = mtf.Dimension("sep_conv_half", self._d_model // 2)
    hidden = mtf.layers.separable_conv1d(
        hidden, out_half, min_relative_pos=-4, max_relative_pos=4,
        depthwise_filter_initializer=init, pointwise_filter_initializer=init,
        variable_dtype=vdt, name="separable_conv1d")
    return _pad_channels(hidden, out_half, model_dim)


@gin.configurable(module="evolved_transformer")
class DecoderAttentionLayer(TransformerLayer):
  """Self-attention (2 * base_num_heads heads) plus encoder-decoder attention
  (base_num_heads heads), summed; the sublayers add the residual."""

  def __init__(self, base_num_heads):
    self._self_attention = transformer_layers.SelfAttention(num_heads=2 * base_num_heads)
    self._enc_dec_attention = transformer_layers.EncDecAttention(
        num_heads=base_num_heads)

  @property
  def supports_incremental_decoding(self):
    """Cached decoding runs both attentions from their caches."""
    return all(decoding.layer_supports_incremental(layer) for layer in (
        self._self_attention, self._enc_dec_attention))

  @incremental_aware
  def call(self, context, x, losses=None):
    """The sum of both attentions of x."""
    with mtf.variable_scope("self_attention"):
      y = self._self_attention.call(context, x, losses=losses)
    if context.encoder_output is None:
      return y
    with mtf.variable_scope("enc_dec_attention"):
      return y + self._enc_dec_attention.call(context, x, losses=losses)


@gin.configurable(module="evolved_transformer")
class DecoderConvolutionalLayer(TransformerLayer):
  """The Evolved Transformer's causal decoder convolution block (see the module
  docstring)."""

  def __init__(self, d_model, dropout_rate, initializer_scale=1.0, norm_epsilon=1e-6):
    self._d_model = d_model
    self._dropout_rate = dropout_rate
    self._initializer_scale = initializer_scale
    self._norm_epsilon = norm_epsilon

  def _causal_conv(self, x, out_dim, width, name, context):
    init = _initializer(self._initializer_scale)
    return mtf.layers.separable_conv1d(
        x, out_dim, min_relative_pos=1 - width, max_relative_pos=0,
        depthwise_filter_initializer=init, pointwise_filter_initializer=init,
        variable_dtype=context.variable_dtype, name=name)

  def call(self, context, x, losses=None):
    """Two causal separable-convolution branches, layer norm, a causal convolution."""
    del losses
    _check_full_sequence(self, context, x)
    model_dim = x.shape.dims[-1]
    wide = mtf.Dimension("hidden_conv_wide", 2 * self._d_model)
    half = mtf.Dimension("hidden_conv_half", self._d_model // 2)
    left = mtf.relu(self._causal_conv(x, wide, 11, "separable_conv_11x1", context))
    left = _dropout(context, left, self._dropout_rate)
    right = self._causal_conv(x, half, 7, "separable_conv_7x1_1", context)
    right = _dropout(context, right, self._dropout_rate)
    hidden = left + _pad_channels(right, half, wide)
    hidden = mtf.layers.layer_norm(hidden, wide, epsilon=self._norm_epsilon,
                                   name="layer_norm")
    out = mtf.Dimension("_%s_out" % model_dim.name, model_dim.size)
    hidden = self._causal_conv(hidden, out, 7, "separable_conv_7x1_2", context)
    return mtf.rename_dimension(hidden, out.name, model_dim.name)
