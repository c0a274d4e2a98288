"""Dot-product attention over named dims and the q/k/v/o projection weights.

The port of the original's transformer/attention.py: `attention` (softmax(q.k + bias) v
with the memory dim named), `AttentionParams` (the projection variables, stored the way
the original's checkpoints store them), `local_attention_1d` (windowed attention whose
length dim may be split over the mesh) and `visibility_mask_to_attention_bias`.
"""
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import ShapeError
from mesh_tf.ops.halo import halo_exchange_sides

# Added to the logits of memory positions a query must not see.
NEG_INF = -1e9


def visibility_mask_to_attention_bias(visible, dtype):
  """0 where visible is True, -1e9 where it is False (an additive attention bias)."""
  return mtf.cast(mtf.logical_not(visible), dtype) * NEG_INF


def _logits_shape(q, k, key_dim):
  dims = [d for d in q.shape.dims if d != key_dim]
  dims += [d for d in k.shape.dims if d not in dims and d != key_dim]
  return mtf.Shape(dims)


def attention_logits_z_loss(logits, memory_length_dim, coeff):
  """coeff * mean over queries of logsumexp(logits over memory)^2 (keeps logits small)."""
  lse = mtf.reduce_logsumexp(mtf.cast(logits, tf.float32), memory_length_dim)
  return mtf.reduce_mean(mtf.square(lse)) * coeff


def attention(q, k, v, memory_length_dim, key_dim, value_dim, bias=None, dropout_rate=0.0,
              dropout_broadcast_dims=None, extra_logit=None, context=None,
              float32_logits=True, z_loss_coeff=None):
  """softmax over memory_length_dim of (q.k + bias), times v.

  Args:
    q: [batch..., heads..., length?, key_dim].
    k: [batch..., heads..., memory_length_dim, key_dim].
    v: [batch..., heads..., memory_length_dim, value_dim].
    memory_length_dim: the dim the softmax runs over.
    key_dim, value_dim: the dims contracted with q and produced from v.
    bias: None or an additive bias broadcastable to the logits (0 / -1e9 entries).
    dropout_rate: dropout on the attention weights (callers pass 0.0 outside training).
    dropout_broadcast_dims: dims along which one dropout mask is shared.
    extra_logit: an extra logit (e.g. 0.0) in the softmax denominator.
    context: the layer's Context; receives the z-loss (training only).
    float32_logits: compute logits and softmax in float32 whatever q's dtype.
    z_loss_coeff: if set, adds attention_logits_z_loss to context.losses when training.

  Returns:
    q's dims without key_dim, followed by value_dim.
  """
  for tensor, need in ((q, key_dim), (k, key_dim), (k, memory_length_dim),
                       (v, memory_length_dim), (v, value_dim)):
    if need not in tensor.shape.dims:
      raise ShapeError("attention: %s %s lacks dim %s" % (tensor.name, tensor.shape, need),
                       tensor=tensor.name, dim=need.name)
  if float32_logits:
    q, k = mtf.cast(q, tf.float32), mtf.cast(k, tf.float32)
  logits = mtf.einsum([q, k], output_shape=_logits_shape(q, k, key_dim))
  if bias is not None:
    logits += mtf.cast(bias, logits.dtype)
  if (z_loss_coeff and context is not None and context.train
      and context.losses is not None):
    context.losses.append(attention_logits_z_loss(logits, memory_length_dim, z_loss_coeff))
  weights = mtf.cast(mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit),
                     v.dtype)
  if dropout_rate:
    noise_shape = weights.shape - list(dropout_broadcast_dims or [])
    weights = mtf.dropout(weights, rate=dropout_rate, noise_shape=noise_shape)
  output_dims = [d for d in q.shape.dims if d != key_dim] + [value_dim]
  return mtf.einsum([weights, v], output_shape=mtf.Shape(output_dims))


def _combined_dim(dims):
  """One dim named like the first of dims, as large as all of them together."""
  return mtf.Dimension(dims[0].name, mtf.Shape(dims).size)


