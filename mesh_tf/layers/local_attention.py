"""Local (windowed) attention along one length dim, with halo exchange between blocks.

The length is cut into blocks; the blocks dim keeps the length dim's name so the layout
splits it the same way, and each block is extended with the last positions of the block
before it (a halo) taken with `mtf.shift` -- a neighbour exchange when length is split.
"""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.layers.attention import dot_product_attention, multihead_attention_vars
from mesh_tf.layers.masks import NEG_INF, attention_bias_local_block
from mesh_tf.layers.scoping import layer_scope
from mesh_tf.ops import einsum as einsum_ops
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import indexing
from mesh_tf.ops import reshape as reshape_ops
from mesh_tf.ops import slicing
from mesh_tf.shapes import Dimension, Shape


def _halo(x, blocks_dim, block_dim, width, direction):
  """The `width` positions of the neighbouring blocks next to each block.

  direction -1 takes them from the blocks before (left halo), +1 from the blocks after.
  Positions before the first block or after the last are zeros.
  """
  neighbours, covered = [], 0
  while covered < width:
    covered += block_dim.size
    distance = len(neighbours) + 1  # shift by +1 brings each block its left neighbour
    neighbours.append(slicing.shift(x, -direction * distance, blocks_dim, wrap=False))
  if direction < 0:
    joined = slicing.concat(neighbours[::-1], block_dim.name)
    return slicing.slice(joined, covered - width, width, block_dim.name)
  joined = slicing.concat(neighbours, block_dim.name)
  return slicing.slice(joined, 0, width, block_dim.name)


def left_halo_exchange(x, blocks_dim, block_dim, halo_size):
  """x with each block preceded by the halo_size positions before it (zeros at the start)."""
  if halo_size == 0:
    return x
  return slicing.concat([_halo(x, blocks_dim, block_dim, halo_size, -1), x],
                        block_dim.name)


def halo_exchange(x, blocks_dim, block_dim, halo_size):
  """x with each block flanked by halo_size positions of its neighbours on both sides."""
  if halo_size == 0:
    return x
  return slicing.concat([_halo(x, blocks_dim, block_dim, halo_size, -1), x,
                         _halo(x, blocks_dim, block_dim, halo_size, 1)], block_dim.name)


def local_1d_halo_exchange(k, v, num_w_blocks, w_dim, mask_right):
  """Extends keys and values along w_dim by one block of halo (left only if mask_right).

  With num_w_blocks (the dim numbering the blocks) the halo comes from the neighbouring
  blocks; without it (a single block) it is zero padding.
  """
  def extend(x):
    if num_w_blocks is not None:
      if mask_right:
        return left_halo_exchange(x, num_w_blocks, w_dim, w_dim.size)
      return halo_exchange(x, num_w_blocks, w_dim, w_dim.size)
    return slicing.pad(x, [w_dim.size, 0 if mask_right else w_dim.size], w_dim.name)
  return extend(k), extend(v)


def _block_length(window_size, length_per_split):
  """The largest divisor of length_per_split that is at most max(window_size, 128)."""
  block = max(window_size, 128)
  while length_per_split % block:
    block -= 1
  return block


