"""The Evolved Transformer's layers (So et al. 2019, arXiv 1901.11117), used inside a
LayerStack whose sublayers normalize the input and add the residual. Structure and
variable names are the original library's, so its checkpoints load by name.

- `GatedLinearUnitLayer`: d_model -> d_model GLU, dense "glu_0" times sigmoid of "glu_1".
- `EncoderConvolutionalLayer`: in scope "conv1x1" a bias-free ReLU dense to 4 * d_model;
  in "conv3x1" a ReLU 3-wide Conv1DLayer to d_model / 2, zero-padded to 4 * d_model;
  their sum through layer_norm, then in "sep_conv9x1" a 9-wide SeparableConv1DLayer to
  d_model / 2, zero-padded to d_model. Dropout after each branch and the last conv.
- `DecoderAttentionLayer`: self-attention with 2 * base_num_heads heads ("self_attention")
  plus encoder-decoder attention with base_num_heads ("enc_dec_attention").
- `DecoderConvolutionalLayer`: causal SeparableConv1DLayers, 11 wide to 2 * d_model with
  ReLU ("sep_conv11x1") plus 7 wide to d_model / 2 ("sep_conv7x1_1", zero-padded), layer
  norm, then 7 wide to d_model ("sep_conv7x1_2"). Its convolutions end at the current
  position, so it decodes incrementally from their cached inputs.
The channel dims keep the model dim's name at every width, as in the original.
"""

import gin

import mesh_tf as mtf
from models.transformer import decoding
from models.transformer import transformer_layers
from models.transformer.context import incremental_aware
from models.transformer.transformer_layer import TransformerLayer


def _pad_channels(x, size):
  """x with its last (channel) dim zero-padded at the end to size."""
  channels = x.shape.dims[-1]
  if channels.size > size:
    raise mtf.ShapeError("evolved_transformer: cannot pad channel dim %s of %s to the "
                         "smaller size %d" % (channels, x.name, size), tensor=x.name,
                         dim=channels.name)
  if channels.size == size:
    return x
  return mtf.pad(x, [0, size - channels.size], channels.name)


def _dropout(context, x, rate):
  """Dropout shared over the length dim (noise [batch dims..., channels]) in training."""
  if context.train and rate > 0:
    return mtf.dropout(x, is_training=True, rate=rate,
                       noise_shape=mtf.Shape(context.batch_dims + x.shape.dims[-1:]))
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
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon
    self._conv3x1 = transformer_layers.Conv1DLayer(
        filter_size=3, output_size=int(d_model / 2), activation="relu")
    self._sep_conv9x1 = transformer_layers.SeparableConv1DLayer(
        min_relative_pos=-4, max_relative_pos=4, output_size=int(d_model / 2),
        depthwise_filter_initializer_scale=initializer_scale,
        pointwise_filter_initializer_scale=initializer_scale)

  def call(self, context, x, losses=None):
    """Dense and convolution branches, layer norm, separable convolution."""
    with transformer_layers.class_scope(self):
      return self._call(context, x, losses)

  def _call(self, context, x, losses):
    model_dim = x.shape.dims[-1]
    hidden_dim = mtf.Dimension(model_dim.name, 4 * model_dim.size)
    with mtf.variable_scope("conv1x1"):
      left = mtf.layers.dense(x, new_dims=[hidden_dim], reduced_dims=[model_dim],
                              activation=mtf.relu, use_bias=False,
                              variable_dtype=context.variable_dtype)
      left = _dropout(context, left, self._dropout_rate)
    with mtf.variable_scope("conv3x1"):
      right = self._conv3x1.call(context, x, losses)
      right = _pad_channels(_dropout(context, right, self._dropout_rate), hidden_dim.size)
    hidden = left + right
    hidden = mtf.layers.layer_norm(hidden, hidden.shape.dims[-1],
                                   epsilon=self._norm_epsilon)
    with mtf.variable_scope("sep_conv9x1"):
      output = self._sep_conv9x1.call(context, hidden, losses)
      return _pad_channels(_dropout(context, output, self._dropout_rate), model_dim.size)


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
    """The sum of both attentions of x (self-attention alone without an encoder)."""
    with transformer_layers.class_scope(self):
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
    self._norm_epsilon = norm_epsilon

    def causal(width, output_size, activation="linear"):
      return transformer_layers.SeparableConv1DLayer(
          min_relative_pos=1 - width, max_relative_pos=0, output_size=output_size,
          depthwise_filter_initializer_scale=initializer_scale,
          pointwise_filter_initializer_scale=initializer_scale, activation=activation)
    self._sep_conv11x1 = causal(11, int(2 * d_model), "relu")
    self._sep_conv7x1_1 = causal(7, int(d_model / 2))
    self._sep_conv7x1_2 = causal(7, d_model)

  @property
  def supports_incremental_decoding(self):
    """Every convolution ends at the current position."""
    return True

  @incremental_aware
  def call(self, context, x, losses=None):
    """Two causal separable-convolution branches, layer norm, a causal convolution."""
    with transformer_layers.class_scope(self):
      return self._call(context, x, losses)

  def _call(self, context, x, losses):
    with mtf.variable_scope("sep_conv11x1"):
      left = _dropout(context, self._sep_conv11x1.call(context, x, losses),
                      self._dropout_rate)
    with mtf.variable_scope("sep_conv7x1_1"):
      right = _dropout(context, self._sep_conv7x1_1.call(context, x, losses),
                       self._dropout_rate)
      right = _pad_channels(right, left.shape.dims[-1].size)
    hidden = left + right
    hidden = mtf.layers.layer_norm(hidden, hidden.shape.dims[-1],
                                   epsilon=self._norm_epsilon)
    with mtf.variable_scope("sep_conv7x1_2"):
      return _dropout(context, self._sep_conv7x1_2.call(context, hidden, losses),
                      self._dropout_rate)
