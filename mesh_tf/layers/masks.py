"""Additive attention masks: 0 where a query may attend, -1e9 where it may not.

Query positions live on a "length" dim and memory positions on "memory_length"; a mask
broadcasts against attention logits by dim name.
"""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.ops import creation
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import indexing
from mesh_tf.ops import reshape as reshape_ops
from mesh_tf.ops import slicing
from mesh_tf.shapes import Dimension

NEG_INF = -1e9


def rename_length_to_memory_length(x, length_name="length",
                                   memory_length_name="memory_length"):
  """x with its length dim renamed to memory_length (keys/values vs queries)."""
  return reshape_ops.rename_dimension(x, length_name, memory_length_name)


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

  The memory is the previous block (all visible) followed by the current block (visible
  up to the query's own position). memory_length gives the memory dim's name; its size
  is taken as 2 * block_length.
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
