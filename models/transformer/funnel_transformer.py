"""The Funnel-Transformer encoder (Dai et al. 2020): `FunnelTransformerLayerStack` and
`BitransformerFunnel`.

Block i of the stack owns block_param_size[i] layers of n_submodules TransformerLayers
and runs them block_repeat_size[i] times with the same weights; the submodules are
renamed "funnel_block_<i>/param_idx_<j>/submodule_<k>", as in the original. In every
block after the first, the output of its first attention submodule is pooled along the
length over windows of pooling_size, and the context follows (`update_context`).
"""
import gin
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.context import ModeKeys
from models.transformer.layer_stack import LayerStack, _record_output
from models.transformer.transformer import Bitransformer


def _window_dims(length_dim, pooling_size, what):
  if length_dim.size % pooling_size:
    raise mtf.ShapeError("%s: length dim %s=%d is not divisible by pooling_size %d" % (
        what, length_dim.name, length_dim.size, pooling_size), dim=length_dim.name)
  return (mtf.Dimension(length_dim.name, length_dim.size // pooling_size),
          mtf.Dimension("funnel_window", pooling_size))


def _windows(x, length_dim, pooling_size, what):
  """x with its length dim cut into [pooled length, window]."""
  pooled, window = _window_dims(length_dim, pooling_size, what)
  dims = x.shape.dims
  i = dims.index(length_dim)
  return mtf.reshape(x, dims[:i] + [pooled, window] + dims[i + 1:]), window


def pool_length(x, length_dim, pooling_size, pooling_type="mean"):
  """x pooled over windows of pooling_size consecutive positions of length_dim."""
  y, window = _windows(x, length_dim, pooling_size, "pool_length of %s" % x.name)
  if pooling_type == "mean":
    return mtf.reduce_mean(y, reduced_dim=window)
  if pooling_type == "max":
    return mtf.reduce_max(y, reduced_dim=window)
  if pooling_type == "min":
    return mtf.reduce_min(y, reduced_dim=window)
  raise mtf.MtfError("pool_length: unknown pooling_type %r (choose 'mean', 'max' or "
                     "'min')" % (pooling_type,))


def first_of_windows(x, length_dim, pooling_size):
  """The value at the first position of every window of length_dim."""
  y, window = _windows(x, length_dim, pooling_size, "first_of_windows of %s" % x.name)
  first = mtf.slice(y, 0, 1, window.name)
  return mtf.reshape(first, y.shape.dims[:y.shape.dims.index(window)] +
                     y.shape.dims[y.shape.dims.index(window) + 1:])


@gin.configurable(module="funnel_transformer")
class FunnelTransformerLayerStack(LayerStack):
  """A layer stack that pools the length between blocks (see the module docstring).

  Args:
    layers: the TransformerLayers, block after block.
    n_blocks: the number of blocks.
    block_param_size: list, the layers (of n_submodules each) with own weights per block.
    block_repeat_size: list, how many times each block runs its layers.
    pooling_size: the pooling window.
    sublayers_initial, sublayers_per_layer, sublayers_final: as LayerStack.
    pooling_type: "mean", "max" or "min".
    n_submodules: TransformerLayers per layer (2: attention and feed-forward).
  """

  def __init__(self, layers, n_blocks=gin.REQUIRED, block_param_size=gin.REQUIRED,
               block_repeat_size=gin.REQUIRED, pooling_size=2, sublayers_initial=None,
               sublayers_per_layer=None, sublayers_final=None, pooling_type="mean",
               n_submodules=2):
    super().__init__(layers, sublayers_initial=sublayers_initial,
                     sublayers_per_layer=sublayers_per_layer,
                     sublayers_final=sublayers_final)
    if len(block_param_size) != n_blocks or len(block_repeat_size) != n_blocks:
      raise mtf.MtfError("FunnelTransformerLayerStack: block_param_size %r and "
                         "block_repeat_size %r need n_blocks=%d entries" % (
                             block_param_size, block_repeat_size, n_blocks))
    if len(self._layers) != sum(block_param_size) * n_submodules:
      raise mtf.MtfError(
          "FunnelTransformerLayerStack: %d layers, but block_param_size %r with "
          "n_submodules=%d needs %d" % (len(self._layers), block_param_size, n_submodules,
                                        sum(block_param_size) * n_submodules))
    if pooling_type not in ("mean", "max", "min"):
      raise mtf.MtfError("FunnelTransformerLayerStack: unknown pooling_type %r (choose "
                         "'mean', 'max' or 'min')" % (pooling_type,))
    self._n_blocks = n_blocks
    self._block_param_size = list(block_param_size)
    self._block_repeat_size = list(block_repeat_size)
    self._pooling_size = pooling_size
    self._pooling_type = pooling_type
    self._n_submodules = n_submodules
    self._context = None

  @property
  def context(self):
    """The context after the last call (its length dim and ids pooled)."""
    return self._context

  def set_context(self, context):
    """Remembers context (BitransformerFunnel reads the pooled sequence ids from it)."""
    self._context = context

  def update_context(self, context, x, pool_dim_name):
    """After pooling x along pool_dim_name: the context's length dim takes x's pooled
    size, positions keep their first entries (pooled position i is i, as in the
    original), and the sequence ids, subsequence ids, token ids and priorities take each
    window's first entry."""
    old = context.length_dim
    if old.name != pool_dim_name:
      raise mtf.ShapeError("FunnelTransformerLayerStack: pooling dim %r is not the "
                           "context's length dim %s" % (pool_dim_name, old))
    pooled_size = x.shape.get_dim_by_name(pool_dim_name).size
    size = self._pooling_size
    for attr in ("sequence_id", "subsequence_id", "inputs", "read_priority",
                 "write_priority"):
      value = getattr(context, attr, None)
      if isinstance(value, mtf.Tensor) and old in value.shape.dims:
        setattr(context, attr, first_of_windows(value, old, size))
    position = None if context.position_is_default else context.position
    context.length_dim = mtf.Dimension(pool_dim_name, pooled_size)
    if isinstance(position, mtf.Tensor) and old in position.shape.dims:
      context.position = mtf.slice(position, 0, pooled_size, pool_dim_name)
    else:
      context.position = mtf.range(context.mesh, context.length_dim, tf.int32)

  @staticmethod
  def layer_name(block, param, submodule):
    """The variable scope of a submodule, as the original names it (the names given to
    the layers are replaced)."""
    return "funnel_block_%03d/param_idx_%03d/submodule_%03d" % (block, param, submodule)

  def call(self, context, x):
    """LayerStack.call, with the blocks pooling the length (see _call_layers)."""
    x = super().call(context, x)
    self.set_context(context)
    return x

  def _call_layers(self, context, x):
    """Runs the blocks. In every block after the first, the output of the first
    submodule (the attention) of the block's first layer is pooled along the length,
    and the context follows; repeated layers of a block share their variables."""
    context.layer_index = 0
    first = 0
    n_calls = sum(p * r * self._n_submodules for p, r in zip(self._block_param_size,
                                                              self._block_repeat_size))
    for block in range(self._n_blocks):
      for param in range(self._block_param_size[block]):
        for repeat in range(self._block_repeat_size[block]):
          for sub in range(self._n_submodules):
            layer = self._layers[first + param * self._n_submodules + sub]
            layer.set_name(self.layer_name(block, param, sub))
            with mtf.variable_scope(layer.name, reuse=True if repeat else None):
              x = self._layer_fn(x, layer, context)
            if block > 0 and param == 0 and repeat == 0 and sub == 0:
              x = pool_length(x, context.length_dim, self._pooling_size,
                              self._pooling_type)
              self.update_context(context, x, context.length_dim.name)
            if context.layer_index != n_calls - 1:
              _record_output(context, x)
            context.layer_index += 1
      first += self._block_param_size[block] * self._n_submodules
    return x


@gin.configurable(module="funnel_transformer")
class BitransformerFunnel(Bitransformer):
  """A Bitransformer whose encoder (a FunnelTransformerLayerStack) pools the length:
  the decoder attends to the pooled encoder output, with the pooled sequence ids."""

  def encode(self, inputs, compute_loss=False, mode=ModeKeys.PREDICT,
             variable_dtype=mtf.VariableDType(tf.float32), encoder_sequence_id=None,
             encoder_position=None, num_microbatches=1):
    """Runs the pooling encoder; see Bitransformer.encode."""
    if encoder_sequence_id is None:
      encoder_sequence_id = mtf.minimum(inputs, 1)
    encoded, losses = super().encode(
        inputs, compute_loss, mode=mode, variable_dtype=variable_dtype,
        encoder_sequence_id=encoder_sequence_id, encoder_position=encoder_position,
        num_microbatches=num_microbatches)
    stack = self.encoder.layer_stack
    if not isinstance(stack, FunnelTransformerLayerStack):
      raise mtf.MtfError("BitransformerFunnel: the encoder's layer stack must be a "
                         "FunnelTransformerLayerStack, got %s" % type(stack).__name__)
    rename = mtf.layers.rename_length_to_memory_length
    context = stack.context
    encoded["encoder_sequence_id"] = rename(context.sequence_id)
    encoded["encoder_inputs"] = rename(context.inputs)
    return encoded, losses
