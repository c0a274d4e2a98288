"""mtf.gather lowered as a local tf.gather, and its gradient as a local segment sum.

weights [..., dim, ...] looked up at integer indices gives indices.shape + the other dims
of weights. Where dim is split over mesh axis c, each slice holds rows [b, b + n): indices
outside it look up zeros, and a deferred SUM allreduce over c completes every row (the
bytes of the one-hot einsum it replaces, without its tokens x vocab x d_model FLOPs).
Indices outside [0, dim.size) give zeros and no gradient, as a one-hot einsum would. The
weights' gradient is tf.math.unsorted_segment_sum on the local slice, then a deferred SUM
allreduce over the mesh axes that split the dims of indices.
"""
import tensorflow as tf

from mesh_tf.graph import Operation
from mesh_tf.lowering import plan_interpreter
from mesh_tf.plans import rules as plan_rules
from mesh_tf.shapes import Shape


def natural_output_shape(weights_shape, indices_shape, dim):
  """indices dims, then the dims of weights other than dim (the one-hot einsum's order)."""
  return Shape(indices_shape.dims + [d for d in weights_shape.dims
                                     if d != dim and d not in indices_shape.dims])


def _local_rows(indices, begin, n):
  """(row in the local slice, whether the index falls in it) of each index."""
  rows = tf.cast(indices, tf.int32)
  if begin is not None:
    rows = rows - begin
  return rows, tf.logical_and(rows >= 0, rows < n)


def _local_lookup(impl, weights_shape, indices_shape, dim):
  """What both lowerings need: the axis of dim in weights, its local size n, the natural
  output shape, and (as a list, empty unless dim is split) the laid-out slice begins."""
  axis = weights_shape.dims.index(dim)
  n = impl.slice_shape(weights_shape)[axis]
  split = dim.name in impl.slice_layout.split_axes(weights_shape)
  begins = [impl.laid_out_slice_begin(weights_shape)] if split else []
  return axis, n, natural_output_shape(weights_shape, indices_shape, dim), begins


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
    plan = self.plan(impl.slice_layout)
    axis, n, _, extra = _local_lookup(impl, w.shape, i.shape, dim)
    # tf.gather along the axis itself: the rows of a [batch, length] tensor at one
    # position without transposing all of it (a decoding step's cost grew with length)
    looked_up = w.shape.dims[:axis] + i.shape.dims + w.shape.dims[axis + 1:]
    out_perm = _perm(looked_up, y.shape.dims)
    after = w.shape.ndims - 1 - axis

    def fn(wt, it, b=None):
      rows, valid = _local_rows(it, None if b is None else b[axis], n)
      out = tf.gather(wt, tf.where(valid, rows, 0), axis=axis)
      mask = tf.reshape(valid, [1] * axis + valid.shape.as_list() + [1] * after)
      out = tf.where(mask, out, tf.zeros([], out.dtype))
      return _transpose(out, out_perm)

    plan_interpreter.lower_planned(lowering, self, plan, fn, extra)
    lowering.add_counter("gather", impl.laid_out_size(y.shape))

  def plan(self, layout):
    """The OpPlan on a MeshLayout (see plans/rules.gather_plan)."""
    w, i = self.inputs
    return plan_rules.gather_plan(layout, self.name, w.shape, i.shape, self._dim,
                                  self.outputs[0].shape)


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

  def plan(self, layout):
    """The OpPlan on a MeshLayout (see plans/rules.gather_grad_plan)."""
    dy, i = self.inputs
    return plan_rules.gather_grad_plan(layout, self.name, dy.shape, i.shape,
                                       self.outputs[0].shape, self._dim)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    dy, i, w = self.inputs[0], self.inputs[1], self.outputs[0]
    dim = self._dim
    plan = self.plan(impl.slice_layout)
    axis, n, natural, extra = _local_lookup(impl, w.shape, i.shape, dim)
    in_perm = _perm(dy.shape.dims, natural.dims)
    rest_dims = [d for d in w.shape.dims if d != dim]
    rest_local = [impl.slice_shape(w.shape)[w.shape.dims.index(d)] for d in rest_dims]
    back = _perm([dim] + rest_dims, w.shape.dims)

    def fn(g, it, b=None):
      rows, valid = _local_rows(it, None if b is None else b[axis], n)
      data = tf.reshape(_transpose(g, in_perm), [-1] + rest_local)
      ids = tf.reshape(tf.where(valid, rows, -1), [-1])  # negative ids are dropped
      return _transpose(tf.math.unsorted_segment_sum(data, ids, n), back)

    plan_interpreter.lower_planned(lowering, self, plan, fn, extra)
    lowering.add_counter("gather_grad", impl.laid_out_size(dy.shape))
