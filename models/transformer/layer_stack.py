"""`LayerStack`: a list of TransformerLayers wrapped in configurable "sublayers".

A sublayer is a function `(x, layer_stack, context, ...) -> x`. The stack runs
`sublayers_initial` once, the `sublayers_per_layer` chain for every layer (by default
pre-norm residual: rms_norm -> call_layer -> dropout -> residual), then
`sublayers_final`. Variable names match the original's
("<model>/block_000/layer_000/SelfAttention/q", "<model>/rms_norm/scale", ...).
"""
import gin
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.transformer_layer import TransformerLayer, inside_layer_call


def _model_dim(context):
  return context.model.model_dim


def _ensemble_dims(context):
  return list(getattr(context.model, "ensemble_dims", []) or [])


def _scale(context, scope, dims, initializer):
  """The variable "<scope>/scale" [ensemble..., dims...]."""
  with mtf.variable_scope(scope):
    return mtf.get_variable(context.mesh, "scale", mtf.Shape(_ensemble_dims(context) + dims),
                            initializer=initializer, dtype=context.variable_dtype)


@gin.configurable(module="transformer")
def sublayer_call_layer(x, layer_stack, context):
  """Calls the current layer (inputs masked at padding) in its class-name scope."""
  x = sublayer_mask_padding(x, layer_stack, context)
  layer = context.current_layer
  # Always its own scope, even for a stack nested in a layer (a universal transformer's).
  with mtf.variable_scope(type(layer).__name__), inside_layer_call():
    y = layer.call(context, x)
  _check_layer_output(layer, x, y)
  return y


def _check_layer_output(layer, x, y):
  if not isinstance(y, mtf.Tensor) or y.shape != x.shape:
    raise mtf.ShapeError("layer %s (%s) returned %s for input shape %s; a layer must keep "
                         "its input's shape" % (layer.name, type(layer).__name__,
                                                getattr(y, "shape", y), x.shape),
                         op=layer.name, tensor=getattr(y, "name", None))


@gin.configurable(module="transformer")
def sublayer_mask_padding(x, layer_stack, context):
  """Zeroes x where context.sequence_id is 0 (padding of packed examples)."""
  del layer_stack
  if isinstance(context.sequence_id, mtf.Tensor):
    return x * mtf.cast(mtf.not_equal(context.sequence_id, 0), context.activation_dtype)
  return x


@gin.configurable(module="transformer")
def sublayer_rms_norm(x, layer_stack, context, epsilon=1e-6, name="rms_norm"):
  """x / rms(x over d_model) * scale; the variable is "<scope>/<name>/scale"."""
  del layer_stack
  model_dim = _model_dim(context)
  scale = _scale(context, name, [model_dim], tf.ones_initializer())
  variance = mtf.reduce_mean(mtf.square(x), reduced_dim=model_dim)
  return x * mtf.rsqrt(variance + epsilon) * scale


@gin.configurable(module="transformer")
def sublayer_scale_norm(x, layer_stack, context, epsilon=1e-6, name="scale_norm"):
  """Like rms_norm, but with a single learned scalar scale (per ensemble member)."""
  del layer_stack
  scale = _scale(context, name, [], tf.ones_initializer())
  variance = mtf.reduce_mean(mtf.square(x), reduced_dim=_model_dim(context))
  return x * mtf.rsqrt(variance + epsilon) * scale


@gin.configurable(module="transformer")
def sublayer_true_layer_norm(x, layer_stack, context, epsilon=1e-6):
  """Mean-and-variance layer norm over d_model with scale and bias."""
  del layer_stack
  model_dim = _model_dim(context)
  dims = _ensemble_dims(context) + [model_dim]
  with mtf.variable_scope("true_layer_norm"):
    scale = mtf.get_variable(context.mesh, "scale", mtf.Shape(dims),
                             initializer=tf.ones_initializer(),
                             dtype=context.variable_dtype)
    bias = mtf.get_variable(context.mesh, "bias", mtf.Shape(dims),
                            initializer=tf.zeros_initializer(),
                            dtype=context.variable_dtype)
  centered = x - mtf.reduce_mean(x, reduced_dim=model_dim)
  variance = mtf.reduce_mean(mtf.square(centered), reduced_dim=model_dim)
  return centered * mtf.rsqrt(variance + epsilon) * scale + bias


@gin.configurable(module="transformer")
def sublayer_residual(x, layer_stack, context):
  """Adds the current layer's input (the residual connection)."""
  del layer_stack
  return x + context.current_layer_input


