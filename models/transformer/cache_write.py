"""The decoding caches' per-step write: one position of a cache, in O(size of the write).

A functional update (`tf.tensor_scatter_nd_update`) copies the whole cache every step
(TF forwards no while-loop variable's buffer to the scatter). Where the decoding loop
owns its caches (`private_copy` made them) and the backend computes each slice as a TF
tensor of its own (`MeshImpl.in_place_slice_writes`), the write goes into the cache's
buffer (`tf.raw_ops.InplaceUpdate`); every reader of a step's cache feeds the next
step's token, so the next write waits for them. Elsewhere the scatter is used.
"""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import ShapeError
from mesh_tf.lowering import plan_interpreter
from mesh_tf.ops.slicewise import SlicewiseOperation


def _scatter_at(cache, new, position, axis):
  """tf: cache with new (cache's shape without axis) written at index position of
  axis, by one tensor_scatter_nd_update (a copy of cache)."""
  lead = tf.shape(cache)[:axis]
  position = tf.reshape(tf.cast(position, tf.int32), [])
  if axis == 0:
    indices = tf.reshape(position, [1, 1])
    updates = tf.expand_dims(new, 0)
  else:
    grids = tf.meshgrid(*[tf.range(lead[i]) for i in range(axis)], indexing="ij")
    grids.append(tf.fill(lead, position))
    indices = tf.stack(grids, axis=-1)
    updates = new
  return tf.tensor_scatter_nd_update(cache, indices, updates)


def _write_rows_in_place(cache, new, position, axis):
  """tf: _scatter_at's result, written into cache's own buffer: cache viewed as rows
  [dims before axis x axis, dims after axis], one row per entry of the dims before axis
  updated. cache must be held by nothing else."""
  shape = cache.shape.as_list()
  lead = int(np.prod(shape[:axis], dtype=np.int64))
  rows = np.arange(lead, dtype=np.int32) * shape[axis] + tf.reshape(
      tf.cast(position, tf.int32), [])
  flat = tf.reshape(cache, [lead * shape[axis], -1])
  flat = tf.raw_ops.InplaceUpdate(x=flat, i=rows, v=tf.reshape(new, [lead, -1]))
  return tf.reshape(flat, shape)


class _InPlaceSlicewise(SlicewiseOperation):
  """A slicewise op with a second slice function for backends with
  in_place_slice_writes, used when the op was made with in_place=True."""

  def __init__(self, tf_fn, in_place_fn, in_place, xs, splittable_dims, name):
    x = xs[0]
    super().__init__(tf_fn, xs, x.shape, x.dtype, splittable_dims=splittable_dims,
                     name=name)
    self._in_place_fn = in_place_fn if in_place else None

  def lower(self, lowering):
    mesh_impl = lowering.mesh_impl(self)
    fn = self._tf_fn
    if self._in_place_fn is not None and mesh_impl.in_place_slice_writes:
      fn = self._in_place_fn
    plan_interpreter.lower_planned(lowering, self, self.plan(mesh_impl.slice_layout), fn)


def private_copy(x):
  """x, in buffers that nothing else holds where the backend writes slices in place
  (a tf.raw_ops.DeepCopy of each slice; elsewhere x's values as they are): what a
  decoding loop's caches start from before write_at_position(..., in_place=True)."""
  return _InPlaceSlicewise(tf.identity, lambda t: tf.raw_ops.DeepCopy(x=t), True, [x],
                           [d.name for d in x.shape.dims], "private_copy").outputs[0]


def write_at_position(cache, new, position, dim_name="memory_length", in_place=False):
  """cache (e.g. keys [batch, memory_length, heads, d_kv]) with new (cache's other dims,
  any order; cast to cache's dtype) written at the int32 scalar position of its dim
  dim_name. in_place: the caller owns cache (a loop variable that started from
  `private_copy` and that nothing but this write reads), so on backends with
  in_place_slice_writes the write goes into cache's buffer.
  """
  dim = cache.shape.get_dim_by_name(dim_name)
  rest = [d for d in cache.shape.dims if d != dim]
  if sorted(d.name for d in new.shape.dims) != sorted(d.name for d in rest):
    raise ShapeError("write_at_position: new %s %s must have the dims of cache %s %s "
                     "without %r" % (new.name, new.shape, cache.name, cache.shape,
                                     dim_name), tensor=new.name, dim=dim_name)
  new = mtf.cast(new, cache.dtype)
  if new.shape.dims != rest:
    new = mtf.transpose(new, mtf.Shape(rest))
  if position.shape.ndims:
    raise ShapeError("write_at_position: position %s %s must be a scalar" % (
        position.name, position.shape), tensor=position.name)
  axis = cache.shape.dims.index(dim)
  return _InPlaceSlicewise(
      lambda c, n, p: _scatter_at(c, n, p, axis),
      lambda c, n, p: _write_rows_in_place(c, n, p, axis), in_place,
      [cache, new, position], [d.name for d in rest], "write_at_position").outputs[0]
