"""The decoding caches' per-step write: one position of a cache, in O(size of the write)."""
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import ShapeError


def _scatter_at(cache, new, position, axis):
  """tf: cache with new (cache's shape without axis) written at index position of
  axis, by one tensor_scatter_nd_update (which reuses cache's buffer where TF can
  forward it): O(size of new), not O(size of cache)."""
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


def write_at_position(cache, new, position, dim_name="memory_length"):
  """cache with new written at the scalar position of its dim dim_name (the decoding
  caches' per-step write).

  Args:
    cache: Tensor with dim dim_name, e.g. keys [batch, memory_length, heads, d_kv].
    new: Tensor with cache's other dims (any order), e.g. [batch, heads, d_kv].
    position: int32 scalar Tensor (no dims), the index along dim_name.
    dim_name: the name of the dim written.

  Returns:
    Tensor shaped like cache, equal to it except at position, where it holds new (cast
    to cache's dtype). Each slice is written at the position by one
    tf.tensor_scatter_nd_update, so a step costs the size of new, not of the cache (a
    layout that splits dim_name gets it gathered whole for the write, as any
    slicewise op's unsplittable dim).
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
  return mtf.slicewise(
      lambda c, n, p: _scatter_at(c, n, p, axis), [cache, new, position],
      output_shape=cache.shape, output_dtype=cache.dtype,
      splittable_dims=[d.name for d in rest], name="write_at_position")