@gin.configurable(module="transformer")
def sublayer_dropout(x, layer_stack, context, dropout_rate=0.0):
  """Dropout in training; one mask per (batch, d_model) entry, shared along length."""
  del layer_stack
  if context.train and dropout_rate > 0:
    noise_shape = mtf.Shape(list(context.batch_dims) + [_model_dim(context)])
    return mtf.dropout(x, rate=dropout_rate, noise_shape=noise_shape)
  return x


@gin.configurable(module="transformer")
def sublayer_annealed_dropout(x, layer_stack, context, init_dropout_rate=0.0,
                              start_step=None, end_step=None):
  """Dropout whose rate falls linearly from init_dropout_rate to 0 over the steps."""
  del layer_stack
  if context.train and init_dropout_rate > 0:
    return mtf.layers.annealed_dropout(x, True, start_step, end_step, init_dropout_rate)
  return x


@gin.configurable(module="transformer")
def sublayer_clip_activation_gradient(x, layer_stack, context, rms_norm=1.0):
  """Identity forward; clips the rms of the gradient flowing back through x."""
  del layer_stack, context
  return mtf.layers.clip_activation_gradient(x, rms_norm)


@gin.configurable(module="transformer")
def sublayer_rezero(x, layer_stack, context, initial_value=0.0):
  """x times a learned scalar "rezero/scale" (ReZero, starting at initial_value)."""
  del layer_stack
  return x * _scale(context, "rezero", [], tf.constant_initializer(initial_value))


@gin.configurable(module="transformer")
def sublayer_legacy_dropout(x, layer_stack, context):
  """Dropout at the stack's legacy dropout_rate."""
  return sublayer_dropout(x, layer_stack, context, dropout_rate=layer_stack.dropout_rate)


@gin.configurable(module="transformer")
def sublayer_legacy_rms_norm(x, layer_stack, context):
  """Per-layer rms norm of the legacy stack (scope "layer_norm")."""
  return sublayer_rms_norm(x, layer_stack, context, epsilon=layer_stack.norm_epsilon,
                           name="layer_norm")


@gin.configurable(module="transformer")
def sublayer_legacy_final_rms_norm(x, layer_stack, context):
  """Final rms norm of the legacy stack (scope "final_layer_norm")."""
  return sublayer_rms_norm(x, layer_stack, context, epsilon=layer_stack.norm_epsilon,
                           name="final_layer_norm")


def default_sublayers():
  """(initial, per_layer, final) sublayers of the original's defaults.gin."""
  return ([sublayer_dropout],
          [sublayer_rms_norm, sublayer_call_layer, sublayer_dropout, sublayer_residual],
          [sublayer_rms_norm, sublayer_dropout])


@gin.configurable(module="transformer")
class LayerStack(TransformerLayer):
  """A stack of TransformerLayers (their names give the variable scopes), each wrapped
  in the per-layer sublayers; sublayers_* None take the original's defaults.gin ones.
  dropout_rate and norm_epsilon (both or neither) select the legacy sublayers.
  """

  def __init__(self, layers, sublayers_initial=None, sublayers_per_layer=None,
               sublayers_final=None, dropout_rate=None, norm_epsilon=None,
               recompute_grads=False):
    self._layers = list(layers)
    self._recompute_grads = recompute_grads
    self.dropout_rate = dropout_rate
    self.norm_epsilon = norm_epsilon
    if (dropout_rate is None) != (norm_epsilon is None):
      raise mtf.MtfError(
          "LayerStack: dropout_rate=%r and norm_epsilon=%r must both be set (legacy mode) "
          "or both be None" % (dropout_rate, norm_epsilon))
    if dropout_rate is not None:
      given = [s for s in (sublayers_initial, sublayers_per_layer, sublayers_final)
               if s is not None]
      if given:
        raise mtf.MtfError("LayerStack: legacy dropout_rate/norm_epsilon cannot be "
                           "combined with explicit sublayers_* lists")
      sublayers_initial = [sublayer_legacy_dropout]
      sublayers_per_layer = [sublayer_legacy_rms_norm, sublayer_call_layer,
                             sublayer_legacy_dropout, sublayer_residual]
      sublayers_final = [sublayer_legacy_final_rms_norm, sublayer_legacy_dropout]
    initial, per_layer, final = default_sublayers()
    self._sublayers_initial = list(initial if sublayers_initial is None
                                   else sublayers_initial)
    self._sublayers_per_layer = list(per_layer if sublayers_per_layer is None
                                     else sublayers_per_layer)
    self._sublayers_final = list(final if sublayers_final is None else sublayers_final)

  def call(self, context, x):
    """Runs the initial sublayers, the layers (_call_layers), then the final sublayers."""
    x = self._call_sublayers(self._sublayers_initial, x, context)
    _record_output(context, x)
    x = self._call_layers(context, x)
    x = self._call_sublayers(self._sublayers_final, x, context)
    x = sublayer_mask_padding(x, self, context)
    _record_output(context, x)
    return x

  def _call_layers(self, context, x):
    """Every layer in its scope (recording each output but the last)."""
    context.layer_index = 0
    for lnum, layer in enumerate(self._layers):
      with mtf.variable_scope(layer.name or ""):
        if self._recompute_grads:
          def fn(x, layer=layer):
            return self._layer_fn(x, layer, context)
          x = mtf.recompute_grad(fn, [x])
        else:
          x = self._layer_fn(x, layer, context)
      if lnum != len(self._layers) - 1:
        _record_output(context, x)
      context.layer_index += 1
    return x

  def _call_sublayers(self, sublayers, x, context):
    for sublayer in sublayers:
      x = sublayer(x, self, context)
    return x

  def _layer_fn(self, x, layer, context):
    context.current_layer = layer
    context.current_layer_input = x
    y = self._call_sublayers(self._sublayers_per_layer, x, context)
    _check_layer_output(layer, x, y)
    return y

  @property
  def num_layers(self):
    """How many layers the stack holds."""
    return len(self._layers)

  @property
  def layers(self):
    """The list of layers."""
    return self._layers


