"""Softmax cross-entropy against one-hot targets (`mtf.one_hot(ids, vocab)`) as one op.

`layers.softmax_cross_entropy_with_logits` with dense targets costs about a dozen passes
over the [batch, length, vocab] logits (the one-hot, logsumexp, (lse - logits) * targets,
their sum, and as many again for the gradient). When the targets are a 1/0 one-hot of
integer ids it builds this op instead:

- vocab whole on every processor: one softmax kernel, the loss from its largest
  probability and the target's logit, and d loss / d logits = softmax - one_hot;
- vocab split over a mesh axis: the local max and sum of exp(x - max) are allreduced
  (MAX, then SUM: the communication of the fused logsumexp), and the target's logit is
  picked on the processor holding it and allreduced (SUM), the same three allreduces of
  [batch, length] the composite owes.

Outputs: the loss, the gradient of the loss with respect to the logits, and a 1/0 mask
of ids inside the vocabulary; an id outside it gives loss 0 and no gradient, as the
one-hot of it (all zeros) does in the composite.
"""
import tensorflow as tf

from mesh_tf.graph import Operation
from mesh_tf.lowering import plan_interpreter
from mesh_tf.ops.indexing import OneHotOperation
from mesh_tf.plans import rules as plan_rules


class OneHotCrossEntropyOperation(Operation):
  """-log softmax(logits)[ids] over vocab_dim (the last dim of logits)."""

  def __init__(self, logits, ids, vocab_dim, name=None):
    super().__init__([logits, ids], name=name or "one_hot_cross_entropy")
    self.vocab_dim = vocab_dim
    self._add_output(logits.shape - [vocab_dim], logits.dtype)  # loss
    self._add_output(logits.shape, logits.dtype)  # d loss / d logits
    self._add_output(ids.shape, logits.dtype)  # 1 where the id is inside the vocab

  def gradient(self, grad_ys):
    dloss = grad_ys[0]
    if dloss is None:
      return [None, None]
    return [self.outputs[1] * (dloss * self.outputs[2]), None]

  def plan(self, layout):
    """The OpPlan on a MeshLayout (see plans/rules.cross_entropy_plan)."""
    logits = self.inputs[0]
    return plan_rules.cross_entropy_plan(layout, logits.shape, self.vocab_dim,
                                         logits.dtype.size)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    plan = self.plan(impl.slice_layout)
    if not plan.middle:
      plan_interpreter.lower_planned(lowering, self, plan, _whole_vocab)
      return
    logits, ids = plan_interpreter.read_operands(lowering, self, plan)
    begin = impl.laid_out_slice_begin(self.inputs[0].shape)
    run = lambda v, m: plan_interpreter.run_steps(impl, v, m.shape, m.steps)
    top = run(impl.slicewise(lambda t: tf.reduce_max(t, -1), logits), plan.middle[0])
    top = impl.slicewise(lambda m: tf.where(tf.math.is_finite(m), m, tf.zeros_like(m)), top)
    total = run(impl.slicewise(lambda t, m: tf.reduce_sum(tf.exp(t - _column(m)), -1),
                               logits, top), plan.middle[1])
    size = self.vocab_dim.size

    def local_pick(t, i, b):
      local = tf.cast(i, tf.int32) - b[-1]
      here = _inside(local, t.shape[-1])
      rank = i.shape.rank  # a static, non-negative axis: the SIMD replay vectorizes it
      picked = tf.gather(t, tf.where(here, local, 0), axis=rank, batch_dims=rank)
      return tf.where(here, picked, tf.zeros_like(picked))
    target = run(impl.slicewise(local_pick, logits, ids, begin), plan.middle[2])

    def finish(t, i, b, m, s, picked):
      lse = tf.math.log(s) + m
      valid = tf.cast(_inside(i, size), t.dtype)
      local = tf.cast(i, tf.int32) - b[-1]
      backprop = tf.exp(t - _column(lse)) - tf.one_hot(local, t.shape[-1], dtype=t.dtype)
      return (lse - picked) * valid, backprop, valid
    plan_interpreter.write_outputs(lowering, self, plan, list(impl.slicewise(
        finish, logits, ids, begin, top, total, target)))


def _column(r):
  """r [...] as [..., 1], by a static reshape."""
  return tf.reshape(r, r.shape.as_list() + [1])


def _inside(ids, size):
  """0 <= ids < size, as one compare (a negative id wraps to a huge unsigned one)."""
  return tf.cast(ids, tf.uint32) < size


def _whole_vocab(t, i):
  """(loss, backprop, valid) of one slice whose vocab (last) dim is whole.

  TF's fused SparseSoftmaxCrossEntropyWithLogits runs on one thread here (16.8 ms for
  [4096, 2048] float32 logits); the same from the multithreaded softmax kernel takes
  7.1 ms: logsumexp = max(logits) - log(max(softmax)), exact where the target's own
  probability would underflow, and d loss / d logits = softmax - one_hot."""
  depth = t.shape[-1]
  i = tf.cast(i, tf.int32)
  inside = _inside(i, depth)
  logits = tf.reshape(t, [-1, depth])
  ids = tf.reshape(tf.where(inside, i, 0), [-1])
  probs = tf.nn.softmax(logits)
  lse = tf.reduce_max(logits, 1) - tf.math.log(tf.reduce_max(probs, 1))
  loss = lse - tf.gather(logits, ids, axis=1, batch_dims=1)
  backprop = probs - tf.one_hot(ids, depth, dtype=t.dtype)
  valid = tf.cast(inside, t.dtype)
  return tf.reshape(loss, i.shape) * valid, tf.reshape(backprop, t.shape), valid


def one_hot_ids(targets, vocab_dim):
  """The integer ids whose 1/0 one-hot along vocab_dim (its last dim) `targets` is, or
  None when targets is anything else."""
  op = targets.operation
  if not (isinstance(op, OneHotOperation) and targets.shape.dims[-1] == vocab_dim and
          targets.dtype.is_floating):
    return None
  on, off = op.on_off_values
  if not (isinstance(on, (int, float)) and isinstance(off, (int, float)) and
          on == 1 and off == 0):
    return None
  return op.inputs[0]


def one_hot_cross_entropy(logits, ids, vocab_dim):
  """The per-position loss of OneHotCrossEntropyOperation (see module docstring)."""
  return OneHotCrossEntropyOperation(logits, ids, vocab_dim).outputs[0]
