"""Fixup initialization (Zhang et al. 2019): residual networks trained without
normalization layers.

Each residual branch starts as the zero function: its last projection ("o", "wo") is
zeros, and the weights before it have their usual variance times num_blocks**-1 (the
paper's L**(-1 / (2m - 2)) weight scale for two-layer branches). Scalar biases go before
the projections and activations; the sublayers `sublayer_fixup_shift` /
`sublayer_fixup_scale` add a scalar bias and multiplier around each layer.
"""
import gin
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.graph.graph import current_scope_name
from models.transformer import attention
from models.transformer import core_layers
from models.transformer import transformer_layers
from models.transformer.context import incremental_aware
from models.transformer.transformer_layer import TransformerLayer

_INITS = {"he": (2.0, "fan_in"), "glorot": (1.0, "fan_avg")}
_DISTRIBUTIONS = {"uniform": "uniform", "normal": "untruncated_normal",
                  "truncated_normal": "truncated_normal"}


def fixup_initializer(default_init, init_distribution, num_blocks=None):
  """A DenseInitializer: He or Glorot variance, times 1 / num_blocks when given."""
  if default_init not in _INITS:
    raise mtf.MtfError("fixup: default_init %r is not one of %s" % (
        default_init, sorted(_INITS)))
  if init_distribution not in _DISTRIBUTIONS:
    raise mtf.MtfError("fixup: init_distribution %r is not one of %s" % (
        init_distribution, sorted(_DISTRIBUTIONS)))
  scale, mode = _INITS[default_init]
  if num_blocks:
    scale /= float(num_blocks)
  return mtf.layers.VarianceScalingInitializer(
      scale=scale, mode=mode, distribution=_DISTRIBUTIONS[init_distribution])


def get_single_scalar_bias(x, name):
  """A scalar variable `name` (zero at the start) in the current scope."""
  return mtf.get_variable(x.mesh, name, mtf.Shape([]),
                          initializer=tf.zeros_initializer(), dtype=x.dtype)


def dense_product_fixup(x, reduced_dims, new_dims, kernel_initializer,
                        activation_functions=None, name="dense_product", **kwargs):
  """Like mtf.layers.dense_product, with a scalar bias ("<factor>_bias") added before each
  factor's activation; the factors are "<name>_<i>" (or `name` when there is one)."""
  activations = (activation_functions if isinstance(activation_functions, (list, tuple))
                 else [activation_functions])
  factors = []
  for i, activation in enumerate(activations):
    factor_name = name if len(activations) == 1 else "%s_%d" % (name, i)
    y = mtf.layers.dense(x, new_dims, reduced_dims=reduced_dims,
                         kernel_initializer=kernel_initializer, name=factor_name,
                         **kwargs)
    y += get_single_scalar_bias(y, factor_name + "_bias")
    factors.append(_activate(y, activation))
  out = factors[0]
  for f in factors[1:]:
    out *= f
  return out


def _activate(x, activation):
  if activation is None or activation == "linear":
    return x
  fn = activation if callable(activation) else getattr(mtf, activation, None)
  if not callable(fn):
    raise mtf.MtfError("dense_product_fixup: unknown activation %r" % (activation,))
  return fn(x)


def _scalar_sublayer(x, context, base, dim_name, initializer):
  """The layer's scalar `base` (stored as [dim_name:1], as the original stores it); a
  second one in the same scope is "<base>_1", and so on."""
  if not hasattr(context, "fixup_scalar_counts"):
    context.fixup_scalar_counts = {}
  counts = context.fixup_scalar_counts
  key = (current_scope_name(), base)
  n = counts.get(key, 0)
  counts[key] = n + 1
  name = base if n == 0 else "%s_%d" % (base, n)
  one = mtf.Dimension(dim_name, 1)
  var = mtf.get_variable(x.mesh, name, mtf.Shape([one]), initializer=initializer,
                         dtype=context.variable_dtype)
  return mtf.reduce_sum(mtf.cast(var, x.dtype), reduced_dim=one)


@gin.configurable(module="fixup_layers")
def sublayer_fixup_scale(x, layer_stack, context):
  """x times a scalar "fixup_scale_weight" (one at the start) of the layer's scope."""
  del layer_stack
  return x * _scalar_sublayer(x, context, "fixup_scale_weight", "single_scale",
                              tf.ones_initializer())


@gin.configurable(module="fixup_layers")
def sublayer_fixup_shift(x, layer_stack, context):
  """x plus a scalar "fixup_bias" (zero at the start) of the layer's scope; a second
  shift in the same layer is "fixup_bias_1", and so on."""
  del layer_stack
  return x + _scalar_sublayer(x, context, "fixup_bias", "single_bias",
                              tf.zeros_initializer())


def _combined(dims):
  return dims[0] if len(dims) == 1 else mtf.Dimension(dims[0].name, mtf.Shape(dims).size)


