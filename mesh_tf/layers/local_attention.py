"""Local (windowed) attention over blocks in 1-D and 2-D, with halo exchange.

The length (or each image axis) is cut into blocks; the blocks dim may be split over the
mesh, and each block is extended with the neighbouring positions (a halo) by
`mtf.halo_exchange` / `mtf.left_halo_exchange` -- a neighbour exchange when split.
"""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.layers.attention import dot_product_attention, multihead_attention_vars
from mesh_tf.layers.masks import (NEG_INF, attention_bias_local_2d_block,
                                  attention_bias_local_block)
from mesh_tf.layers.scoping import layer_scope
from mesh_tf.ops.einsum import einsum
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import indexing
from mesh_tf.ops.reshape import rename_dimension, reshape
from mesh_tf.ops import slicing
from mesh_tf.ops.halo import halo_exchange_sides, left_halo_exchange
from mesh_tf.shapes import Dimension, Shape


def _extend_by_a_block(x, blocks_dim, size_dim, mask_right, what):
  """x with size_dim grown by one block of halo before (and after, unless mask_right):
  from the neighbouring blocks along blocks_dim, or zero padding when it is None."""
  if size_dim not in x.shape.dims:
    raise ShapeError("%s: %s %s has no dim %s" % (what, x.name, x.shape, size_dim),
                     tensor=x.name, dim=size_dim.name)
  right = 0 if mask_right else size_dim.size
  if blocks_dim is None:
    return slicing.pad(x, [size_dim.size, right], size_dim.name)
  return halo_exchange_sides(x, blocks_dim, size_dim, size_dim.size, right)


def local_1d_halo_exchange(k, v, num_w_blocks, w_dim, mask_right):
  """Extends keys and values along w_dim by one block of halo (left only if mask_right),
  from the neighbouring blocks along num_w_blocks, or zero padding when it is None."""
  return tuple(_extend_by_a_block(x, num_w_blocks, w_dim, mask_right,
                                  "local_1d_halo_exchange") for x in (k, v))


def local_2d_halo_exchange(k, v, num_h_blocks, h_dim, num_w_blocks, w_dim, mask_right):
  """Extends keys and values by one block of halo along h_dim, then along w_dim.

  The second exchange moves the already extended blocks, so each block also gains its
  diagonal neighbours; with mask_right only those above and to the left. A None blocks
  dim means a single block along that axis (zero padding).
  """
  def extend(x):
    x = _extend_by_a_block(x, num_h_blocks, h_dim, mask_right, "local_2d_halo_exchange")
    return _extend_by_a_block(x, num_w_blocks, w_dim, mask_right,
                              "local_2d_halo_exchange")
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

  is_training is unused (no dropout). length_per_split: the length on one processor
  (blocks never straddle two); return_kv: optional list that receives [k, v]; params:
  optional (wq, wk, wv, wo) instead of new variables; name: variable scope (default a
  fresh "multihead_attention").
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
    q, k, v = [einsum([x, w], qkv_shape) for w in (wq, wk, wv)]
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
    q = reshape(q, batch_dims + [heads, blocks, query_block, kv_channels])
    kv_shape = batch_dims + [heads, blocks, memory_block, kv_channels]
    k = left_halo_exchange(reshape(k, kv_shape), blocks, memory_block, window_size)
    v = left_halo_exchange(reshape(v, kv_shape), blocks, memory_block, window_size)
    padded = Dimension(memory_block.name, window_size + block)
    memory_pos = indexing.mtf_range(x.mesh, padded, tf.int32)
    query_pos = indexing.mtf_range(x.mesh, query_block, tf.int32) + window_size
    # A query sees memory positions in (query_pos - window_size, query_pos].
    mask = (ew.cast(ew.greater(memory_pos, query_pos), x.dtype) +
            ew.cast(ew.less_equal(memory_pos, query_pos - window_size), x.dtype)) * NEG_INF
    o = dot_product_attention(q, k, v, mask)
    o = reshape(o, batch_dims + [heads, length, kv_channels])
    return einsum([o, wo], x.shape)


def masked_local_attention_1d_incremental(x, prev_k, prev_v, step_num,
                                          master_dtype=None, slice_dtype=None,
                                          params=None, name=None):
  """One decoding step of masked_local_attention_1d with a ring-buffer cache.

  x: [batch..., io_channels] at the current position; prev_k, prev_v: [batch..., heads,
  window_length, kv_channels], of which position step_num % window_length is
  overwritten; step_num: int32 scalar mtf Tensor. master_dtype and slice_dtype default
  to float32. Returns (y [batch..., io_channels], new_k, new_v).
  """
  batch_dims = x.shape.dims[:-1]
  io_channels = x.shape.dims[-1]
  heads, window_length, kv_channels = prev_k.shape.dims[-3:]
  with layer_scope(x.graph, name, "multihead_attention"):
    if params is None:
      params = multihead_attention_vars(x.mesh, heads, io_channels, kv_channels,
                                        master_dtype or tf.float32,
                                        slice_dtype or tf.float32, x.dtype)
    wq, wk, wv, wo = params
    qkv_shape = Shape(batch_dims + [heads, kv_channels])
    q, k, v = [einsum([x, w], qkv_shape) for w in (wq, wk, wv)]
    current = ew.equal(indexing.mtf_range(x.mesh, window_length, tf.int32),
                       ew.mod(step_num, window_length.size))
    k = ew.where(current, k, prev_k, output_shape=prev_k.shape)
    v = ew.where(current, v, prev_v, output_shape=prev_v.shape)
    o = dot_product_attention(q, k, v, None)
    return einsum([o, wo], x.shape), k, v


