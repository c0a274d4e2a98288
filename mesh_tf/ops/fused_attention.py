"""Dot-product attention, softmax(q.k + bias) . v, as one op with a one-op gradient.

Written as einsum, softmax and einsum, attention keeps the [batch, length, heads, memory]
logits in the order the model names them. With heads between length and memory, each of
its six matmuls (two forward, four backward) makes TF's einsum kernel transpose the big
[.., length, heads, memory] operand or result: on the tiny LM of benchmarks/step_time.py
that is 66 ms of a 375 ms step on one core for 3% of its FLOPs. This op instead holds the
probabilities head-major ([batch..., heads..., length..., memory], the `probs` output)
and transposes only q, k, v and the output, which are 1/4 the size here (memory 128
against d_kv 32): fwd + bwd of one layer's attention went from 61 ms to 27 ms on one core.

`models.transformer.attention.attention` and `mtf.layers.dot_product_attention` build it
where the dims allow (`dot_product_attention` below returns None otherwise and they keep
the composite): q, k and v share a float dtype; k is exactly batch + memory + key dims and
v batch + memory + value dims, where batch is every other dim of k (all in q and v); the
bias, if any, has only logits dims. The key, memory and value dims must be whole on each
processor (the plan gathers them where a layout splits them), and for the gradient also
q's own dims (length), whose split would make the k and v gradients partial sums.
"""
import numpy as np
import tensorflow as tf

from mesh_tf.graph import Operation
from mesh_tf.lowering import plan_interpreter
from mesh_tf.lowering.local_einsum import permute_dims, reshape_if_needed
from mesh_tf.ops.fused_softmax import local_softmax
from mesh_tf.ops.reduce import reduce_sum
from mesh_tf.plans import rules as plan_rules
from mesh_tf.shapes import Shape


class _Dims:
  """The roles of an attention's dims: batch (in q, k and v), query (q's own, e.g.
  length), key, memory and value."""

  def __init__(self, batch, query, key, memory, value):
    self.batch, self.query = list(batch), list(query)
    self.key, self.memory, self.value = key, memory, value

  @property
  def probs_shape(self):
    return Shape(self.batch + self.query + [self.memory])


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
  if key_dim not in q.shape.dims:
    return None
  if key_dim not in k.shape.dims or memory_dim not in k.shape.dims:
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
  return _Dims(batch, query, key_dim, memory_dim, value_dim)


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


class DotProductAttentionOperation(Operation):
  """softmax over memory_dim of (q.k over key_dim + bias), times v over memory_dim.

  Outputs: the attention output (output_shape) and the probabilities, head-major (its
  gradient reads them)."""

  def __init__(self, q, k, v, bias, dims, output_shape, name=None):
    super().__init__([q, k, v] + ([bias] if bias is not None else []),
                     name=name or "dot_product_attention")
    self.dims = dims
    self._add_output(Shape(output_shape), q.dtype)
    self._add_output(dims.probs_shape, q.dtype)

  def gradient(self, grad_ys):
    dout = grad_ys[0]
    if dout is None:
      return [None] * len(self.inputs)
    dq, dk, dv, ds = AttentionGradOperation(self, dout).outputs
    grads = [dq, dk, dv]
    if len(self.inputs) > 3:
      grads.append(reduce_sum(ds, output_shape=self.inputs[3].shape))
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
    q, k, v = self.inputs[:3]
    bias = self.inputs[3] if len(self.inputs) > 3 else None
    out_names = self.outputs[0].shape.dimension_names

    def local(q_s, k_s, v_s, bias_s=None):
      m = _Local(d, q.shape.dims, k.shape.dims, v.shape.dims, q_s, k_s, v_s)
      logits = tf.linalg.matmul(m.q, m.k, adjoint_b=True)  # [batch..., rows, memory]
      if bias_s is not None:
        all_names = m.b + m.l + [d.memory.name]
        full = m.batch_shape + m.query_shape + [m.memory_size]
        order = [n for n in all_names if n in bias.shape.dimension_names]
        b = _arranged(bias_s, bias.shape.dimension_names, order)
        first = all_names.index(order[0]) if order else len(all_names)
        # dims missing before the bias's first one broadcast by themselves
        b = reshape_if_needed(b, [s if n in order else 1
                                  for n, s in zip(all_names[first:], full[first:])])
        logits = m.dims_to_rows(m.rows_to_dims(logits) + b)
      probs = local_softmax(logits, logits.shape.rank - 1)
      out = m.rows_to_dims(tf.linalg.matmul(probs, m.v))
      out = _arranged(out, m.b + m.l + [d.value.name], out_names)
      return out, m.rows_to_dims(probs)
    plan_interpreter.lower_planned(lowering, self, plan, local)


class AttentionGradOperation(Operation):
  """The gradients of a DotProductAttentionOperation: dq, dk, dv and d logits (head-major,
  for a bias's gradient)."""

  def __init__(self, forward, dout, name=None):
    q, k, v = forward.inputs[:3]
    super().__init__([q, k, v, forward.outputs[1], dout],
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
    q, k, v, _, dout = self.inputs
    dout_names = dout.shape.dimension_names

    def local(q_s, k_s, v_s, probs_s, dout_s):
      m = _Local(d, q.shape.dims, k.shape.dims, v.shape.dims, q_s, k_s, v_s)
      probs = m.dims_to_rows(probs_s)
      do = m.dims_to_rows(_arranged(dout_s, dout_names, m.b + m.l + [d.value.name]))
      dprobs = tf.linalg.matmul(do, m.v, adjoint_b=True)
      dv = tf.linalg.matmul(probs, do, adjoint_a=True)  # [batch..., memory, value]
      dlogits = probs * (dprobs - tf.reduce_sum(dprobs * probs, -1, keepdims=True))
      dq = m.rows_to_dims(tf.linalg.matmul(dlogits, m.k))
      dk = tf.linalg.matmul(dlogits, m.q, adjoint_a=True)  # [batch..., memory, key]
      return (_arranged(dq, m.b + m.l + [d.key.name], q.shape.dimension_names),
              _arranged(dk, m.b + [d.memory.name, d.key.name], k.shape.dimension_names),
              _arranged(dv, m.b + [d.memory.name, d.value.name], v.shape.dimension_names),
              m.rows_to_dims(dlogits))
    plan_interpreter.lower_planned(lowering, self, plan, local)


def dot_product_attention(q, k, v, bias, key_dim, memory_dim, value_dim, output_shape):
  """The output of a DotProductAttentionOperation, or None where it does not apply (see
  the module docstring); the caller then builds the composite."""
  dims = _classify(q, k, v, bias, key_dim, memory_dim, value_dim, output_shape)
  if dims is None:
    return None
  return DotProductAttentionOperation(q, k, v, bias, dims, output_shape).outputs[0]