class AttentionParams:
  """The projection variables of multi-head attention.

  With combine_dims=True (the original's default and checkpoint format) each projection
  is one 2-D variable: q, k, v are [input_dim, heads*d_kv] and o is [heads*d_kv,
  output_dim], the heads the major index; they are reshaped to [input_dim, heads, d_kv]
  (and [heads, d_kv, output_dim]) for use. The combined dim keeps the heads dim's name,
  so a layout that splits "heads" splits the variable the same way. Otherwise the
  variables have the heads and key dims separately. memory_heads_dims=[] gives
  multi-query attention (one key/value head shared by all query heads).

  fold_scaling_into_initializer=True: q starts with stddev (d_model * d_kv)**-0.5 and the
  logits are not scaled at run time; with False q starts at d_model**-0.5 and
  compute_q multiplies by d_kv**-0.5. Variables are created in the current variable
  scope (e.g. ".../SelfAttention/q").
  """

  def __init__(self, mesh, query_input_dim, memory_input_dim, output_dim, key_dim,
               value_dim, query_heads_dims, memory_heads_dims, variable_dtype,
               shared_kv=False, no_query=False, combine_dims=True, ensemble_dim=None,
               keep_query_heads_dims=False, fold_scaling_into_initializer=True,
               make_attention_vars=True):
    self.mesh = mesh
    self.query_input_dim = query_input_dim
    self.memory_input_dim = memory_input_dim
    self.output_dim = output_dim
    self.key_dim = key_dim
    self.value_dim = value_dim
    self.query_heads_dims = list(query_heads_dims or [])
    self.memory_heads_dims = list(memory_heads_dims or [])
    self.variable_dtype = variable_dtype
    self.shared_kv = shared_kv
    self.no_query = no_query
    self.combine_dims = combine_dims
    self.ensemble_dims = [ensemble_dim] if ensemble_dim else []
    self.keep_query_heads_dims = keep_query_heads_dims
    self.fold_scaling_into_initializer = fold_scaling_into_initializer
    if shared_kv and key_dim != value_dim:
      raise ShapeError("AttentionParams: shared_kv needs key_dim %s == value_dim %s" % (
          key_dim, value_dim), dim=key_dim.name)
    for d in self.memory_heads_dims:
      if d not in self.query_heads_dims:
        raise ShapeError("AttentionParams: memory heads dim %s is not a query heads dim "
                         "(%s)" % (d, self.query_heads_dims), dim=d.name)
    if make_attention_vars:
      self.init_weights()

  @property
  def q_dims(self):
    """Dims a projected query gains: query heads then key_dim."""
    return self.query_heads_dims + [self.key_dim]

  @property
  def k_dims(self):
    """Dims a projected key gains: memory heads then key_dim."""
    return self.memory_heads_dims + [self.key_dim]

  @property
  def v_dims(self):
    """Dims a projected value gains: memory heads then value_dim."""
    return self.memory_heads_dims + [self.value_dim]

  @property
  def o_dims(self):
    """Dims the output projection contracts (the query heads are kept if asked to)."""
    if self.keep_query_heads_dims:
      return [self.value_dim]
    return self.query_heads_dims + [self.value_dim]

  def _make(self, name, input_dims, output_dims, stddev):
    """Variable `name` over input_dims -> output_dims, reshaped to the separate dims."""
    shape = self.ensemble_dims + input_dims + output_dims
    stored = shape
    if self.combine_dims:
      stored = self.ensemble_dims + [_combined_dim(d) if len(d) > 1 else d[0]
                                     for d in (input_dims, output_dims)]
    var = mtf.get_variable(self.mesh, name, mtf.Shape(stored),
                           initializer=tf.random_normal_initializer(stddev=stddev),
                           dtype=self.variable_dtype)
    return mtf.reshape(var, mtf.Shape(shape)) if stored != shape else var

  def init_weights(self):
    """Creates the variables q (unless no_query), k, v (unless shared_kv) and o."""
    d_in = self.query_input_dim.size
    if self.fold_scaling_into_initializer:
      q_stddev = (d_in * self.key_dim.size) ** -0.5
    else:
      q_stddev = d_in ** -0.5
    kv_stddev = self.memory_input_dim.size ** -0.5
    o_stddev = mtf.Shape(self.query_heads_dims + [self.value_dim]).size ** -0.5
    self.wq = None if self.no_query else self._make(
        "q", [self.query_input_dim], self.q_dims, q_stddev)
    if self.shared_kv:
      self.wkv = self._make("kv", [self.memory_input_dim], self.k_dims, kv_stddev)
      self.wk = self.wv = self.wkv
    else:
      self.wk = self._make("k", [self.memory_input_dim], self.k_dims, kv_stddev)
      self.wv = self._make("v", [self.memory_input_dim], self.v_dims, kv_stddev)
    self.wo = self._make("o", self.o_dims, [self.output_dim], o_stddev)

  def _project(self, x, w, input_dim, new_dims, what):
    if input_dim not in x.shape.dims:
      raise ShapeError("AttentionParams.%s: input %s %s lacks dim %s" % (
          what, x.name, x.shape, input_dim), tensor=x.name, dim=input_dim.name)
    kept = [d for d in x.shape.dims if d != input_dim]
    out = kept + [d for d in self.ensemble_dims if d not in kept] + new_dims
    return mtf.einsum([x, mtf.cast(w, x.dtype)], output_shape=mtf.Shape(out))

  def compute_q(self, query_antecedent):
    """[batch..., length, d_model] -> [batch..., length, heads, d_kv]."""
    if self.no_query:
      raise ShapeError("AttentionParams.compute_q: built with no_query=True",
                       tensor=query_antecedent.name)
    q = self._project(query_antecedent, self.wq, self.query_input_dim, self.q_dims,
                      "compute_q")
    if not self.fold_scaling_into_initializer:
      q *= self.key_dim.size ** -0.5
    return q

  def compute_k(self, memory_antecedent):
    """[batch..., memory_length, d_model] -> [..., memory heads, d_kv]."""
    return self._project(memory_antecedent, self.wk, self.memory_input_dim, self.k_dims,
                         "compute_k")

  def compute_v(self, memory_antecedent):
    """[batch..., memory_length, d_model] -> [..., memory heads, value dim]."""
    return self._project(memory_antecedent, self.wv, self.memory_input_dim, self.v_dims,
                         "compute_v")

  def compute_kv(self, memory_antecedent):
    """The shared key/value projection (shared_kv=True only)."""
    if not self.shared_kv:
      raise ShapeError("AttentionParams.compute_kv: needs shared_kv=True",
                       tensor=memory_antecedent.name)
    return self.compute_k(memory_antecedent)

  def compute_output(self, o, output_shape=None):
    """Contracts o's heads and value dims with the output projection."""
    for d in self.o_dims:
      if d not in o.shape.dims:
        raise ShapeError("AttentionParams.compute_output: %s %s lacks dim %s" % (
            o.name, o.shape, d), tensor=o.name, dim=d.name)
    if output_shape is None:
      kept = [d for d in o.shape.dims if d not in self.o_dims]
      output_shape = kept + [d for d in self.ensemble_dims if d not in kept] + [
          self.output_dim]
    return mtf.einsum([o, mtf.cast(self.wo, o.dtype)],
                      output_shape=mtf.convert_to_shape(output_shape))


