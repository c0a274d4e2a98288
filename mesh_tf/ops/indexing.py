"""Index arithmetic over named dims: range, one_hot, gather, cumsum, top_1/argmax.

Ops whose values depend on the global index of a (possibly split) dim read each
processor's slice offset with `mesh_impl.laid_out_slice_begin`."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation, Tensor
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops.creation import constant
from mesh_tf.ops.einsum import einsum
from mesh_tf.ops.gather import GatherOperation, natural_output_shape
from mesh_tf.ops.reduce import reduce_max
from mesh_tf.ops.reshape import reshape
from mesh_tf.shapes import Dimension, Shape, convert_to_dimension, convert_to_shape


class RangeOperation(Operation):
  """The values 0..dim.size-1 along dim."""

  def __init__(self, mesh, dim, dtype, name=None):
    super().__init__([], mesh=mesh, name=name or "range")
    self._add_output(Shape([convert_to_dimension(dim)]), dtype)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    y = self.outputs[0]
    n, dtype = impl.slice_shape(y.shape)[0], y.dtype  # not y: see slice_fn_key
    begin = impl.laid_out_slice_begin(y.shape)
    lowering.set_tensor_lowering(y, impl.slicewise(
        lambda b: tf.cast(tf.range(n) + b[0], dtype), begin))


def mtf_range(mesh, dim, dtype, name=None):
  """A 1-D tensor over dim holding 0, 1, ..., dim.size - 1."""
  return RangeOperation(mesh, dim, tf.as_dtype(dtype), name=name).outputs[0]


class OneHotOperation(Operation):
  """One-hot encoding of integer indices along a new dim (which may be split)."""

  def __init__(self, indices, output_dim, on_value, off_value, dtype, name=None):
    super().__init__([indices], name=name or "one_hot")
    if not indices.dtype.is_integer:
      raise ShapeError("one_hot: indices %s must be integers, not %s" % (
          indices.name, indices.dtype.name), tensor=indices.name)
    output_dim = convert_to_dimension(output_dim)
    if output_dim.name in indices.shape.dimension_names:
      raise ShapeError("one_hot: output dim %s is already a dim of %s %s" % (
          output_dim, indices.name, indices.shape), tensor=indices.name, dim=output_dim.name)
    self._on, self._off = on_value, off_value
    self._add_output(indices.shape + [output_dim], dtype)

  @property
  def on_off_values(self):
    """(on_value, off_value) as given."""
    return self._on, self._off

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, y = self.inputs[0], self.outputs[0]
    depth = impl.slice_shape(y.shape)[-1]
    begin = impl.laid_out_slice_begin(y.shape)
    on, off, dtype = self._on, self._off, y.dtype

    def fn(t, b):
      return tf.one_hot(tf.cast(t, tf.int32) - b[-1], depth, on_value=tf.cast(on, dtype),
                        off_value=tf.cast(off, dtype), dtype=dtype)
    lowering.set_tensor_lowering(y, impl.slicewise(fn, lowering.tensors[x], begin))


def one_hot(indices, output_dim, on_value=1.0, off_value=0.0, dtype=tf.float32,
            name=None):
  """indices one-hot encoded along output_dim (appended as the last dim)."""
  return OneHotOperation(indices, output_dim, on_value, off_value, tf.as_dtype(dtype),
                         name=name).outputs[0]


def gather(weights, indices, dim, output_shape=None):
  """weights looked up at indices (maybe a Python int) along dim (which may be split);
  indices outside [0, dim.size) look up zeros. A local tf.gather (ops/gather.py) when
  indices share no dim with weights, else an einsum with one_hot(indices, dim)."""
  dim = convert_to_dimension(dim)
  if not isinstance(indices, Tensor):
    # As in the original: gather(w, 1, dim) is w's slice at 1 along dim.
    indices = constant(weights.mesh, indices, dtype=tf.int32)
  if weights.dtype == tf.bool:
    # as in the original: looked up as floats (collectives do not sum bools)
    return ew.cast(gather(ew.cast(weights, tf.float32), indices, dim, output_shape),
                   tf.bool)
  if dim not in weights.shape.dims:
    raise ShapeError("gather: dim %s is not a dim of %s %s" % (dim, weights.name,
                                                                weights.shape),
                     tensor=weights.name, dim=dim.name)
  natural = natural_output_shape(weights.shape, indices.shape, dim)
  if output_shape is not None:
    output_shape = convert_to_shape(output_shape)
  shared = set(indices.shape.dims) & set(weights.shape.dims)
  if (not shared and indices.dtype.is_integer and dim not in indices.shape.dims and
      (output_shape is None or set(output_shape.dims) == set(natural.dims))):
    return GatherOperation(weights, indices, dim, output_shape).outputs[0]
  return einsum([one_hot(indices, dim, dtype=weights.dtype), weights],
                reduced_dims=[dim], output_shape=output_shape)


def cumsum(x, dim, exclusive=False, reverse=False):
  """Cumulative sum along dim (as tf.cumsum), as an einsum with a triangular 0/1 matrix."""
  dim = convert_to_dimension(dim)
  if dim not in x.shape.dims:
    raise ShapeError("cumsum: dim %s is not a dim of %s %s" % (dim, x.name, x.shape),
                     tensor=x.name, dim=dim.name)
  target = Dimension(dim.name + "_cumsum_target", dim.size)
  if reverse:
    compare = ew.greater if exclusive else ew.greater_equal
  else:
    compare = ew.less if exclusive else ew.less_equal
  mask = ew.cast(compare(mtf_range(x.mesh, dim, tf.int32),
                         mtf_range(x.mesh, target, tf.int32)), x.dtype)
  out = einsum([x, mask], output_shape=x.shape.rename_dimension(dim.name, target.name))
  return reshape(out, x.shape)


def top_1(x, reduced_dim, name=None, dtype=tf.int32):
  """(argmax, max) of x over reduced_dim, as in the original: `index, value = top_1(...)`;
  on ties the index (of dtype `dtype`) is the last position holding the max."""
  reduced_dim = convert_to_dimension(reduced_dim)
  max_val = reduce_max(x, reduced_dim=reduced_dim, name=name)
  is_max = ew.equal(x, max_val)
  index = ew.where(is_max, mtf_range(x.mesh, reduced_dim, dtype), -1)
  return reduce_max(index, reduced_dim=reduced_dim), max_val


def argmax(x, reduced_dim, name=None):
  """Index (int32) of the max of x over reduced_dim."""
  return top_1(x, reduced_dim, name=name)[0]