def _record_output(context, x):
  if context.layer_outputs is not None:
    context.layer_outputs.append(x)


def _layer_instance(layer_cls):
  """A fresh layer from a class or factory; a given instance is copied."""
  if isinstance(layer_cls, TransformerLayer):
    import copy  # pylint: disable=g-import-not-at-top
    return copy.copy(layer_cls)
  return layer_cls()


def _layer_spec(entry):
  """(class, factory or instance, name or None, kwargs) of an entry of `layers`."""
  if not isinstance(entry, (list, tuple)):
    return entry, None, {}
  if len(entry) not in (2, 3) or not isinstance(entry[1], str) or (
      len(entry) == 3 and not isinstance(entry[2], dict)):
    raise mtf.MtfError("make_layer_stack: a layers entry must be a layer class or "
                       "[cls, \"name\"] or [cls, \"name\", {kwargs}], got %r" % (entry,))
  cls, name = entry[0], entry[1]
  kwargs = dict(entry[2]) if len(entry) == 3 else {}
  if kwargs and isinstance(cls, TransformerLayer):
    raise mtf.MtfError("make_layer_stack: entry %r gives kwargs to a layer instance; "
                       "give its class" % (entry,))
  return cls, name, kwargs


@gin.configurable(module="transformer")
def make_layer_stack(layers=gin.REQUIRED, layer_stack_cls=LayerStack, num_layers=6,
                     block_scope=True):
  """A layer_stack_cls of num_layers blocks, each a fresh instance of every layer.

  Each entry of `layers` is a layer class (or factory, or an instance, which is copied),
  or, as in the original, `[cls, "name"]` or `[cls, "name", {kwargs}]`. With block_scope
  layers are named "block_%03d/<name>" (unnamed: "layer_%03d", the index in the block);
  without, "<name>" or "layer_%03d" numbered through the stack.
  """
  specs = [_layer_spec(entry) for entry in layers]
  stack = []
  for block in range(num_layers):
    for n, (cls, name, kwargs) in enumerate(specs):
      layer = cls(**kwargs) if kwargs else _layer_instance(cls)
      if block_scope:
        layer.set_name("block_%03d/%s" % (block, name or "layer_%03d" % n))
      else:
        layer.set_name(name or "layer_%03d" % len(stack))
      stack.append(layer)
  return layer_stack_cls(stack)


@gin.configurable(module="transformer")
def sublayer_rms_norm_subsampled(x, layer_stack, context, percentage=100.0,
                                 epsilon=1e-6, name="layer_norm_subsampled"):
  """rms_norm whose mean square is taken over the first ceil(percentage% of d_model)
  features only; the scale covers all of d_model."""
  del layer_stack
  model_dim = _model_dim(context)
  if not 0 < percentage <= 100:
    raise mtf.MtfError("sublayer_rms_norm_subsampled: percentage %r is not in (0, 100]"
                       % (percentage,), dim=model_dim.name)
  scale = _scale(context, name, [model_dim], tf.ones_initializer())
  size = min(model_dim.size, -(-model_dim.size * percentage // 100))
  sample = mtf.slice(x, 0, int(size), model_dim.name)
  sample_dim = mtf.Dimension(model_dim.name, int(size))
  variance = mtf.reduce_mean(mtf.square(sample), reduced_dim=sample_dim)
  return x * mtf.rsqrt(variance + epsilon) * scale
