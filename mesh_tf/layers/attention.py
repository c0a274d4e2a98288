"""Multi-head attention of `mtf.layers` (the original's pre-Transformer-package API).

No 1/sqrt(d) factor appears in the logits: as in the original, the query projection is
initialized smaller instead (stddev io**-0.5 * kv**-0.25 for q and k).
"""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.layers.masks import NEG_INF, rename_length_to_memory_length
from mesh_tf.layers.scoping import layer_scope
from mesh_tf.ops.einsum import einsum
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import fused_attention
from mesh_tf.ops import indexing
from mesh_tf.ops import random as random_ops
from mesh_tf.ops import reduce as reduce_ops
from mesh_tf.ops.reshape import reshape
from mesh_tf.ops import slicing
from mesh_tf.ops.variables import VariableDType, get_variable
from mesh_tf.shapes import Dimension, Shape


def dot_product_attention(q, k, v, mask, is_training=True, dropout=0.0,
                          dropout_broadcast_dims=None, extra_logit=None):
  """softmax(q.k + mask) . v over the memory dim (the second-to-last dim of k).

  q: [batch..., heads, length?, kv_channels]; k: [batch..., heads, memory_length,
  kv_channels]; v: [batch..., heads, memory_length, v_channels]; mask: None or additive
  (0 or -1e9) and broadcastable to the logits. dropout applies to the weights only when
  is_training; extra_logit (e.g. 0.0) adds a logit to the softmax denominator. Returns
  [q's dims without kv_channels..., v_channels].
  """
  memory_length = k.shape.dims[-2]
  if q.shape.dims[-1] != k.shape.dims[-1]:
    raise ShapeError("dot_product_attention: q %s and k %s must end in the same channels "
                     "dim" % (q.shape, k.shape), tensor=q.name, dim=q.shape.dims[-1].name)
  if memory_length not in v.shape.dims:
    raise ShapeError("dot_product_attention: v %s lacks k's memory dim %s" % (
        v.shape, memory_length), tensor=v.name, dim=memory_length.name)
  output_shape = Shape(q.shape.dims[:-1] + [v.shape.dims[-1]])
  logits_shape = Shape(q.shape.dims[:-1] + [memory_length])
  drops = is_training and dropout != 0.0
  noise_shape = logits_shape - list(dropout_broadcast_dims or []) if drops else None
  if extra_logit is None:
    fused = fused_attention.dot_product_attention(
        q, k, v, mask, q.shape.dims[-1], memory_length, v.shape.dims[-1], output_shape,
        dropout_rate=dropout if drops else 0.0, dropout_noise_shape=noise_shape)
    if fused is not None:
      return fused
  logits = einsum([q, k], logits_shape)
  if mask is not None:
    logits += mask
  weights = reduce_ops.softmax(logits, memory_length, extra_logit=extra_logit)
  if drops:
    weights = random_ops.dropout(weights, rate=dropout, noise_shape=noise_shape)
  return einsum([weights, v], output_shape)


def multihead_attention_params(mesh, heads, io_channels, kv_channels, variable_dtype,
                               combine=False):
  """The q, k, v, o projections, each shaped [heads, io_channels, kv_channels].

  Separate variables "q", "k", "v", "o", or with combine=True one variable "qkvo" with a
  leading qkvo=4 dim, unstacked. Initial stddevs: io**-0.5 * kv**-0.25 (q, k),
  io**-0.5 (v) and (io * heads)**-0.5 (o).
  """
  qk_stddev = io_channels.size ** -0.5 * kv_channels.size ** -0.25
  v_stddev = io_channels.size ** -0.5
  o_stddev = (io_channels.size * heads.size) ** -0.5
  stddevs = [qk_stddev, qk_stddev, v_stddev, o_stddev]
  shape = [heads, io_channels, kv_channels]
  if combine:
    qkvo = Dimension("qkvo", 4)

    def init(full_shape, dtype=tf.float32, **unused_kwargs):
      scale = tf.reshape(tf.constant(stddevs, tf.float32), [4, 1, 1, 1])
      return tf.cast(tf.random.normal(full_shape) * scale, dtype)
    w = get_variable(mesh, "qkvo", Shape([qkvo] + shape), initializer=init,
                     dtype=variable_dtype)
    return slicing.unstack(w, qkvo)
  return [get_variable(mesh, n, Shape(shape), dtype=variable_dtype,
                       initializer=tf.random_normal_initializer(stddev=s))
          for n, s in zip("qkvo", stddevs)]


