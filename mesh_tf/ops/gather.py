"""mtf.gather lowered as a local tf.gather, and its gradient as a local segment sum.

weights [..., dim, ...] looked up at integer indices gives indices.shape + the other dims
of weights. On each processor:

- dim not split: tf.gather of the local weights slice at the local indices;
- dim split over mesh axis c: the slice holds rows [b, b + n); indices outside it look up
  zeros, and a SUM allreduce over c (deferred, like an einsum's) completes every row.
  This sends the same bytes as the one-hot einsum it replaces (which owes the same
  allreduce of the same output slice) without its tokens x vocab x d_model FLOPs.

Indices outside [0, dim.size) give zeros (and no gradient), as a one-hot einsum would.
The gradient with respect to the weights is tf.math.unsorted_segment_sum of the output
gradient on the local slice (rows outside the slice are dropped), then a SUM allreduce
(deferred) over the mesh axes that split the dims of indices, which are summed over.
"""
import tensorflow as tf

from mesh_tf.errors import LayoutError
from mesh_tf.graph import Operation
from mesh_tf.lowering.lazy_allreduce import LazyAllreduceSum
from mesh_tf.shapes import Shape


def natural_output_shape(weights_shape, indices_shape, dim):
  """indices dims, then the dims of weights other than dim (the one-hot einsum's order)."""
  return Shape(indices_shape.dims + [d for d in weights_shape.dims
                                     if d != dim and d not in indices_shape.dims])


def _check_layout(impl, op_name, weights_shape, indices_shape, dim):
  """Mesh axis splitting dim (or None); raises if it also splits a dim of indices."""
  mesh_axis = impl.tensor_layout(weights_shape)[weights_shape.dims.index(dim)]
  if mesh_axis is not None and mesh_axis in impl.tensor_layout(indices_shape).mesh_axes:
    raise LayoutError(
        "gather %r: mesh axis %s splits both the gathered dim %s and a dim of the indices "
        "%s; lay one of them out on another mesh axis" % (
            op_name, impl.shape[mesh_axis].name, dim.name, indices_shape), op=op_name,
        dim=dim.name)
  return mesh_axis


def _local_rows(indices, begin, n):
  """(row in the local slice, whether the index falls in it) of each index."""
  rows = tf.cast(indices, tf.int32)
  if begin is not None:
    rows = rows - begin
  valid = tf.logical_and(rows >= 0, rows < n)
  return rows, valid


def _perm(from_dims, to_dims):
  return [from_dims.index(d) for d in to_dims]


def _transpose(t, perm):
  return t if perm == list(range(len(perm))) else tf.transpose(t, perm)


class GatherOperation(Operation):
  """weights looked up at indices along dim (see module docstring)."""

  def __init__(self, weights, indices, dim, output_shape=None, name=None):
    super().__init__([weights, indices], name=name or "gather")
    self._dim = dim
    natural = natural_output_shape(weights.shape, indices.shape, dim)
    self._add_output(output_shape if output_shape is not None else natural, weights.dtype)

  @property
  def dim(self):
    """The gathered dim of the weights."""
    return self._dim

  def gradient(self, grad_ys):
    weights, indices = self.inputs
    grad = GatherGradOperation(grad_ys[0], indices, weights.shape, self._dim,
                               name=self.name + "_grad").outputs[0]
    return [grad, None]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    w, i, y = self.inputs[0], self.inputs[1], self.outputs[0]
    dim = self._dim
    mesh_axis = _check_layout(impl, self.name, w.shape, i.shape, dim)
    axis = w.shape.dims.index(dim)
    n = impl.slice_shape(w.shape)[axis]
    natural = natural_output_shape(w.shape, i.shape, dim)
    to_front = [axis] + [k for k in range(w.shape.ndims) if k != axis]
    out_perm = _perm(natural.dims, y.shape.dims)
    rest_rank = w.shape.ndims - 1

    def fn(wt, it, b=None):
      rows, valid = _local_rows(it, None if b is None else b[axis], n)
      out = tf.gather(_transpose(wt, to_front), tf.where(valid, rows, 0))
      mask = tf.reshape(valid, tf.concat([tf.shape(valid), [1] * rest_rank], 0))
      out = tf.where(mask, out, tf.zeros([], out.dtype))
      return _transpose(out, out_perm)

    args = [lowering.tensors[w], lowering.tensors[i]]
    if mesh_axis is not None:
      args.append(impl.laid_out_slice_begin(w.shape))
    out = impl.slicewise(fn, *args)
    if mesh_axis is not None:
      out = LazyAllreduceSum(impl, out, [mesh_axis], op_name=self.name)
    lowering.add_counter("gather", impl.laid_out_size(y.shape))
    lowering.set_tensor_lowering(y, out)


class GatherGradOperation(Operation):
  """Gradient of a gather with respect to its weights: dy summed into the looked-up rows."""

  def __init__(self, dy, indices, weights_shape, dim, name=None):
    super().__init__([dy, indices], name=name or "gather_grad")
    self._dim = dim
    self._add_output(weights_shape, dy.dtype)

  def gradient(self, grad_ys):
    dy, indices = self.inputs
    return [GatherOperation(grad_ys[0], indices, self._dim, output_shape=dy.shape,
                            name=self.name + "_grad").outputs[0], None]

  def summed_mesh_axes(self, impl):
    """Sorted mesh axes of the SUM allreduce the local segment sums owe."""
    return sorted(impl.tensor_layout(self.inputs[1].shape).mesh_axes)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    dy, i, w = self.inputs[0], self.inputs[1], self.outputs[0]
    dim = self._dim
    mesh_axis = _check_layout(impl, self.name, w.shape, i.shape, dim)
    axis = w.shape.dims.index(dim)
    n = impl.slice_shape(w.shape)[axis]
    natural = natural_output_shape(w.shape, i.shape, dim)
    in_perm = _perm(dy.shape.dims, natural.dims)
    rest_dims = [d for d in w.shape.dims if d != dim]
    rest_local = [impl.slice_shape(w.shape)[w.shape.dims.index(d)] for d in rest_dims]
    back = _perm([dim] + rest_dims, w.shape.dims)

    def fn(g, it, b=None):
      rows, valid = _local_rows(it, None if b is None else b[axis], n)
      data = tf.reshape(_transpose(g, in_perm), [-1] + rest_local)
      ids = tf.reshape(tf.where(valid, rows, -1), [-1])  # negative ids are dropped
      return _transpose(tf.math.unsorted_segment_sum(data, ids, n), back)

    args = [lowering.tensors[dy], lowering.tensors[i]]
    if mesh_axis is not None:
      args.append(impl.laid_out_slice_begin(w.shape))
    out = impl.slicewise(fn, *args)
    summed = self.summed_mesh_axes(impl)
    if summed:
      out = LazyAllreduceSum(impl, out, summed, op_name=self.name)
    lowering.add_counter("gather_grad", impl.laid_out_size(dy.shape))
    lowering.set_tensor_lowering(w, out)
