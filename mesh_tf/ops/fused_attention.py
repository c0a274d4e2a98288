"""Dot-product attention, softmax(q.k + bias) . v, as one op with a one-op gradient.

As einsum, softmax and einsum, each of attention's six matmuls (two forward, four
backward) transposes the big [batch, length, heads, memory] logits. This op holds the
probabilities head-major ([batch..., heads..., length..., memory], the `probs` output)
and transposes only q, k, v and the output.

`models.transformer.attention.attention` and `mtf.layers.dot_product_attention` build it
where the dims allow (`dot_product_attention` below returns None otherwise): q, k and v
share a float dtype; k is exactly batch + memory + key dims and v batch + memory + value
dims, where batch is every other dim of k (all in q and v); the bias, if any, has only
logits dims. Dropout on the probabilities is an input too: the scale
`random.dropout_scale` draws, as mtf.dropout in the composite. The key, memory and value
dims are gathered whole on each processor, and for the gradient also q's own dims
(length), whose split would make the k and v gradients partial sums.
"""
import collections

import numpy as np
import tensorflow as tf

from mesh_tf.graph import Operation
from mesh_tf.lowering import direct_ops, plan_interpreter
from mesh_tf.lowering.local_einsum import permute_dims, reshape_if_needed
from mesh_tf.ops.fused_softmax import local_softmax
from mesh_tf.ops.random import dropout_scale
from mesh_tf.ops.reduce import reduce_sum
from mesh_tf.plans import rules as plan_rules
from mesh_tf.shapes import Shape


class _Dims(collections.namedtuple("_Dims", "batch query key memory value")):
  """The roles of an attention's dims: batch (in q, k and v, a tuple), query (q's own,
  e.g. length, a tuple), key, memory and value. A plain value, so two layers' slice
  functions that capture equal _Dims are traced once (slice_fn_key)."""
  __slots__ = ()

  @property
  def probs_shape(self):
    return Shape(list(self.batch + self.query) + [self.memory])


def _names(dims):
  return [d.name for d in dims]


def _classify(q, k, v, bias, key_dim, memory_dim, value_dim, output_shape):
  """A _Dims, or None where the fused op does not apply."""
  dtype = q.dtype
  if not (dtype.is_floating and k.dtype == dtype and v.dtype == dtype):
    return None
  if bias is not None and bias.dtype != dtype:
    return None
  if key_dim == memory_dim or memory_dim in q.shape.dims or value_dim == memory_dim:
    return None
  if key_dim not in q.shape.dims or key_dim not in k.shape.dims or (
      memory_dim not in k.shape.dims):
    return None
  batch = [d for d in k.shape.dims if d not in (key_dim, memory_dim)]
  if not all(d in q.shape.dims and d in v.shape.dims for d in batch):
    return None
  if len(v.shape.dims) != len(batch) + 2 or set(v.shape.dims) != set(
      batch + [memory_dim, value_dim]):
    return None
  # batch in q's order, so q's transpose moves as little as possible
  batch = [d for d in q.shape.dims if d in batch]
  query = [d for d in q.shape.dims if d not in batch and d != key_dim]
  if value_dim in query:
    return None
  if set(Shape(output_shape).dims) != set(batch + query + [value_dim]) or len(
      Shape(output_shape).dims) != len(batch) + len(query) + 1:
    return None
  if bias is not None and not all(d in batch + query + [memory_dim] for d in bias.shape.dims):
    return None
  return _Dims(tuple(batch), tuple(query), key_dim, memory_dim, value_dim)


def _arranged(value, names, order):
  """value (dims `names`) with its dims in `order` (a transpose, or a reshape where only
  dims of size 1 move)."""
  if names == order:
    return value
  return permute_dims(value, [names.index(n) for n in order])


def _size(shape):
  return int(np.prod(shape, dtype=np.int64))