def attention_params_simple(mesh, io_dim, kv_dim, heads_dim, variable_dtype):
  """AttentionParams for plain multi-head attention: d_model in and out, one heads dim."""
  return AttentionParams(mesh, query_input_dim=io_dim, memory_input_dim=io_dim,
                         output_dim=io_dim, key_dim=kv_dim, value_dim=kv_dim,
                         query_heads_dims=[heads_dim], memory_heads_dims=[heads_dim],
                         variable_dtype=variable_dtype)


def _block_length(radius, length_per_split):
  """The largest divisor of length_per_split no larger than max(radius, 128)."""
  block = min(max(radius, 128), length_per_split)
  while length_per_split % block:
    block -= 1
  return block


def local_attention_1d(q, k, v, length_dim, key_dim, value_dim, fully_autoregressive=True,
                       length_dim_num_splits=1, radius=128, sequence_id=1,
                       write_priority=None, read_priority=None, attention_kwargs=None):
  """Attention in which position i sees positions j with |i - j| <= radius.

  With fully_autoregressive only j <= i. The length is cut into blocks (a whole number
  per split of length_dim over the mesh); each block's keys and values gain the radius
  positions before it (and after it, unless autoregressive) from the neighbouring
  blocks with a halo exchange, so a split length dim communicates only with neighbours.
  Memory positions beyond either end and, when sequence_id is a Tensor, positions of
  another segment are masked. write_priority / read_priority: optional Tensors on
  length_dim; a query sees only memory whose write_priority is at most its
  read_priority.

  Args:
    q: [batch..., heads..., length_dim, key_dim]; k, v the same with value_dim for v
      (v may be None to reuse k).
    length_dim: the (query and memory) length dim.
    key_dim, value_dim: as in attention().
    fully_autoregressive: causal masking.
    length_dim_num_splits: over how many processors length_dim is split.
    radius: how far a query sees.
    sequence_id: segment ids [batch..., length_dim] of packed examples, or an int.
    attention_kwargs: extra keyword arguments of attention().

  Returns:
    [batch..., heads..., length_dim, value_dim].
  """
  if length_dim not in q.shape.dims:
    raise ShapeError("local_attention_1d: q %s %s lacks length dim %s" % (
        q.name, q.shape, length_dim), tensor=q.name, dim=length_dim.name)
  if length_dim.size % length_dim_num_splits:
    raise ShapeError("local_attention_1d: %d splits do not divide %s" % (
        length_dim_num_splits, length_dim), dim=length_dim.name)
  mesh = q.mesh
  block = _block_length(radius, length_dim.size // length_dim_num_splits)
  # Named like length_dim, the blocks dim inherits its split; with the split unknown
  # (num_splits 1) another name keeps a length layout rule from splitting it unevenly.
  blocks_name = length_dim.name if length_dim_num_splits > 1 else "local_blocks"
  blocks_dim = mtf.Dimension(blocks_name, length_dim.size // block)
  query_block = mtf.Dimension("query_block_length", block)
  memory_block = mtf.Dimension("memory_block_length", block)
  right = 0 if fully_autoregressive else radius

  def as_query(x):
    return mtf.replace_dimensions(x, length_dim, [blocks_dim, query_block])

  def as_memory(x):
    x = mtf.replace_dimensions(x, length_dim, [blocks_dim, memory_block])
    return halo_exchange_sides(x, blocks_dim, memory_block, radius, right)

  positions = mtf.range(mesh, length_dim, tf.int32)
  query_pos = as_query(positions)
  # Shifted by one so that the zeros the halo exchange pads with mark "no position".
  memory_pos = as_memory(positions + 1) - 1
  memory_block_ext = memory_pos.shape.dims[-1]
  relative = memory_pos - query_pos
  visible = mtf.logical_and(mtf.greater_equal(memory_pos, 0),
                            mtf.less_equal(mtf.abs(relative), radius))
  if fully_autoregressive:
    visible = mtf.logical_and(visible, mtf.less_equal(relative, 0))
  if isinstance(sequence_id, mtf.Tensor):
    visible = mtf.logical_and(visible, mtf.equal(as_query(sequence_id),
                                                 as_memory(sequence_id)))
  if write_priority is not None and read_priority is not None:
    visible = mtf.logical_and(visible, mtf.less_equal(as_memory(write_priority),
                                                      as_query(read_priority)))
  bias = visibility_mask_to_attention_bias(visible, tf.float32)
  q = as_query(q)
  k = as_memory(k)
  v = k if v is None else as_memory(v)
  o = attention(q, k, v, memory_block_ext, key_dim, value_dim, bias=bias,
                **(attention_kwargs or {}))
  return mtf.replace_dimensions(o, [blocks_dim, query_block], length_dim)
