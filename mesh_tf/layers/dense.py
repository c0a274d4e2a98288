"""Dense layers: `dense`, its kernel, GLU-style `dense_product`, and `us_einsum`."""
import functools
import sys

import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.layers import initializers
from mesh_tf.layers.scoping import layer_scope
from mesh_tf.ops.einsum import einsum
from mesh_tf.ops.reshape import rename_dimension
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops.variables import VariableDType, get_variable
from mesh_tf.shapes import Dimension, Shape, convert_to_dimension


def _dim_list(dims):
  """A list of Dimensions from None, one Dimension, a list or a Shape."""
  if dims is None:
    return []
  if isinstance(dims, Shape):
    return list(dims.dims)
  if isinstance(dims, (list, tuple)) and not (
      len(dims) == 2 and isinstance(dims[0], str) and isinstance(dims[1], int)):
    return [convert_to_dimension(d) for d in dims]
  return [convert_to_dimension(dims)]


def us_einsum(xs, *args, **kwargs):
  """mtf.einsum, divided by sqrt(contracted size) under the unit-scaling convention."""
  y = einsum(xs, *args, **kwargs)
  if initializers.unit_scaling_convention():
    inputs = set(d for x in xs for d in x.shape.dims)
    contracted = [d for d in inputs if d not in y.shape.dims]
    y *= Shape(contracted).size ** -0.5
  return y


def _check_dense_dims(layer, x, new_dims, reduced_dims, expert_dims):
  """Raises ShapeError naming the layer, tensor and dim when the dims do not fit x."""
  for role, dims in (("reduced_dims", reduced_dims), ("expert_dims", expert_dims)):
    for d in dims:
      if d not in x.shape.dims:
        raise ShapeError(
            "%s: %s entry %s is not a dim of input %s %s (dims: %s)" % (
                layer, role, d, x.name, x.shape, x.shape.dimension_names),
            op=layer, tensor=x.name, dim=d.name)
  kept = [d for d in x.shape.dims if d not in reduced_dims]
  for d in new_dims:
    if d in kept or d.name in [k.name for k in kept]:
      raise ShapeError(
          "%s: new dim %s is already a dim of input %s %s that the layer keeps; reduce "
          "it (reduced_dims) or give the output dim another name" % (
              layer, d, x.name, x.shape), op=layer, tensor=x.name, dim=d.name)
  overlap = [d for d in reduced_dims if d in expert_dims]
  if overlap:
    raise ShapeError("%s: dims %s are both reduced and expert dims" % (
        layer, [str(d) for d in overlap]), op=layer, tensor=x.name, dim=overlap[0].name)


def _rename_reduced_dims_named_like_new_dims(x, reduced_dims, new_dims):
  """Renames each reduced dim named like a new dim to "_" + name (in x and reduced_dims),
  so the kernel's dims are distinct: channels:3 -> channels:8 uses [_channels:3, channels:8]."""
  new_names = set(d.name for d in new_dims)
  renamed = []
  for d in reduced_dims:
    if d.name in new_names:
      tmp = Dimension("_" + d.name, d.size)
      x = rename_dimension(x, d.name, tmp.name)
      d = tmp
    renamed.append(d)
  return x, renamed


def get_dense_kernel_weights(x, new_dims, reduced_dims, expert_dims, kernel_initializer,
                             name=None, variable_dtype=None, master_dtype=tf.float32,
                             slice_dtype=tf.float32, activation_dtype=None):
  """Creates the kernel of a dense layer: variable "kernel" of shape
  [expert_dims..., reduced_dims..., new_dims...] in scope `name` (default "dense")."""
  new_dims, reduced_dims = _dim_list(new_dims), _dim_list(reduced_dims)
  expert_dims = _dim_list(expert_dims)
  if kernel_initializer is None:
    kernel_initializer = initializers.VarianceScalingInitializer()
  if isinstance(kernel_initializer, initializers.DenseInitializer):
    kernel_initializer = kernel_initializer(reduced_dims, new_dims)
  if variable_dtype is None:
    variable_dtype = VariableDType(master_dtype, slice_dtype, activation_dtype or x.dtype)
  with layer_scope(x.graph, name, "dense"):
    w = get_variable(x.mesh, "kernel", Shape(expert_dims + reduced_dims + new_dims),
                     initializer=kernel_initializer, dtype=variable_dtype)
  return ew.cast(w, x.dtype)


