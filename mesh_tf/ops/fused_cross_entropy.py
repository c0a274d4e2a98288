"""Softmax cross-entropy against one-hot targets (`mtf.one_hot(ids, vocab)`) as one op.

`layers.softmax_cross_entropy_with_logits` builds this op, instead of about a dozen
passes over the [batch, length, vocab] logits, when the targets are a 1/0 one-hot of
integer ids:

- vocab whole on every processor: one softmax kernel, the loss from its largest
  probability and the target's logit, and d loss / d logits = softmax - one_hot;
- vocab split over a mesh axis: the local max and sum of exp(x - max) are allreduced
  (MAX, then SUM), and the target's logit is picked on the processor holding it and
  allreduced (SUM): the same three allreduces of [batch, length] the composite owes.

Outputs: the loss, d loss / d logits, and a weight per position that scales it (the 1/0
mask of ids inside the vocabulary: an id outside gives loss 0 and no gradient, as in the
composite). An auxiliary z_loss * logsumexp**2 is part of the op.
"""
import tensorflow as tf

from mesh_tf.graph import Operation
from mesh_tf.lowering import direct_ops, plan_interpreter
from mesh_tf.ops.indexing import OneHotOperation
from mesh_tf.plans import rules as plan_rules


class OneHotCrossEntropyOperation(Operation):
  """-log softmax(logits)[ids] over vocab_dim (the last dim of logits), plus
  z_loss * logsumexp(logits)**2."""

  def __init__(self, logits, ids, vocab_dim, z_loss=0.0, name=None):
    super().__init__([logits, ids], name=name or "one_hot_cross_entropy")
    self.vocab_dim = vocab_dim
    self.z_loss = float(z_loss)
    self._add_output(logits.shape - [vocab_dim], logits.dtype)  # loss
    self._add_output(logits.shape, logits.dtype)  # d loss / d logits, up to a row weight
    self._add_output(ids.shape, logits.dtype)  # that row weight

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
    z_loss = self.z_loss
    if not plan.middle:
      plan_interpreter.lower_planned(lowering, self, plan,
                                     lambda t, i: _whole_vocab(t, i, z_loss))
      return
    logits, ids = plan_interpreter.read_operands(lowering, self, plan)
    begin = impl.laid_out_slice_begin(self.inputs[0].shape)
    run = lambda v, m: plan_interpreter.run_steps(impl, v, m.shape, m.steps)
    top = run(impl.slicewise(lambda t: tf.reduce_max(t, -1), logits), plan.middle[0])
    # scalar zeros: tf.zeros_like is one Const up to 1,000 elements and a Fill above,
    # which would make the program depend on the slice size (the mesh)
    top = impl.slicewise(
        lambda m: tf.where(tf.math.is_finite(m), m, tf.zeros([], m.dtype)), top)
    total = run(impl.slicewise(lambda t, m: tf.reduce_sum(tf.exp(t - _column(m)), -1),
                               logits, top), plan.middle[1])
    size = self.vocab_dim.size

    def local_pick(t, i, b):
      local = tf.cast(i, tf.int32) - b[-1]
      here = _inside(local, t.shape[-1])
      rank = i.shape.rank  # a static, non-negative axis: the SIMD replay vectorizes it
      picked = tf.gather(t, tf.where(here, local, 0), axis=rank, batch_dims=rank)
      return tf.where(here, picked, tf.zeros([], picked.dtype))
    target = run(impl.slicewise(local_pick, logits, ids, begin), plan.middle[2])

    def finish(t, i, b, m, s, picked):
      lse = tf.math.log(s) + m
      valid = tf.cast(_inside(i, size), t.dtype)
      # an id outside this processor's piece (or the vocab) has an all-zero one-hot here
      local = tf.cast(i, tf.int32) - b[-1]
      return _outputs(lse, picked, valid, tf.exp(t - _column(lse)),
                      tf.one_hot(local, t.shape[-1], dtype=t.dtype), z_loss)
    plan_interpreter.write_outputs(lowering, self, plan, list(impl.slicewise(
        finish, logits, ids, begin, top, total, target)))


def _column(r):
  """r [...] as [..., 1], by a static reshape."""
  return direct_ops.reshape(r, r.shape.as_list() + [1])


def _inside(ids, size):
  """0 <= ids < size, as one compare (a negative id wraps to a huge unsigned one)."""
  return tf.cast(ids, tf.uint32) < size


def _outputs(lse, picked, valid, probs, one_hot, z_loss):
  """(loss, backprop, row weight) of a slice: d logits = backprop * (d loss * row weight).
  With z_loss, z_loss * lse**2 (every row) is folded into backprop, whose rows then carry
  their own weight: softmax * (valid + 2 z_loss lse) - one_hot."""
  loss = (lse - picked) * valid
  if not z_loss:
    return loss, probs - one_hot, valid
  loss += z_loss * tf.square(lse)
  scale = valid + 2.0 * z_loss * lse
  return loss, probs * _column(scale) - one_hot, tf.ones_like(valid)


def _whole_vocab(t, i, z_loss):
  """(loss, backprop, row weight) of one slice whose vocab (last) dim is whole.

  Uses the multithreaded softmax kernel, not TF's single-threaded fused sparse
  cross-entropy: logsumexp = max(logits) - log(max(softmax)), exact where the target's
  own probability would underflow."""
  depth = t.shape[-1]
  i = tf.cast(i, tf.int32)
  inside = direct_ops.reshape(_inside(i, depth), [-1])
  logits = direct_ops.reshape(t, [-1, depth])
  ids = direct_ops.reshape(i, [-1])
  probs = tf.nn.softmax(logits)
  lse = direct_ops.binary(tf.subtract, direct_ops.reduce(tf.reduce_max, logits, [1]),
                          tf.math.log(direct_ops.reduce(tf.reduce_max, probs, [1])))
  picked = tf.gather(logits, tf.where(inside, ids, 0), axis=1, batch_dims=1)
  one_hot = tf.one_hot(tf.where(inside, ids, -1), depth, dtype=t.dtype)
  loss, backprop, weight = _outputs(lse, picked, tf.cast(inside, t.dtype), probs, one_hot,
                                    z_loss)
  return (direct_ops.reshape(loss, i.shape.as_list()),
          direct_ops.reshape(backprop, t.shape.as_list()),
          direct_ops.reshape(weight, i.shape.as_list()))


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


def one_hot_cross_entropy(logits, ids, vocab_dim, z_loss=0.0):
  """The per-position loss of OneHotCrossEntropyOperation (see module docstring), plus
  z_loss * logsumexp(logits)**2."""
  return OneHotCrossEntropyOperation(logits, ids, vocab_dim, z_loss).outputs[0]