class _Local:
  """One slice's q, k and v as [batch..., rows, cols] matrices."""

  def __init__(self, dims, q_dims, k_dims, v_dims, q, k, v):
    self.b, self.l = _names(dims.batch), _names(dims.query)
    key, memory, value = dims.key.name, dims.memory.name, dims.value.name
    nb = len(self.b)
    qh = _arranged(q, _names(q_dims), self.b + self.l + [key])
    self.batch_shape = qh.shape.as_list()[:nb]
    self.query_shape = qh.shape.as_list()[nb:-1]
    self.rows = _size(self.query_shape)
    self.q = reshape_if_needed(qh, self.batch_shape + [self.rows, qh.shape[-1]])
    self.k = _arranged(k, _names(k_dims), self.b + [memory, key])
    self.v = _arranged(v, _names(v_dims), self.b + [memory, value])
    self.memory_size = self.k.shape[-2]

  def rows_to_dims(self, value):
    """[batch..., rows, c] -> [batch..., query..., c]."""
    return reshape_if_needed(value, self.batch_shape + self.query_shape + [value.shape[-1]])

  def dims_to_rows(self, value):
    """[batch..., query..., c] -> [batch..., rows, c]."""
    return reshape_if_needed(value, self.batch_shape + [self.rows, value.shape[-1]])

  def like_logits(self, value, names, memory_name):
    """value, whose dims `names` are some of batch, query and memory, arranged and
    reshaped to broadcast against [batch..., query..., memory]."""
    all_names = self.b + self.l + [memory_name]
    full = self.batch_shape + self.query_shape + [self.memory_size]
    order = [n for n in all_names if n in names]
    value = _arranged(value, names, order)
    first = all_names.index(order[0]) if order else len(all_names)
    # dims missing before value's first one broadcast by themselves
    return reshape_if_needed(value, [s if n in order else 1
                                     for n, s in zip(all_names[first:], full[first:])])

  def scaled_rows(self, rows_value, scale):
    """[batch..., rows, memory] rows_value times scale (from like_logits), or itself."""
    if scale is None:
      return rows_value
    return self.dims_to_rows(self.rows_to_dims(rows_value) * scale)


class DotProductAttentionOperation(Operation):
  """softmax over memory_dim of (q.k over key_dim + bias), times v over memory_dim.

  Outputs: the attention output and the head-major probabilities before dropout. Inputs:
  q, k, v, then the bias and the dropout scale where given."""

  def __init__(self, q, k, v, bias, dims, output_shape, dropout=None, name=None):
    super().__init__([q, k, v] + [x for x in (bias, dropout) if x is not None],
                     name=name or "dot_product_attention")
    self.dims = dims
    self.bias = bias
    self.dropout = dropout
    self._add_output(Shape(output_shape), q.dtype)
    self._add_output(dims.probs_shape, q.dtype)

  def gradient(self, grad_ys):
    dout = grad_ys[0]
    if dout is None:
      return [None] * len(self.inputs)
    dq, dk, dv, ds = AttentionGradOperation(self, dout).outputs
    grads = [dq, dk, dv]
    if self.bias is not None:
      grads.append(reduce_sum(ds, output_shape=self.bias.shape))
    if self.dropout is not None:
      grads.append(None)  # random: no gradient
    return grads

  def plan(self, layout):
    """Gather key, memory and value dims where split; everything else is slicewise."""
    d = self.dims
    return plan_rules.whole_dims_plan(
        layout, [x.shape for x in self.inputs], [y.shape for y in self.outputs],
        frozenset([d.key.name, d.memory.name, d.value.name]))

  def lower(self, lowering):
    plan = self.plan(lowering.mesh_impl(self).slice_layout)
    d = self.dims
    # not the mtf tensors: every layer's function then has the same key (slice_fn_key)
    q_dims, k_dims, v_dims = (x.shape.dims for x in self.inputs[:3])
    bias_names = None if self.bias is None else self.bias.shape.dimension_names
    dropout_names = None if self.dropout is None else self.dropout.shape.dimension_names
    out_names = self.outputs[0].shape.dimension_names

    def local(q_s, k_s, v_s, *extra):
      m = _Local(d, q_dims, k_dims, v_dims, q_s, k_s, v_s)
      extra = list(extra)
      bias_s = extra.pop(0) if bias_names is not None else None
      scale = (m.like_logits(extra.pop(0), dropout_names, d.memory.name)
               if dropout_names is not None else None)
      logits = direct_ops.matmul(m.q, m.k, adjoint_b=True)  # [batch..., rows, memory]
      if bias_s is not None:
        logits = m.dims_to_rows(m.rows_to_dims(logits) + m.like_logits(
            bias_s, bias_names, d.memory.name))
      probs = local_softmax(logits, logits.shape.rank - 1)
      out = m.rows_to_dims(direct_ops.matmul(m.scaled_rows(probs, scale), m.v))
      out = _arranged(out, m.b + m.l + [d.value.name], out_names)
      return out, m.rows_to_dims(probs)
    plan_interpreter.lower_planned(lowering, self, plan, local)