def dense(x, new_dims, reduced_dims=None, expert_dims=None, use_bias=True,
          activation=None, master_dtype=tf.float32, slice_dtype=tf.float32,
          variable_dtype=None, kernel_initializer=None, kernel_weights=None, name=None):
  """A dense layer: x contracted over reduced_dims with a kernel, plus a bias.

  Args:
    x: mtf Tensor.
    new_dims: a Dimension or list of Dimensions the output gains.
    reduced_dims: dims of x to contract (default: the last dim of x).
    expert_dims: dims of x with separate weights per entry (kept in the output).
    use_bias: add a "bias" variable of shape [expert_dims..., new_dims...].
    kernel_initializer: a DenseInitializer or a plain initializer (default
      VarianceScalingInitializer()).
    kernel_weights: use this kernel instead of creating one.
    name: variable scope. Without one, the kernel and the bias each get a fresh
      default scope, as in the original ("dense/kernel" and "dense_1/bias").

  Returns:
    the dims of x minus reduced_dims, followed by new_dims.
  """
  new_dims = _dim_list(new_dims)
  reduced_dims = _dim_list(reduced_dims) if reduced_dims is not None else (
      list(x.shape.dims[-1:]))
  expert_dims = _dim_list(expert_dims)
  _check_dense_dims("dense %r" % (name or "dense"), x, new_dims, reduced_dims,
                    expert_dims)
  x, reduced_dims = _rename_reduced_dims_named_like_new_dims(x, reduced_dims, new_dims)
  if variable_dtype is None:
    variable_dtype = VariableDType(master_dtype, slice_dtype, x.dtype)
  if kernel_weights is None:
    # Looked up on mtf.layers at call time, as the original's one-module name was, so a
    # test patching mtf.layers.get_dense_kernel_weights reaches this call.
    make_kernel = getattr(sys.modules.get("mesh_tf.layers"), "get_dense_kernel_weights",
                          get_dense_kernel_weights)
    kernel_weights = make_kernel(x, new_dims, reduced_dims, expert_dims,
                                 kernel_initializer, name=name,
                                 variable_dtype=variable_dtype)
  with layer_scope(x.graph, name, "dense"):
    output_shape = Shape([d for d in x.shape.dims if d not in reduced_dims] + new_dims)
    y = us_einsum([x, kernel_weights], output_shape=output_shape)
    if use_bias:
      b = get_variable(x.mesh, "bias", Shape(expert_dims + new_dims),
                       initializer=tf.zeros_initializer(), dtype=variable_dtype)
      y += ew.cast(b, y.dtype)
    if activation is not None:
      y = activation(y)
  return y


def _activation_fn(activation):
  """A callable from None/"linear", the name of an mtf elementwise op, or a callable."""
  if activation is None or activation == "linear":
    return None
  if callable(activation):
    return activation
  fn = getattr(ew, activation, None)
  if not callable(fn):
    raise ShapeError("dense_product: unknown activation %r (use 'linear', an mtf op name "
                     "such as 'relu' or 'gelu', or a function)" % (activation,))
  return fn


def dense_product(x, reduced_dims, new_dims, activation_functions=None,
                  name="dense_product", **kwargs):
  """Elementwise product of several dense layers of x (gated linear units and kin).

  With activation_functions=["linear", "sigmoid"] this is a GLU. Each factor is a dense
  layer named "<name>_<i>" (just `name` when there is one factor); kwargs go to dense.
  """
  if not isinstance(activation_functions, (list, tuple)):
    activation_functions = [activation_functions]
  many = len(activation_functions) > 1
  factors = [
      dense(x, new_dims, reduced_dims=reduced_dims, activation=_activation_fn(a),
            name="%s_%d" % (name, i) if many else name, **kwargs)
      for i, a in enumerate(activation_functions)]
  return functools.reduce(ew.multiply, factors)
