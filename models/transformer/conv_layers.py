"""Convolutional Transformer layers over the length dim, with d_model as channels,
including the lightweight and dynamic convolutions of Wu et al. 2019; offered (and
gin-configurable) as transformer_layers.<Name>. As in the original, positions whose
context.inputs id is 0 are zeroed first, and a filter may reach across packed examples.
"""
import gin
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import MtfError, ShapeError
from models.transformer.context import incremental_aware
from models.transformer.transformer_layer import TransformerLayer, class_scope


def _mask_padding(context, x):
  """x zeroed where context.inputs (token ids) is 0; x itself without inputs, or when the
  inputs have dims x lacks (a whole sequence's ids given with one decoding step)."""
  inputs = getattr(context, "inputs", None)
  if not isinstance(inputs, mtf.Tensor) or any(d not in x.shape.dims
                                               for d in inputs.shape.dims):
    return x
  return x * mtf.cast(mtf.not_equal(inputs, 0), x.dtype)


def _activate(output, activation, what):
  """The mtf function named activation applied to output ("linear": none)."""
  if activation == "linear":
    return output
  fn = getattr(mtf, activation, None)
  if not callable(fn):
    raise MtfError("%s: unknown activation %r (an mtf function name or 'linear')" % (
        what, activation), rule=str(activation))
  return fn(output)


class Conv1D(TransformerLayer):
  """Base of the convolutional layers: the decoding states of a filter of filter_size
  positions (the last filter_size inputs of the layer, [batch..., length=filter_size,
  d_model]), kept in context.states between incremental steps."""

  def record_states_first_part_mode(self, context, x, filter_size,
                                    length_dim_name="length"):
    """Records the filter_size inputs before context.initial_position (zeros before
    the start) as this layer's state; x: [batch..., length, d_model]."""
    length_dim = x.shape.dims[-2]
    source_dim = mtf.Dimension("conv_source_length", length_dim.size)
    filter_dim = mtf.Dimension(length_dim_name, filter_size)
    position = mtf.range(context.mesh, source_dim, tf.int32)
    slot = mtf.range(context.mesh, filter_dim, tf.int32)
    start = 0 if context.initial_position is None else context.initial_position
    # State slot j holds input position initial_position - filter_size + j.
    select = mtf.cast(mtf.equal(position, slot + (start - filter_size)), x.dtype)
    state = mtf.einsum([mtf.rename_dimension(x, length_dim.name, source_dim.name), select],
                       output_shape=mtf.Shape(x.shape.dims[:-2] + [filter_dim] +
                                              x.shape.dims[-1:]))
    context.record_new_states([state])

  def record_states_incremental_mode(self, context, x, filter_size,
                                     length_dim_name="length"):
    """Appends this step's x [batch..., d_model] to the state read from
    context.states; records and returns the new state."""
    state, = context.get_states(1)
    filter_dim = mtf.Dimension(length_dim_name, filter_size)
    # The new input always goes to the last slot of the filter window.
    last = mtf.constant(x.mesh, filter_size - 1, shape=mtf.Shape(x.shape.dims[:-1]),
                        dtype=tf.int32)
    state = self.update_state(state, x, last, filter_dim, context.activation_dtype)
    context.record_new_states([state])
    return state

  def update_state(self, old_state, x, position, filter_dim, dtype):
    """old_state shifted one step back along filter_dim, plus x added at slot
    `position` ([batch...] ints; filter_size - 1 gives [x(i-k+1), ..., x(i)])."""
    shifted = mtf.shift(old_state, -1, filter_dim, wrap=False)
    slot = mtf.one_hot(position, filter_dim, dtype=dtype)
    return shifted + slot * mtf.cast(x, dtype)

  def _prepare(self, context, x, filter_size):
    """(the convolution's input in this mode, whether it is one decoding step: then the
    state of the last filter_size inputs). The states hold the inputs masked at padding,
    so cached decoding matches recomputing (unlike the original, which did not mask)."""
    x = _mask_padding(context, x)
    mode = getattr(context, "mode", None)
    if mode == "first_part":
      self.record_states_first_part_mode(context, x, filter_size)
    if mode == "incremental":
      return self.record_states_incremental_mode(context, x, filter_size), True
    return x, False