def _check_blocks_rank(x, what, dim_names):
  if x.shape.ndims != len(dim_names):
    raise ShapeError("%s: %s %s must be [%s]" % (what, x.name, x.shape, ", ".join(dim_names)),
                     tensor=x.name)


def _spatial_blocks_qkv(x, kv_channels, heads, master_dtype, slice_dtype, num_spatial):
  """(q, k, v, wo, memory dims) for x [batch, blocks dims..., spatial dims...,
  io_channels]; k and v have each spatial dim renamed "memory_<name>"."""
  dims = x.shape.dims
  spatial = dims[-1 - num_spatial:-1]
  wq, wk, wv, wo = multihead_attention_vars(x.mesh, heads, dims[-1], kv_channels,
                                            master_dtype, slice_dtype, x.dtype)
  memory = x
  for d in spatial:
    memory = rename_dimension(memory, d.name, "memory_" + d.name)
  memory_dims = memory.shape.dims[-1 - num_spatial:-1]
  blocks = [dims[0], heads] + dims[1:-1 - num_spatial]
  q = einsum([x, wq], blocks + spatial + [kv_channels])
  kv_shape = blocks + memory_dims + [kv_channels]
  return q, einsum([memory, wk], kv_shape), einsum([memory, wv], kv_shape), wo, memory_dims


def local_self_attention_spatial_blocks(query_antecedent, kv_channels, heads, is_training,
                                        memory_w_dim=None, mask_right=False,
                                        master_dtype=tf.float32, slice_dtype=tf.float32,
                                        name=None):
  """Self-attention within blocks and their neighbours, the input already in blocks.

  query_antecedent: [batch, num_w_blocks, w_dim, io_channels]; returns its shape. Each
  query sees its own block and the previous one (and the next one unless mask_right);
  with mask_right nothing after itself. Neighbours beyond the ends are zero keys and
  values. is_training and memory_w_dim (the memory dim is "memory_<w_dim name>") are
  unused, kept for the original signature; name: variable scope (default a fresh
  "multihead_attention").
  """
  del is_training, memory_w_dim
  x = query_antecedent
  _check_blocks_rank(x, "local_self_attention_spatial_blocks",
                     ["batch", "num_w_blocks", "w_dim", "io_channels"])
  _, num_w_blocks, w_dim, _ = x.shape.dims
  with layer_scope(x.graph, name, "multihead_attention"):
    q, k, v, wo, (memory_w_dim,) = _spatial_blocks_qkv(x, kv_channels, heads, master_dtype,
                                                       slice_dtype, 1)
    k, v = local_1d_halo_exchange(k, v, num_w_blocks, memory_w_dim, mask_right)
    mask = None
    if mask_right:
      mask = attention_bias_local_block(x.mesh, w_dim, memory_w_dim)
    o = dot_product_attention(q, k, v, mask)
    return einsum([o, wo], x.shape)


def local_2d_self_attention_spatial_blocks(query_antecedent, kv_channels, heads,
                                           is_training, memory_h_dim=None,
                                           memory_w_dim=None,
                                           mask_right=False, master_dtype=tf.float32,
                                           slice_dtype=tf.float32, name=None):
  """Self-attention of each image block to itself and its neighbouring blocks.

  query_antecedent: [batch, num_h_blocks, num_w_blocks, h_dim, w_dim, io_channels];
  returns its shape. A query sees the 3 x 3 blocks around (and including) its own; with
  mask_right only the blocks above-left, above, left and its own, and there only the
  positions before it in raster order (attention_bias_local_2d_block). Neighbours beyond
  the image edges are zero keys and values. The blocks dims may be split over the mesh.
  is_training, memory_h_dim and memory_w_dim are unused (the memory dims are
  "memory_<name>"), kept for the original signature.
  """
  del is_training, memory_h_dim, memory_w_dim
  x = query_antecedent
  _check_blocks_rank(x, "local_2d_self_attention_spatial_blocks",
                     ["batch", "num_h_blocks", "num_w_blocks", "h_dim", "w_dim",
                      "io_channels"])
  batch, num_h_blocks, num_w_blocks, h_dim, w_dim, _ = x.shape.dims
  with layer_scope(x.graph, name, "multihead_attention"):
    q, k, v, wo, (memory_h_dim, memory_w_dim) = _spatial_blocks_qkv(
        x, kv_channels, heads, master_dtype, slice_dtype, 2)
    k, v = local_2d_halo_exchange(k, v, num_h_blocks, memory_h_dim, num_w_blocks,
                                  memory_w_dim, mask_right)
    # dot_product_attention reduces one memory dim, so both memory axes become one.
    memory_dim = Dimension("memory_positions",
                           k.shape.get_dim_by_name(memory_h_dim.name).size *
                           k.shape.get_dim_by_name(memory_w_dim.name).size)
    blocks = [batch, heads, num_h_blocks, num_w_blocks]
    k, v = [reshape(t, blocks + [memory_dim, kv_channels]) for t in (k, v)]
    mask = None
    if mask_right:
      mask = attention_bias_local_2d_block(x.mesh, h_dim, w_dim, memory_h_dim,
                                           memory_w_dim)
      mask = reshape(mask, [h_dim, w_dim, memory_dim])
    o = dot_product_attention(q, k, v, mask)
    return einsum([o, wo], x.shape)