class AttentionGradOperation(Operation):
  """The gradients of a DotProductAttentionOperation: dq, dk, dv and d logits (head-major,
  for a bias's gradient)."""

  def __init__(self, forward, dout, name=None):
    q, k, v = forward.inputs[:3]
    self.dropout = forward.dropout
    super().__init__([q, k, v, forward.outputs[1], dout] +
                     ([self.dropout] if self.dropout is not None else []),
                     name=name or forward.name + "_grad")
    self.dims = forward.dims
    for x in (q, k, v):
      self._add_output(x.shape, x.dtype)
    self._add_output(forward.dims.probs_shape, q.dtype)

  def plan(self, layout):
    """As the forward's, with q's own dims also whole: the k and v gradients sum over
    them."""
    d = self.dims
    whole = [d.key.name, d.memory.name, d.value.name] + _names(d.query)
    return plan_rules.whole_dims_plan(
        layout, [x.shape for x in self.inputs], [y.shape for y in self.outputs],
        frozenset(whole))

  def lower(self, lowering):
    plan = self.plan(lowering.mesh_impl(self).slice_layout)
    d = self.dims
    q_dims, k_dims, v_dims = (x.shape.dims for x in self.inputs[:3])
    q_names, k_names, v_names = (_names(dims) for dims in (q_dims, k_dims, v_dims))
    dout_names = self.inputs[4].shape.dimension_names
    dropout_names = None if self.dropout is None else self.dropout.shape.dimension_names

    def local(q_s, k_s, v_s, probs_s, dout_s, dropout_s=None):
      m = _Local(d, q_dims, k_dims, v_dims, q_s, k_s, v_s)
      scale = (m.like_logits(dropout_s, dropout_names, d.memory.name)
               if dropout_names is not None else None)
      probs = m.dims_to_rows(probs_s)
      do = m.dims_to_rows(_arranged(dout_s, dout_names, m.b + m.l + [d.value.name]))
      # the gradient of the probabilities through the dropout
      dprobs = m.scaled_rows(direct_ops.matmul(do, m.v, adjoint_b=True), scale)
      dv = direct_ops.matmul(m.scaled_rows(probs, scale), do,
                             adjoint_a=True)  # [batch..., memory, value]
      dlogits = probs * (dprobs - tf.reduce_sum(dprobs * probs, -1, keepdims=True))
      dq = m.rows_to_dims(direct_ops.matmul(dlogits, m.k))
      dk = direct_ops.matmul(dlogits, m.q, adjoint_a=True)  # [batch..., memory, key]
      return (_arranged(dq, m.b + m.l + [d.key.name], q_names),
              _arranged(dk, m.b + [d.memory.name, d.key.name], k_names),
              _arranged(dv, m.b + [d.memory.name, d.value.name], v_names),
              m.rows_to_dims(dlogits))
    plan_interpreter.lower_planned(lowering, self, plan, local)


def dot_product_attention(q, k, v, bias, key_dim, memory_dim, value_dim, output_shape,
                          dropout_rate=0.0, dropout_noise_shape=None):
  """The output of a DotProductAttentionOperation, or None where it does not apply (the
  caller then builds the composite). With dropout_rate, the probabilities get one mask
  per element of dropout_noise_shape (logits dims; the whole logits where None)."""
  dims = _classify(q, k, v, bias, key_dim, memory_dim, value_dim, output_shape)
  if dims is None:
    return None
  scale = None
  if dropout_rate:
    noise_shape = Shape(dropout_noise_shape if dropout_noise_shape is not None
                        else dims.probs_shape)
    if not all(d in dims.probs_shape.dims for d in noise_shape.dims):
      return None
    scale = dropout_scale(q.mesh, noise_shape, 1.0 - dropout_rate, q.dtype)
  return DotProductAttentionOperation(q, k, v, bias, dims, output_shape,
                                      dropout=scale).outputs[0]