@gin.configurable(module="transformer_layers")
class Conv1DLayer(Conv1D):
  """A 1-D convolution (mtf.layers.conv1d, "SAME" padding, glorot-uniform kernel) of
  filter_size over the length dim, d_model channels in and output_size out, then the
  activation (the name of an mtf function, or "linear")."""

  def __init__(self, filter_size, output_size, activation="linear"):
    # pylint: disable=super-init-not-called
    self._filter_size = filter_size
    self._output_size = output_size
    self._activation = activation

  @property
  def filter_size(self):
    """The number of positions the filter covers."""
    return self._filter_size

  @property
  def supports_incremental_decoding(self):
    """Only a one-position filter: the "SAME" padding centres a wider filter on the
    position, so it reads later positions, which a decoder has not produced yet."""
    return self.filter_size == 1

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] -> [batch..., length, d_model=output_size]."""
    del losses
    with class_scope(self):
      x, one_step = self._prepare(context, x, self.filter_size)
      model_dim = x.shape.dims[-1]
      x = mtf.replace_dimensions(x, model_dim, mtf.Dimension("input_dim", model_dim.size))
      output = mtf.layers.conv1d(
          x, mtf.Dimension(model_dim.name, self._output_size),
          filter_size=self.filter_size, padding="VALID" if one_step else "SAME",
          # TF1's glorot-uniform, looked up now (a patched one is honoured); the
          # variables take the layer input's dtype, as the original's did.
          filter_initializer=tf.compat.v1.glorot_uniform_initializer(),
          variable_dtype=None, name="conv2d")  # one name on every call
      if one_step:  # one output position: drop the length dim of size 1
        output = mtf.reduce_sum(output, reduced_dim=output.shape.dims[-2])
      return _activate(output, self._activation, type(self).__name__)


@gin.configurable(module="transformer_layers")
class SeparableConv1DLayer(Conv1D):
  """A depthwise-separable 1-D convolution over the length dim: output position t
  sees inputs t + min_relative_pos .. t + max_relative_pos (e.g. -2..0 is causal),
  each channel with its own taps, then a pointwise projection to output_size, a bias
  and the activation. Variables in "separable_conv1d" (see mtf.layers.separable_conv1d)."""

  def __init__(self, min_relative_pos, max_relative_pos, output_size,
               depthwise_filter_initializer_scale=1.0,
               pointwise_filter_initializer_scale=1.0, activation="linear"):
    # pylint: disable=super-init-not-called
    if max_relative_pos < min_relative_pos:
      raise MtfError("%s: max_relative_pos %d < min_relative_pos %d" % (
          type(self).__name__, max_relative_pos, min_relative_pos))
    self._min_relative_pos = min_relative_pos
    self._max_relative_pos = max_relative_pos
    self._output_size = output_size
    self._depthwise_filter_initializer_scale = depthwise_filter_initializer_scale
    self._pointwise_filter_initializer_scale = pointwise_filter_initializer_scale
    self._activation = activation

  @property
  def filter_size(self):
    """max_relative_pos - min_relative_pos + 1."""
    return self._max_relative_pos - self._min_relative_pos + 1

  @property
  def supports_incremental_decoding(self):
    """Whether the filter ends at the current position (max_relative_pos 0), so one
    decoding step needs only the filter_size inputs kept in the state."""
    return self._max_relative_pos == 0

  @incremental_aware
  def call(self, context, x, losses=None, all_kernel_wts=None):
    """[batch..., length, d_model] -> [batch..., length, d_model=output_size];
    all_kernel_wts: one weight tensor per tap instead of the learned depthwise filter."""
    del losses
    with class_scope(self):
      return self.convolve(context, x, all_kernel_wts)

  def convolve(self, context, x, all_kernel_wts=None):
    """The computation of call, with the variables in the current scope."""
    x, one_step = self._prepare(context, x, self.filter_size)
    min_pos, max_pos = self._min_relative_pos, self._max_relative_pos
    if one_step and max_pos != 0:
      raise MtfError("%s: incremental decoding needs a filter ending at the current "
                     "position (max_relative_pos 0, got %d)" % (type(self).__name__,
                                                                max_pos))
    model_dim = x.shape.dims[-1]
    # Like the original's, these variables do not read context.variable_dtype: float32
    # master and slices, read in the input's dtype.
    output = mtf.layers.separable_conv1d(
        x, mtf.Dimension(model_dim.name, self._output_size), min_pos, max_pos,
        self._depthwise_filter_initializer_scale,
        self._pointwise_filter_initializer_scale, use_bias=True,
        kernel_depth_weights=all_kernel_wts,
        name="separable_conv1d")  # one name on every call (decoding calls it again)
    if one_step:
      last = mtf.Dimension(x.shape.dims[-2].name, 1)
      output = mtf.reduce_sum(mtf.slice(output, self.filter_size - 1, 1, last.name),
                              reduced_dim=last)
    return _activate(output, self._activation, type(self).__name__)


@gin.configurable(module="transformer_layers")
class Conv1DLocalAttn(SeparableConv1DLayer):
  """A separable convolution whose taps are softmax-normalised over the filter, the
  tap weights of d_model / num_unique_depth_filters channels repeated
  num_unique_depth_filters times across d_model. Subclasses say where a tap's weights
  come from (get_kernel_wt)."""

  def __init__(self, min_relative_pos, max_relative_pos, output_size,
               depthwise_filter_initializer_scale=1.0,
               pointwise_filter_initializer_scale=1.0, activation="linear",
               num_unique_depth_filters=1):
    super().__init__(min_relative_pos, max_relative_pos, output_size,
                     depthwise_filter_initializer_scale,
                     pointwise_filter_initializer_scale, activation)
    if output_size % num_unique_depth_filters:
      raise MtfError("%s: num_unique_depth_filters=%d does not divide output_size=%d" % (
          type(self).__name__, num_unique_depth_filters, output_size))
    self._num_unique_depth_filters = num_unique_depth_filters

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i, context,
                    variable_dtype, master_dtype=tf.float32, slice_dtype=tf.float32):
    """The weights of tap i, with dim repeated_kernel_dim."""
    raise NotImplementedError("%s.get_kernel_wt: use LightweightConv1DLocalAttn or "
                              "DynamicConv1DLocalAttn" % type(self).__name__)

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] -> [batch..., length, d_model=output_size]."""
    del losses
    with class_scope(self):
      return self.convolve(context, x, self.kernel_weights(context, x))

  def kernel_weights(self, context, x):
    """Each tap's weights [..., d_model], softmax-normalised over the taps."""
    model_dim = x.shape.dims[-1]
    if model_dim.size % self._num_unique_depth_filters:
      raise ShapeError("%s: num_unique_depth_filters=%d does not divide %s" % (
          type(self).__name__, self._num_unique_depth_filters, model_dim),
                       tensor=x.name, dim=model_dim.name)
    repeated_kernel_dim = mtf.Dimension(
        "repeated_kernel_dim", model_dim.size // self._num_unique_depth_filters)
    initializer = tf.random_normal_initializer(
        stddev=self._depthwise_filter_initializer_scale)
    weights = []
    for i in range(self.filter_size):
      w = self.get_kernel_wt(x, repeated_kernel_dim, initializer, i, context,
                             context.variable_dtype)
      w = mtf.concat([w] * self._num_unique_depth_filters, repeated_kernel_dim.name)
      weights.append(mtf.rename_dimension(w, repeated_kernel_dim.name, model_dim.name))
    stacked = mtf.stack(weights, "new_stack_dim")
    stack_dim = stacked.shape.get_dim_by_name("new_stack_dim")
    return mtf.unstack(mtf.softmax(stacked, reduced_dim=stack_dim), stack_dim)


@gin.configurable(module="transformer_layers")
class LightweightConv1DLocalAttn(Conv1DLocalAttn):
  """Lightweight convolution: tap i's weights are the variable "kernel_<i>"."""

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i, context,
                    variable_dtype, master_dtype=tf.float32, slice_dtype=tf.float32):
    """The variable kernel_<i> [repeated_kernel_dim]."""
    del context, master_dtype, slice_dtype
    return mtf.get_variable(x.mesh, "kernel_%d" % i, mtf.Shape([repeated_kernel_dim]),
                            initializer=kernel_initializer, dtype=variable_dtype)


