"""Losses of `mtf.layers`."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import fused_cross_entropy
from mesh_tf.ops import reduce as reduce_ops


def softmax_cross_entropy_with_logits(logits, targets, vocab_dim, z_loss=0.0):
  """Per-example cross-entropy of softmax(logits) against target distributions.

  targets: logits' shape (e.g. one_hot of the labels); z_loss: coefficient of an
  auxiliary loss z_loss * logsumexp(logits)**2. Returns logits' shape without vocab_dim.
  """
  if logits.shape != targets.shape:
    raise ShapeError("softmax_cross_entropy_with_logits: logits %s and targets %s must "
                     "have the same shape" % (logits.shape, targets.shape))
  if vocab_dim not in logits.shape.dims:
    raise ShapeError("softmax_cross_entropy_with_logits: vocab_dim %s is not a dim of "
                     "logits %s" % (vocab_dim, logits.shape), dim=getattr(vocab_dim, "name",
                                                                           vocab_dim))
  ids = fused_cross_entropy.one_hot_ids(targets, vocab_dim)
  if ids is not None and ids.mesh is logits.mesh:
    return fused_cross_entropy.one_hot_cross_entropy(logits, ids, vocab_dim, z_loss)
  lse = reduce_ops.reduce_logsumexp(logits, vocab_dim)
  loss = reduce_ops.reduce_sum((lse - logits) * targets, reduced_dim=vocab_dim)
  if z_loss:
    loss += z_loss * ew.square(lse)
  return loss


def sigmoid_cross_entropy_with_logits(logits, targets):
  """Elementwise cross-entropy of sigmoid(logits) against targets in [0, 1].

  Uses the stable form max(l, 0) - l * t + log(1 + exp(-|l|)).
  """
  if logits.shape != targets.shape:
    raise ShapeError("sigmoid_cross_entropy_with_logits: logits %s %s and targets %s %s "
                     "must have the same shape" % (logits.name, logits.shape, targets.name,
                                                   targets.shape), tensor=targets.name)
  return ew.relu(logits) - logits * targets + ew.log1p(ew.exp(-ew.abs(logits)))


def weights_nonzero(targets, dtype=tf.float32):
  """1 where targets is nonzero (a real token), 0 where it is padding, in dtype."""
  return ew.cast(ew.not_equal(targets, ew.zeros_like(targets)), dtype)
