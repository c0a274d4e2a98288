"""Reductions (mesh_tf/ops/reduce.py) over split and unsplit dims, against plain TF."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, HIDDEN, LENGTH, check_against_tf, random_array,
                         random_ints)

X_SHAPE = [BATCH, LENGTH, HIDDEN]

# (label, mtf keyword arguments, TF axes reduced, permutation of the kept TF axes)
REDUCTIONS = [
    ("all dims", {}, [0, 1, 2], None),
    ("batch (split)", {"reduced_dim": BATCH}, [0], None),
    ("hidden (split)", {"reduced_dim": HIDDEN}, [2], None),
    ("length (unsplit)", {"reduced_dim": LENGTH}, [1], None),
    ("batch and hidden", {"reduced_dim": [BATCH, HIDDEN]}, [0, 2], None),
    ("to [hidden, batch]", {"output_shape": [HIDDEN, BATCH]}, [1], [1, 0]),
    ("to [length]", {"output_shape": [LENGTH]}, [0, 2], None),
]


def _tf_reduce(fn, t, axes, perm):
  r = fn(t, axis=axes)
  return tf.transpose(r, perm) if perm else r


@pytest.mark.parametrize("mtf_fn,tf_fn", [
    (mtf.reduce_sum, tf.reduce_sum), (mtf.reduce_mean, tf.reduce_mean),
    (mtf.reduce_max, tf.reduce_max), (mtf.reduce_min, tf.reduce_min)],
                         ids=["sum", "mean", "max", "min"])
def test_float_reductions(mesh_impl, mtf_fn, tf_fn):
  # Distinct random values: max/min have a unique arg, so the gradient is unambiguous.
  inputs = [(random_array(X_SHAPE, seed), X_SHAPE) for seed in range(len(REDUCTIONS))]
  check_against_tf(
      mesh_impl, inputs,
      lambda *xs: [mtf_fn(x, **kw) for x, (_, kw, _, _) in zip(xs, REDUCTIONS)],
      lambda *ts: [_tf_reduce(tf_fn, t, axes, perm)
                   for t, (_, _, axes, perm) in zip(ts, REDUCTIONS)],
      labels=[r[0] for r in REDUCTIONS], input_labels=[r[0] for r in REDUCTIONS],
      atol=1e-5)


def test_max_min_gradient_splits_ties(mesh_impl):
  # With ties, the gradient is shared equally among the maximal elements, like TF's.
  x = random_ints(X_SHAPE, 3, 0, 3).astype(np.float32)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)] * 4,
      lambda a, b, c, d: [mtf.reduce_max(a, reduced_dim=BATCH),
                          mtf.reduce_min(b, reduced_dim=HIDDEN),
                          mtf.reduce_max(c), mtf.reduce_min(d, reduced_dim=LENGTH)],
      lambda a, b, c, d: [tf.reduce_max(a, 0), tf.reduce_min(b, 2), tf.reduce_max(c),
                          tf.reduce_min(d, 1)],
      labels=["max over batch", "min over hidden", "max of all", "min over length"])


def test_integer_reductions(mesh_impl):
  x = random_ints(X_SHAPE, 5, -50, 50)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)],
      lambda a: [mtf.reduce_sum(a, reduced_dim=BATCH), mtf.reduce_max(a, reduced_dim=HIDDEN),
                 mtf.reduce_min(a), mtf.reduce_sum(a, output_shape=[HIDDEN, LENGTH])],
      lambda t: [tf.reduce_sum(t, 0), tf.reduce_max(t, 2), tf.reduce_min(t),
                 tf.transpose(tf.reduce_sum(t, 0))],
      labels=["int sum over batch", "int max over hidden", "int min of all",
              "int sum to [hidden, length]"])


def test_bool_reductions(mesh_impl):
  # Rows with mostly True values, so reduce_all is sometimes True.
  x = random_ints(X_SHAPE, 4, 0, 6) > 0
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)],
      lambda a: [mtf.reduce_any(a, reduced_dim=BATCH), mtf.reduce_all(a, reduced_dim=LENGTH),
                 mtf.reduce_all(a, reduced_dim=HIDDEN), mtf.reduce_any(a),
                 mtf.reduce_all(a, output_shape=[HIDDEN, BATCH])],
      lambda t: [tf.reduce_any(t, 0), tf.reduce_all(t, 1), tf.reduce_all(t, 2),
                 tf.reduce_any(t), tf.transpose(tf.reduce_all(t, 1))],
      labels=["any over batch", "all over length", "all over hidden", "any",
              "all to [hidden, batch]"])


@pytest.mark.parametrize("dim,axis", [(BATCH, 0), (LENGTH, 1), (HIDDEN, 2)],
                         ids=["batch", "length", "hidden"])
def test_logsumexp_and_softmax(mesh_impl, dim, axis):
  x = random_array(X_SHAPE, 5, -4.0, 4.0)

  def tf_lse_extra(t, extra):
    shape = t.shape.as_list()
    shape[axis] = 1
    return tf.reduce_logsumexp(tf.concat([t, tf.fill(shape, extra)], axis), axis)

  check_against_tf(
      mesh_impl, [(x, X_SHAPE)] * 5,
      lambda a, b, c, d, e: [mtf.reduce_logsumexp(a, dim), mtf.softmax(b, dim),
                             mtf.log_softmax(c, dim),
                             mtf.reduce_logsumexp(d, dim, extra_logit=0.5),
                             mtf.softmax(e, dim, extra_logit=0.0)],
      lambda a, b, c, d, e: [
          tf.reduce_logsumexp(a, axis), tf.nn.softmax(b, axis), tf.nn.log_softmax(c, axis),
          tf_lse_extra(d, 0.5),
          tf.exp(e - tf.expand_dims(tf_lse_extra(e, 0.0), axis))],
      labels=["logsumexp", "softmax", "log_softmax", "logsumexp with extra_logit",
              "softmax with extra_logit"])
  # Logits whose exp() overflows float32 unless shifted by the max. x - logsumexp(x)
  # loses about eps * |x| (~5e-5 here) to rounding, so the absolute tolerance is wider.
  big = x * 100.0
  check_against_tf(
      mesh_impl, [(big, X_SHAPE)] * 2,
      lambda a, b: [mtf.log_softmax(a, dim), mtf.softmax(b, dim)],
      lambda a, b: [tf.nn.log_softmax(a, axis), tf.nn.softmax(b, axis)],
      labels=["log_softmax of large logits", "softmax of large logits"], atol=1e-4)


def test_reduce_argument_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  with pytest.raises(ValueError, match="classes"):
    mtf.reduce_sum(x, reduced_dim=mtf.Dimension("classes", 4))
  with pytest.raises(ValueError, match="keyword"):
    mtf.reduce_sum(x, [BATCH])  # pylint: disable=too-many-function-args
  assert mtf.reduce_sum(x, output_shape=x.shape) is x
