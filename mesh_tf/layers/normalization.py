"""Normalization layers: layer_norm, rms_norm and batch_norm.

Variable names follow the original library so its checkpoints load:
"<name>/layer_norm/layer_norm_scale" and ".../layer_norm_bias",
"<name>/rms_norm/rms_norm_scale", and for batch_norm "batch_norm_scale",
"batch_norm_bias", "bn_moving_mean", "bn_moving_variance" in scope `name`.
"""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import variable_scope
from mesh_tf.layers.scoping import layer_scope
from mesh_tf.ops.assign import assign
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import reduce as reduce_ops
from mesh_tf.ops.variables import get_variable
from mesh_tf.shapes import Shape, convert_to_dimension


def _check_dim(layer, x, dim):
  dim = convert_to_dimension(dim)
  if dim not in x.shape.dims:
    raise ShapeError("%s: dim %s is not a dim of input %s %s (dims: %s)" % (
        layer, dim, x.name, x.shape, x.shape.dimension_names),
                     op=layer, tensor=x.name, dim=dim.name)
  return dim


def layer_norm(x, dim, epsilon=1e-6, name="layer_prepostprocess"):
  """Normalizes x to zero mean and unit variance over dim, then scales and shifts.

  Variables "layer_norm_scale" (ones) and "layer_norm_bias" (zeros), shaped [dim], live
  in scope "<name>/layer_norm".
  """
  dim = _check_dim("layer_norm %r" % name, x, dim)
  with variable_scope(name + "/layer_norm"):
    scale = get_variable(x.mesh, "layer_norm_scale", Shape([dim]),
                         initializer=tf.ones_initializer(), activation_dtype=x.dtype)
    bias = get_variable(x.mesh, "layer_norm_bias", Shape([dim]),
                        initializer=tf.zeros_initializer(), activation_dtype=x.dtype)
    reduced_shape = x.shape - [dim]
    mean = reduce_ops.reduce_mean(x, output_shape=reduced_shape)
    centered = x - mean
    variance = reduce_ops.reduce_mean(ew.square(centered), output_shape=reduced_shape)
    return centered * ew.rsqrt(variance + epsilon) * scale + bias


def rms_norm(x, dim, epsilon=1e-6, name="rms_norm"):
  """x divided by its root mean square over dim, times a learned scale.

  Variable "rms_norm_scale" (ones), shaped [dim], lives in scope "<name>/rms_norm".
  """
  dim = _check_dim("rms_norm %r" % name, x, dim)
  with variable_scope(name + "/rms_norm"):
    scale = get_variable(x.mesh, "rms_norm_scale", Shape([dim]),
                         initializer=tf.ones_initializer(), activation_dtype=x.dtype)
    variance = reduce_ops.reduce_mean(ew.square(x), reduced_dim=dim)
    return x * ew.rsqrt(variance + epsilon) * scale


def batch_norm(x, is_training, momentum, epsilon=1e-9, dims_idx_start=0,
               dims_idx_end=-1, init_zero=False, name=None):
  """Batch normalization over x.shape.dims[dims_idx_start:dims_idx_end].

  Scale, bias and the moving statistics have the remaining dims. As in the original,
  the moving averages are not updated behind the caller's back: returns (y, update_ops),
  where update_ops are `mtf.assign` ops (empty unless is_training; at eval time the
  moving statistics normalize) for the caller to lower with its train step. momentum:
  moving = momentum * moving + (1 - momentum) * batch statistic; init_zero starts the
  scale at zero; name: variable scope (default a fresh "batch_norm").
  """
  norm_dims = x.shape.dims[dims_idx_start:dims_idx_end]
  if not norm_dims:
    raise ShapeError("batch_norm: dims_idx_start=%d, dims_idx_end=%d select no dim of %s %s"
                     % (dims_idx_start, dims_idx_end, x.name, x.shape), tensor=x.name)
  stats_shape = x.shape - norm_dims
  with layer_scope(x.graph, name, "batch_norm"):
    scale = get_variable(
        x.mesh, "batch_norm_scale", stats_shape, activation_dtype=x.dtype,
        initializer=tf.zeros_initializer() if init_zero else tf.ones_initializer())
    bias = get_variable(x.mesh, "batch_norm_bias", stats_shape, activation_dtype=x.dtype,
                        initializer=tf.zeros_initializer())
    moving_mean = get_variable(x.mesh, "bn_moving_mean", stats_shape, trainable=False,
                               activation_dtype=x.dtype, initializer=tf.zeros_initializer())
    moving_variance = get_variable(x.mesh, "bn_moving_variance", stats_shape,
                                   trainable=False, activation_dtype=x.dtype,
                                   initializer=tf.ones_initializer())
    updates = []
    if is_training:
      mean = reduce_ops.reduce_mean(x, output_shape=stats_shape)
      centered = x - mean
      variance = reduce_ops.reduce_mean(ew.square(centered), output_shape=stats_shape)
      normalized = centered * ew.rsqrt(variance + epsilon)
      updates = [
          assign(moving_mean, moving_mean * momentum + mean * (1.0 - momentum),
                 name="bn_mean_update"),
          assign(moving_variance, moving_variance * momentum + variance * (1.0 - momentum),
                 name="bn_var_update")]
    else:
      normalized = (x - moving_mean) * ew.rsqrt(moving_variance + epsilon)
    return normalized * scale + bias, updates