def multihead_attention_vars(mesh, heads, io_channels, kv_channels, master_dtype,
                             slice_dtype, activation_dtype):
  """Deprecated: multihead_attention_params(..., combine=True) with three dtypes."""
  return multihead_attention_params(
      mesh, heads, io_channels, kv_channels,
      VariableDType(master_dtype, slice_dtype, activation_dtype), combine=True)


def _project(x, w, dims):
  return einsum([x, w], Shape(dims))


def multihead_attention(query_antecedent, memory_antecedent, mask, kv_channels, heads,
                        is_training=True, dropout=0.0, dropout_broadcast_dims=None,
                        master_dtype=tf.float32, slice_dtype=tf.float32,
                        name="multihead_attention"):
  """Multi-head attention with its q/k/v/o projections.

  query_antecedent: [batch..., length, io_channels]; memory_antecedent: [batch...,
  memory_length, io_channels], or None for self-attention (the query with length renamed
  to memory_length); mask: None or additive, broadcastable to [batch..., heads, length,
  memory_length]. Returns [batch..., length, io_channels].
  """
  batch_dims = query_antecedent.shape.dims[:-2]
  length, io_channels = query_antecedent.shape.dims[-2:]
  with layer_scope(query_antecedent.graph, name, "multihead_attention"):
    wq, wk, wv, wo = multihead_attention_vars(
        query_antecedent.mesh, heads, io_channels, kv_channels, master_dtype, slice_dtype,
        query_antecedent.dtype)
    if memory_antecedent is None:
      memory_antecedent = rename_length_to_memory_length(query_antecedent, length.name)
    memory_length, memory_channels = memory_antecedent.shape.dims[-2:]
    if memory_antecedent.shape.dims[:-2] != batch_dims:
      raise ShapeError("multihead_attention %r: memory %s has batch dims %s, query has %s"
                       % (name, memory_antecedent.name, memory_antecedent.shape.dims[:-2],
                          batch_dims), op=name, tensor=memory_antecedent.name)
    if memory_channels != io_channels:
      raise ShapeError("multihead_attention %r: memory channels %s differ from query "
                       "channels %s" % (name, memory_channels, io_channels), op=name,
                       tensor=memory_antecedent.name, dim=memory_channels.name)
    q = _project(query_antecedent, wq, batch_dims + [heads, length, kv_channels])
    k, v = [_project(memory_antecedent, w, batch_dims + [heads, memory_length, kv_channels])
            for w in (wk, wv)]
    o = dot_product_attention(q, k, v, mask, is_training, dropout, dropout_broadcast_dims)
    return _project(o, wo, batch_dims + [length, io_channels])


def multihead_self_attention_incremental(query_antecedent, prev_k, prev_v, step_num,
                                         master_dtype=tf.float32, slice_dtype=tf.float32,
                                         name="multihead_attention"):
  """One decoding step of causal self-attention with a key/value cache.

  query_antecedent: [batch..., io_channels], the current position's input; prev_k,
  prev_v: [batch..., heads, memory_length, kv_channels] caches (zeros ahead); step_num:
  int32 scalar mtf Tensor, the current position; name: variable scope (the variables of
  multihead_attention of that name). Returns (y [batch..., io_channels], new_k, new_v).
  """
  batch_dims = query_antecedent.shape.dims[:-1]
  io_channels = query_antecedent.shape.dims[-1]
  heads, memory_length, kv_channels = prev_k.shape.dims[-3:]
  with layer_scope(query_antecedent.graph, name, "multihead_attention"):
    wq, wk, wv, wo = multihead_attention_vars(
        query_antecedent.mesh, heads, io_channels, kv_channels, master_dtype, slice_dtype,
        query_antecedent.dtype)
    q, k, v = [_project(query_antecedent, w, batch_dims + [heads, kv_channels])
               for w in (wq, wk, wv)]
    at_step = indexing.one_hot(step_num, memory_length, dtype=prev_k.dtype)
    k = prev_k + ew.multiply(k, at_step, output_shape=prev_k.shape)
    v = prev_v + ew.multiply(v, at_step, output_shape=prev_v.shape)
    positions = indexing.mtf_range(query_antecedent.mesh, memory_length, tf.int32)
    mask = ew.cast(ew.greater(positions, step_num), q.dtype) * NEG_INF
    o = dot_product_attention(q, k, v, mask)
    return _project(o, wo, query_antecedent.shape.dims), k, v