@gin.configurable(module="transformer_layers")
class DynamicConv1DLocalAttn(Conv1DLocalAttn):
  """Dynamic convolution: tap i's weights at each position are a dense layer
  "dense_<i>" (kernel and bias) of that position's input."""

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i, context,
                    variable_dtype, master_dtype=tf.float32, slice_dtype=tf.float32):
    """dense_<i>(x): [batch..., length, repeated_kernel_dim]."""
    del master_dtype, slice_dtype
    return mtf.layers.dense(x, [repeated_kernel_dim], reduced_dims=[x.shape.dims[-1]],
                            expert_dims=[], kernel_initializer=kernel_initializer,
                            name="dense_%d" % i,
                            variable_dtype=variable_dtype or context.variable_dtype)


@gin.configurable(module="transformer_layers")
class LocalConvAttnBlock(TransformerLayer):
  """A gated linear unit ("glu_0" linear times sigmoid "glu_1", no biases), a
  lightweight (attention_type "lightweight_conv") or dynamic ("dynamic_conv")
  convolution, and a projection "op_projection"; all variables in this layer's
  scope."""

  def __init__(self, min_relative_pos, max_relative_pos, output_size,
               depthwise_filter_initializer_scale=1.0,
               pointwise_filter_initializer_scale=1.0, activation="linear",
               num_unique_depth_filters=1, attention_type="lightweight_conv"):
    classes = {"lightweight_conv": LightweightConv1DLocalAttn,
               "dynamic_conv": DynamicConv1DLocalAttn}
    if attention_type not in classes:
      raise MtfError("LocalConvAttnBlock: unknown attention_type %r (known: %s)" % (
          attention_type, sorted(classes)), rule=str(attention_type))
    self.conv_attn_layer = classes[attention_type](
        min_relative_pos, max_relative_pos, output_size,
        depthwise_filter_initializer_scale, pointwise_filter_initializer_scale,
        activation, num_unique_depth_filters)

  @property
  def supports_incremental_decoding(self):
    """Whether its convolution supports cached decoding (a causal filter)."""
    return self.conv_attn_layer.supports_incremental_decoding

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] -> the same shape."""
    del losses
    model_dim = x.shape.dims[-1]
    with class_scope(self):
      gated = mtf.layers.dense_product(
          mtf.rename_dimension(x, model_dim.name, "_" + model_dim.name),
          reduced_dims=[mtf.Dimension("_" + model_dim.name, model_dim.size)],
          new_dims=[model_dim], activation_functions=["linear", "sigmoid"],
          variable_dtype=context.variable_dtype, name="glu", use_bias=False)
      conv = self.conv_attn_layer
      attended = conv.convolve(context, gated, conv.kernel_weights(context, gated))
      return mtf.layers.dense(
          mtf.rename_dimension(attended, model_dim.name, "_" + model_dim.name),
          [model_dim], reduced_dims=[mtf.Dimension("_" + model_dim.name, model_dim.size)],
          use_bias=False, variable_dtype=context.variable_dtype, name="op_projection")
