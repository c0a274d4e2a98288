"""Reducing the logits of an ensemble (a Unitransformer with `ensemble=n` carries an
"ensemble" dim) to one distribution per position, e.g. for decoding.

Each reducer has the signature `(logits, ensemble_dim, vocab_dim) -> logits` without
ensemble_dim; `reduce_ensemble_logits` picks one through gin.
"""
import gin
import tensorflow as tf

import mesh_tf as mtf


def _check(logits, ensemble_dim, vocab_dim):
  for dim, what in ((ensemble_dim, "ensemble_dim"), (vocab_dim, "vocab_dim")):
    if dim not in logits.shape.dims:
      raise mtf.ShapeError("reduce_ensemble_logits: %s %s is not a dim of logits %s %s"
                           % (what, dim, logits.name, logits.shape),
                           dim=dim.name, tensor=logits.name)


@gin.configurable(module="transformer")
def reduce_ensemble_logits_select(logits, ensemble_dim, vocab_dim, model_id=0):
  """The logits of ensemble member model_id."""
  _check(logits, ensemble_dim, vocab_dim)
  if not 0 <= model_id < ensemble_dim.size:
    raise mtf.ShapeError("reduce_ensemble_logits_select: model_id %d outside ensemble "
                         "dim %s" % (model_id, ensemble_dim), dim=ensemble_dim.name)
  # A one-hot contraction keeps ensemble_dim whole, so a layout may split it.
  member = mtf.one_hot(mtf.constant(logits.mesh, model_id, dtype=tf.int32), ensemble_dim,
                       dtype=logits.dtype)
  return mtf.reduce_sum(logits * member, reduced_dim=ensemble_dim)


@gin.configurable(module="transformer")
def reduce_ensemble_logits_mean_prob(logits, ensemble_dim, vocab_dim):
  """log of the members' mean probabilities (floored at 1e-20 before the log)."""
  _check(logits, ensemble_dim, vocab_dim)
  probs = mtf.reduce_mean(mtf.softmax(logits, reduced_dim=vocab_dim),
                          reduced_dim=ensemble_dim)
  return mtf.log(mtf.maximum(probs, 1e-20))


@gin.configurable(module="transformer")
def reduce_ensemble_logits_mean_logit(logits, ensemble_dim, vocab_dim):
  """The members' mean logits."""
  _check(logits, ensemble_dim, vocab_dim)
  return mtf.reduce_mean(logits, reduced_dim=ensemble_dim)


@gin.configurable(module="transformer")
def reduce_ensemble_logits(logits, ensemble_dim, vocab_dim,
                           reduce_fn=reduce_ensemble_logits_mean_prob):
  """reduce_fn(logits, ensemble_dim, vocab_dim); mean probability by default."""
  return reduce_fn(logits, ensemble_dim, vocab_dim)