def multihead_encdec_attention_incremental(query_antecedent, wq, wo, k, v, mask,
                                           name="multihead_attention"):
  """One decoding step of attention to precomputed encoder keys and values.

  wq, wo: [heads, io_channels, kv_channels] projections; k, v: [batch..., heads,
  memory_length, kv_channels]. Returns [batch..., io_channels].
  """
  heads, _, kv_channels = k.shape.dims[-3:]
  with layer_scope(query_antecedent.graph, name, "multihead_attention"):
    q = _project(query_antecedent, wq,
                 query_antecedent.shape.dims[:-1] + [heads, kv_channels])
    o = dot_product_attention(q, k, v, mask)
    return _project(o, wo, query_antecedent.shape.dims)


def compress_mean(x, dim, compression_factor):
  """Averages each run of compression_factor positions along dim (dim shrinks by it)."""
  if dim not in x.shape.dims:
    raise ShapeError("compress_mean: dim %s is not a dim of %s %s" % (dim, x.name, x.shape),
                     tensor=x.name, dim=dim.name)
  if dim.size % compression_factor:
    raise ShapeError("compress_mean: compression_factor %d does not divide dim %s of %s"
                     % (compression_factor, dim, x.name), tensor=x.name, dim=dim.name)
  dims = x.shape.dims
  pos = dims.index(dim)
  factor = Dimension("compression_factor", compression_factor)
  grouped = reshape(
      x, dims[:pos] + [Dimension(dim.name, dim.size // compression_factor), factor] +
      dims[pos + 1:])
  return reduce_ops.reduce_mean(grouped, reduced_dim=factor)


def multihead_self_attention_memory_compressed(x, mask_right, compression_factor,
                                               kv_channels, heads, is_training=True,
                                               dropout=0.0, dropout_broadcast_dims=None,
                                               master_dtype=tf.float32,
                                               slice_dtype=tf.float32,
                                               name="multihead_attention"):
  """Self-attention to a memory averaged over blocks of compression_factor positions.

  x: [batch..., length, io_channels]. With mask_right, a query sees only the memory
  blocks that end at or before it. The softmax has an extra logit of 0 so a query that
  sees no block attends to nothing. Returns x's shape.
  """
  batch_dims = x.shape.dims[:-2]
  length, io_channels = x.shape.dims[-2:]
  with layer_scope(x.graph, name, "compressed_attention"):
    wq, wk, wv, wo = multihead_attention_vars(x.mesh, heads, io_channels, kv_channels,
                                              master_dtype, slice_dtype, x.dtype)
    memory = rename_length_to_memory_length(compress_mean(x, length, compression_factor),
                                            length.name)
    memory_length = memory.shape.dims[-2]
    q = _project(x, wq, batch_dims + [heads, length, kv_channels])
    k, v = [_project(memory, w, batch_dims + [heads, memory_length, kv_channels])
            for w in (wk, wv)]
    mask = None
    if mask_right:
      query_pos = indexing.mtf_range(x.mesh, length, tf.int32)
      block_end = (indexing.mtf_range(x.mesh, memory_length, tf.int32) *
                   compression_factor + (compression_factor - 1))
      mask = ew.cast(ew.greater(block_end, query_pos), x.dtype) * NEG_INF
    o = dot_product_attention(q, k, v, mask, is_training, dropout, dropout_broadcast_dims,
                              extra_logit=0.0)
    return _project(o, wo, x.shape.dims)