class AttentionParamsFixup(attention.AttentionParams):
  """AttentionParams with the Fixup initialization: q, k, v with the default_init
  variance (v also divided by num_blocks), o zeros."""

  def __init__(self, mesh, query_input_dim, memory_input_dim, output_dim, key_dim,
               value_dim, query_heads_dims, memory_heads_dims, variable_dtype,
               shared_kv=False, fold_scaling_into_initializer=False, num_blocks=None,
               default_init="he", init_distribution="uniform", **kwargs):
    self._num_blocks = num_blocks
    self._default_init = default_init
    self._init_distribution = init_distribution
    super().__init__(mesh, query_input_dim, memory_input_dim, output_dim, key_dim,
                     value_dim, query_heads_dims, memory_heads_dims, variable_dtype,
                     shared_kv=shared_kv,
                     fold_scaling_into_initializer=fold_scaling_into_initializer, **kwargs)

  def _fixup_var(self, name, input_dims, output_dims, initializer):
    shape = self.ensemble_dims + input_dims + output_dims
    stored = shape
    if self.combine_dims:
      stored = self.ensemble_dims + [_combined(input_dims), _combined(output_dims)]
    if initializer is None:
      init = tf.zeros_initializer()
    else:
      init = initializer(input_dims, output_dims)
    var = mtf.get_variable(self.mesh, name, mtf.Shape(stored), initializer=init,
                           dtype=self.variable_dtype)
    return mtf.reshape(var, mtf.Shape(shape)) if stored != shape else var

  def init_weights(self):
    """Creates q (unless no_query), k, v (or kv) and o with the Fixup initialization."""
    plain = fixup_initializer(self._default_init, self._init_distribution)
    scaled = fixup_initializer(self._default_init, self._init_distribution,
                               self._num_blocks)
    self.wq = None if self.no_query else self._fixup_var(
        "q", [self.query_input_dim], self.q_dims, plain)
    if self.shared_kv:
      self.wkv = self._fixup_var("kv", [self.memory_input_dim], self.k_dims, scaled)
      self.wk = self.wv = self.wkv
    else:
      self.wk = self._fixup_var("k", [self.memory_input_dim], self.k_dims, plain)
      self.wv = self._fixup_var("v", [self.memory_input_dim], self.v_dims, scaled)
    self.wo = self._fixup_var("o", self.o_dims, [self.output_dim], None)


class _FixupParamsMixin:
  """make_params giving AttentionParamsFixup."""

  def make_params(self, context, io_dim=None, memory_dim=None):
    """The layer's AttentionParamsFixup (creates its variables in the current scope)."""
    io_dim = io_dim or context.model.model_dim
    query_heads, memory_heads = core_layers._heads_dims(  # pylint: disable=protected-access
        self.num_heads, self.num_memory_heads, "fixup attention")
    return AttentionParamsFixup(
        context.mesh, io_dim, memory_dim or io_dim, io_dim, self.kv_dim, self.kv_dim,
        query_heads, memory_heads, context.variable_dtype, shared_kv=self.shared_kv,
        fold_scaling_into_initializer=self.fold_scaling_into_initializer,
        num_blocks=self.num_blocks, default_init=self.default_init,
        init_distribution=self.init_distribution, combine_dims=self.combine_dims,
        keep_query_heads_dims=self.keep_query_heads_dims)


@gin.configurable(module="fixup_layers")
class SelfAttentionFixup(_FixupParamsMixin, transformer_layers.SelfAttention):
  """SelfAttention with the Fixup initialization (AttentionParamsFixup)."""

  def __init__(self, num_blocks=gin.REQUIRED, default_init="glorot",
               init_distribution="uniform", **kwargs):
    kwargs.setdefault("fold_scaling_into_initializer", False)
    super().__init__(**kwargs)
    self.num_blocks = num_blocks
    self.default_init = default_init
    self.init_distribution = init_distribution


@gin.configurable(module="fixup_layers")
class EncDecAttentionFixup(_FixupParamsMixin, transformer_layers.EncDecAttention):
  """EncDecAttention with the Fixup initialization; kwargs as SelfAttentionFixup's."""

  def __init__(self, relative_attention_type=None, **kwargs):
    self.num_blocks = kwargs.pop("num_blocks", None)
    self.default_init = kwargs.pop("default_init", "glorot")
    self.init_distribution = kwargs.pop("init_distribution", "uniform")
    kwargs.setdefault("fold_scaling_into_initializer", False)
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)


@gin.configurable(module="fixup_layers")
class DenseReluDenseFixup(TransformerLayer):
  """DenseReluDense with the Fixup initialization: scalar biases before "wi" and "wo",
  wi with the default_init variance / num_blocks, wo zeros."""

  def __init__(self, hidden_size=4096, dropout_rate=0.0, activation="relu",
               use_bias=False, default_init="he", init_distribution="uniform",
               num_blocks=gin.REQUIRED):
    for name, value in list(locals().items()):  # each argument, as its attribute
      if name != "self":
        setattr(self, name, value)

  @incremental_aware
  def call(self, context, x, losses=None):
    """[batch..., length, d_model] -> the same shape (position-wise: cached decoding
    calls it on [batch..., d_model])."""
    del losses
    io_dim = x.shape.dims[-1]
    hidden_dim = mtf.Dimension("d_ff", self.hidden_size)
    x += get_single_scalar_bias(x, "wi_shift")
    h = dense_product_fixup(
        x, [io_dim], [hidden_dim],
        fixup_initializer(self.default_init, self.init_distribution, self.num_blocks),
        activation_functions=self.activation, name="wi", use_bias=self.use_bias,
        variable_dtype=context.variable_dtype)
    if context.train and self.dropout_rate:
      h = mtf.dropout(h, rate=self.dropout_rate, noise_shape=h.shape - [context.length_dim])
    h += get_single_scalar_bias(h, "wo_shift")
    return mtf.layers.dense(h, [io_dim], reduced_dims=[hidden_dim], use_bias=self.use_bias,
                            kernel_initializer=tf.zeros_initializer(),
                            variable_dtype=context.variable_dtype, name="wo")
