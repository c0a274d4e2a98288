"""Additive attention masks: 0 where a query may attend, -1e9 where it may not.

Query positions live on a "length" dim and memory positions on "memory_length"; a mask
broadcasts against attention logits by dim name.
"""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.ops import creation
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import indexing
from mesh_tf.ops.reshape import rename_dimension
from mesh_tf.ops import slicing
from mesh_tf.shapes import Dimension

NEG_INF = -1e9


def rename_length_to_memory_length(x, length_name="length",
                                   memory_length_name="memory_length"):
  """x with its length dim renamed to memory_length (keys/values vs queries)."""
  return rename_dimension(x, length_name, memory_length_name)


def _blocked(condition, dtype):
  return ew.cast(condition, dtype) * NEG_INF


def attention_mask_ignore_padding(inputs, dtype=tf.float32):
  """Masks memory positions whose token id is 0 (padding); inputs has a "length" dim."""
  memory = rename_length_to_memory_length(inputs)
  return _blocked(ew.equal(memory, ew.zeros_like(memory)), dtype)


def attention_mask_autoregressive(query_pos, dtype=tf.float32):
  """Masks memory positions after the query position; query_pos is on "length"."""
  memory_pos = rename_length_to_memory_length(query_pos)
  return _blocked(ew.less(query_pos, memory_pos), dtype)


def attention_mask_same_segment(query_segment, memory_segment=None, dtype=tf.float32):
  """Masks pairs whose segment ids differ (packed examples attend only within one)."""
  memory_segment = rename_length_to_memory_length(
      query_segment if memory_segment is None else memory_segment)
  return _blocked(ew.not_equal(query_segment, memory_segment), dtype)


def attention_bias_local_block(mesh, block_length, memory_length, dtype=tf.int32):
  """Mask of local block attention: [block_length, memory_length of 2 * block_length].

  The memory is the previous block (all visible), then the current block (visible up to
  the query's own position); memory_length gives only the memory dim's name.
  """
  if block_length.size < 1:
    raise ShapeError("attention_bias_local_block: block_length %s is empty" % block_length,
                     dim=block_length.name)
  current = Dimension(memory_length.name, block_length.size)
  previous = creation.zeros(mesh, [block_length, current], dtype=dtype)
  future = ew.cast(ew.less(indexing.mtf_range(mesh, block_length, dtype),
                           indexing.mtf_range(mesh, current, dtype)), dtype)
  both = slicing.concat([previous, future], current.name)
  return ew.cast(both, tf.float32) * NEG_INF


def attention_bias_local_2d_block(mesh, h_dim, w_dim, memory_h_dim, memory_w_dim,
                                  dtype=tf.int32):
  """Mask of causal local 2-D block attention: [h_dim, w_dim, memory_h_dim, memory_w_dim].

  The memory of a block is the 2h x 2w window of the blocks above-left, above, left and
  the block itself (at the bottom right); a query sees what comes no later in raster
  order over the whole image. The memory dims give the names; their sizes are 2 * h and
  2 * w. dtype is that of the position arithmetic; the mask is float32.
  """
  for query_dim, memory_dim in ((h_dim, memory_h_dim), (w_dim, memory_w_dim)):
    if query_dim.name == memory_dim.name:
      raise ShapeError("attention_bias_local_2d_block: the memory dim needs a name other "
                       "than the query dim %s" % (query_dim,), dim=query_dim.name)
  memory_h = Dimension(memory_h_dim.name, 2 * h_dim.size)
  memory_w = Dimension(memory_w_dim.name, 2 * w_dim.size)
  # Memory positions relative to the query block's first row and column.
  memory_row = indexing.mtf_range(mesh, memory_h, dtype) - h_dim.size
  memory_col = indexing.mtf_range(mesh, memory_w, dtype) - w_dim.size
  query_row = indexing.mtf_range(mesh, h_dim, dtype)
  query_col = indexing.mtf_range(mesh, w_dim, dtype)
  later = ew.logical_or(
      ew.greater(memory_row, query_row),
      ew.logical_and(ew.equal(memory_row, query_row), ew.greater(memory_col, query_col)),
      output_shape=[h_dim, w_dim, memory_h, memory_w])
  return _blocked(later, tf.float32)
