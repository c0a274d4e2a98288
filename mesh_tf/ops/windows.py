"""Positions and windows along one named dim: reduce_first, dynamic_shift,
pool_tensor_1d, stride_tensor_1d. Each is built from reshape, range and einsum, so it
works on every layout and gets its gradient from those ops."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Tensor
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops.einsum import einsum
from mesh_tf.ops.indexing import mtf_range
from mesh_tf.ops.reduce import reduce_mean, reduce_sum
from mesh_tf.ops.reshape import replace_dimensions, reshape
from mesh_tf.shapes import Dimension, Shape, convert_to_dimension


def _dim_of(x, dim, fn_name):
  dim = convert_to_dimension(dim)
  if dim not in x.shape.dims:
    raise ShapeError("%s: dim %s is not a dim of %s %s" % (fn_name, dim, x.name, x.shape),
                     tensor=x.name, dim=dim.name)
  return dim


def reduce_first(tensor, reduced_dim):
  """The element at position 0 of reduced_dim (which is removed)."""
  reduced_dim = _dim_of(tensor, reduced_dim, "reduce_first")
  first = ew.cast(ew.equal(mtf_range(tensor.mesh, reduced_dim, tf.int32), 0), tensor.dtype)
  return reduce_sum(tensor * first, reduced_dim=reduced_dim)


def dynamic_shift(x, offset, dim, wrap):
  """x moved by offset positions along dim: y[i] = x[i - offset], zero-filled or wrapped.

  offset is an int mtf Tensor over some of x's other dims, so each row may move by its
  own amount (an einsum with a 0/1 permutation matrix)."""
  dim = _dim_of(x, dim, "dynamic_shift")
  if not isinstance(offset, Tensor) or not offset.dtype.is_integer:
    raise ShapeError("dynamic_shift of %s: offset must be an integer mtf Tensor, got %r"
                     % (x.name, offset), tensor=x.name)
  if dim in offset.shape.dims:
    raise ShapeError("dynamic_shift of %s: offset %s must not have the shifted dim %s" % (
        x.name, offset.shape, dim), tensor=offset.name, dim=dim.name)
  extra = [d for d in offset.shape.dims if d not in x.shape.dims]
  if extra:
    raise ShapeError("dynamic_shift of %s: offset dims %s are not dims of x %s" % (
        x.name, [str(d) for d in extra], x.shape), tensor=offset.name, dim=extra[0].name)
  source = Dimension(dim.name + "_shift_source", dim.size)
  x_source = replace_dimensions(x, dim, source)
  wanted = mtf_range(x.mesh, source, tf.int32) + ew.cast(offset, tf.int32)
  if wrap:
    wanted = ew.mod(wanted, dim.size)
  moves = ew.cast(ew.equal(mtf_range(x.mesh, dim, tf.int32), wanted), x.dtype)
  return einsum([x_source, moves], output_shape=x.shape)


def _windows(tensor, pool_dim, pool_size, fn_name):
  """tensor with pool_dim viewed as [pool_dim // pool_size, pool_window]."""
  pool_dim = _dim_of(tensor, pool_dim, fn_name)
  if pool_size < 1 or pool_dim.size % pool_size:
    raise ShapeError("%s of %s: pool_size %r does not divide %s" % (
        fn_name, tensor.name, pool_size, pool_dim), tensor=tensor.name, dim=pool_dim.name)
  window = Dimension("pool_window", pool_size)
  dims = tensor.shape.dims
  i = dims.index(pool_dim)
  shape = Shape(dims[:i] + [Dimension(pool_dim.name, pool_dim.size // pool_size), window]
                + dims[i + 1:])
  return reshape(tensor, shape), window


def pool_tensor_1d(tensor, pool_dim, reduce_fn=reduce_mean, pool_size=2):
  """Pools windows of pool_size along pool_dim (which keeps its name) with reduce_fn."""
  windows, window = _windows(tensor, pool_dim, pool_size, "pool_tensor_1d")
  return reduce_fn(windows, reduced_dim=window)


def stride_tensor_1d(tensor, pool_dim, pool_size=2):
  """Every pool_size-th element along pool_dim (the first of each window)."""
  windows, window = _windows(tensor, pool_dim, pool_size, "stride_tensor_1d")
  return reduce_first(windows, window)