def masked_local_attention_1d(x, kv_channels, heads, is_training=True, window_size=128,
                              master_dtype=tf.float32, slice_dtype=tf.float32,
                              length_per_split=None, return_kv=None, params=None,
                              name=None):
  """Causal attention in which each position sees itself and the window_size - 1 before.

  Positions before the start count as zero keys and values (logit 0), as in the
  original. x: [batch..., length, io_channels]; returns the same shape.

  Args:
    x: input tensor.
    kv_channels, heads: Dimensions.
    is_training: unused (no dropout); kept for the original signature.
    window_size: how far back a query sees.
    master_dtype, slice_dtype: variable precisions.
    length_per_split: the length on one processor; blocks never straddle two.
    return_kv: optional list that receives [k, v].
    params: optional (wq, wk, wv, wo) instead of new variables.
    name: variable scope (default a fresh "multihead_attention").
  """
  del is_training
  batch_dims = x.shape.dims[:-2]
  length, io_channels = x.shape.dims[-2:]
  with layer_scope(x.graph, name, "multihead_attention"):
    if params is None:
      params = multihead_attention_vars(x.mesh, heads, io_channels, kv_channels,
                                        master_dtype, slice_dtype, x.dtype)
    wq, wk, wv, wo = params
    qkv_shape = Shape(batch_dims + [heads, length, kv_channels])
    q, k, v = [einsum_ops.einsum([x, w], qkv_shape) for w in (wq, wk, wv)]
    if return_kv is not None:
      return_kv.extend([k, v])
    per_split = length.size if length_per_split is None else length_per_split
    if length.size % per_split:
      raise ShapeError("masked_local_attention_1d: length_per_split %d does not divide %s"
                       % (per_split, length), tensor=x.name, dim=length.name)
    block = _block_length(window_size, per_split)
    query_block = Dimension("query_block_length", block)
    memory_block = Dimension("memory_block_length", block)
    blocks = Dimension(length.name, length.size // block)
    q = reshape_ops.reshape(q, batch_dims + [heads, blocks, query_block, kv_channels])
    kv_shape = batch_dims + [heads, blocks, memory_block, kv_channels]
    k = left_halo_exchange(reshape_ops.reshape(k, kv_shape), blocks, memory_block,
                           window_size)
    v = left_halo_exchange(reshape_ops.reshape(v, kv_shape), blocks, memory_block,
                           window_size)
    padded = Dimension(memory_block.name, window_size + block)
    memory_pos = indexing.mtf_range(x.mesh, padded, tf.int32)
    query_pos = indexing.mtf_range(x.mesh, query_block, tf.int32) + window_size
    # A query sees memory positions in (query_pos - window_size, query_pos].
    mask = (ew.cast(ew.greater(memory_pos, query_pos), x.dtype) +
            ew.cast(ew.less_equal(memory_pos, query_pos - window_size), x.dtype)) * NEG_INF
    o = dot_product_attention(q, k, v, mask)
    o = reshape_ops.reshape(o, batch_dims + [heads, length, kv_channels])
    return einsum_ops.einsum([o, wo], x.shape)


def masked_local_attention_1d_incremental(x, prev_k, prev_v, step_num,
                                          master_dtype=tf.float32, slice_dtype=tf.float32,
                                          params=None, name=None):
  """One decoding step of masked_local_attention_1d with a ring-buffer cache.

  Args:
    x: [batch..., io_channels] at the current position.
    prev_k, prev_v: [batch..., heads, window_length, kv_channels]; position
      step_num % window_length is overwritten.
    step_num: int32 scalar mtf Tensor.
    master_dtype, slice_dtype, params, name: as for masked_local_attention_1d.

  Returns:
    (y [batch..., io_channels], new_k, new_v).
  """
  batch_dims = x.shape.dims[:-1]
  io_channels = x.shape.dims[-1]
  heads, window_length, kv_channels = prev_k.shape.dims[-3:]
  with layer_scope(x.graph, name, "multihead_attention"):
    if params is None:
      params = multihead_attention_vars(x.mesh, heads, io_channels, kv_channels,
                                        master_dtype, slice_dtype, x.dtype)
    wq, wk, wv, wo = params
    qkv_shape = Shape(batch_dims + [heads, kv_channels])
    q, k, v = [einsum_ops.einsum([x, w], qkv_shape) for w in (wq, wk, wv)]
    current = ew.equal(indexing.mtf_range(x.mesh, window_length, tf.int32),
                       ew.mod(step_num, window_length.size))
    k = ew.where(current, k, prev_k, output_shape=prev_k.shape)
    v = ew.where(current, v, prev_v, output_shape=prev_v.shape)
    o = dot_product_attention(q, k, v, None)
    return einsum_ops.einsum([o, wo], x.shape), k, v


def local_self_attention_spatial_blocks(query_antecedent, kv_channels, heads,
                                        memory_w_dim=None, mask_right=False,
                                        master_dtype=tf.float32, slice_dtype=tf.float32,
                                        name=None):
  """Self-attention within blocks and their neighbours, the input already in blocks.

  query_antecedent: [batch, num_w_blocks, w_dim, io_channels]. Each query sees its own
  block and the previous one (and the next one unless mask_right); with mask_right
  nothing after itself. Neighbours beyond the ends are zero keys and values.

  Args:
    query_antecedent: input tensor.
    kv_channels, heads: Dimensions.
    memory_w_dim: unused (the memory dim is "memory_<w_dim name>"); kept for the
      original signature.
    mask_right: causal attention.
    master_dtype, slice_dtype: variable precisions.
    name: variable scope (default a fresh "multihead_attention").

  Returns:
    query_antecedent's shape.
  """
  del memory_w_dim
  if query_antecedent.shape.ndims != 4:
    raise ShapeError("local_self_attention_spatial_blocks: %s %s must be [batch, "
                     "num_w_blocks, w_dim, io_channels]" % (
                         query_antecedent.name, query_antecedent.shape),
                     tensor=query_antecedent.name)
  batch, num_w_blocks, w_dim, io_channels = query_antecedent.shape.dims
  with layer_scope(query_antecedent.graph, name, "multihead_attention"):
    wq, wk, wv, wo = multihead_attention_vars(
        query_antecedent.mesh, heads, io_channels, kv_channels, master_dtype, slice_dtype,
        query_antecedent.dtype)
    memory = reshape_ops.rename_dimension(query_antecedent, w_dim.name,
                                          "memory_" + w_dim.name)
    memory_w_dim = memory.shape.dims[2]
    q = einsum_ops.einsum([query_antecedent, wq],
                          [batch, heads, num_w_blocks, w_dim, kv_channels])
    kv_shape = [batch, heads, num_w_blocks, memory_w_dim, kv_channels]
    k, v = local_1d_halo_exchange(einsum_ops.einsum([memory, wk], kv_shape),
                                  einsum_ops.einsum([memory, wv], kv_shape),
                                  num_w_blocks, memory_w_dim, mask_right)
    mask = None
    if mask_right:
      mask = attention_bias_local_block(query_antecedent.mesh, w_dim, memory_w_dim)
    o = dot_product_attention(q, k, v, mask)
    return einsum_ops.einsum([o, wo], query_antecedent.shape)
