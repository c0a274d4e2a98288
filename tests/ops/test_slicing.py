"""Slicing along one dim (mesh_tf/ops/slicing.py), split or not, against plain TF.

A sliced or padded dim keeps its name, so "batch" and "hidden" are made 16 or 24 long
where needed to stay divisible by every mesh dim that may split them.
"""
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, HIDDEN, LENGTH, check_against_tf, new_mesh,
                         random_array)

X_SHAPE = [BATCH, LENGTH, HIDDEN]
BATCH16, HIDDEN16 = mtf.Dimension("batch", 16), mtf.Dimension("hidden", 16)
BATCH24, HIDDEN24 = mtf.Dimension("batch", 24), mtf.Dimension("hidden", 24)
BIG_SHAPE = [BATCH16, LENGTH, HIDDEN16]


def test_slice(mesh_impl):
  x = random_array(BIG_SHAPE, 0)
  check_against_tf(
      mesh_impl, [(x, BIG_SHAPE)] * 4,
      lambda a, b, c, d: [mtf.slice(a, 3, 8, "batch"), mtf.slice(b, 5, 8, "hidden"),
                          mtf.slice(c, 1, 2, "length"), mtf.mtf_slice(d, 0, 8, HIDDEN16)],
      lambda a, b, c, d: [a[3:11], b[:, :, 5:13], c[:, 1:3], d[:, :, :8]],
      labels=["batch (split)", "hidden (split)", "length", "mtf_slice by Dimension"])


def test_pad(mesh_impl):
  x = random_array(X_SHAPE, 1)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)] * 3,
      lambda a, b, c: [mtf.pad(a, [3, 5], "batch"), mtf.pad(b, [2, 6], "hidden"),
                       mtf.pad(c, [1, 0], "length")],
      lambda a, b, c: [tf.pad(a, [[3, 5], [0, 0], [0, 0]]),
                       tf.pad(b, [[0, 0], [0, 0], [2, 6]]),
                       tf.pad(c, [[0, 0], [1, 0], [0, 0]])],
      labels=["batch (split)", "hidden (split)", "length"])


def test_concat(mesh_impl):
  x8, x16 = random_array(X_SHAPE, 2), random_array([BATCH16, LENGTH, HIDDEN], 3)
  y16 = random_array([BATCH, LENGTH, HIDDEN16], 4)
  one = mtf.Dimension("length", 1)
  x1 = random_array([BATCH, one, HIDDEN], 5)
  check_against_tf(
      mesh_impl, [(x8, X_SHAPE), (x16, [BATCH16, LENGTH, HIDDEN]),
                  (y16, [BATCH, LENGTH, HIDDEN16]), (x1, [BATCH, one, HIDDEN])],
      lambda a, b, c, d: [mtf.concat([a, b], "batch"), mtf.concat([c, a], "hidden"),
                          mtf.concat([a, d, a], "length")],
      lambda a, b, c, d: [tf.concat([a, b], 0), tf.concat([c, a], 2),
                          tf.concat([a, d, a], 1)],
      labels=["batch (split)", "hidden (split)", "length"],
      input_labels=["x", "[batch=16]", "[hidden=16]", "[length=1]"])


def test_split(mesh_impl):
  x = random_array([BATCH24, LENGTH, HIDDEN16], 6)
  shape = [BATCH24, LENGTH, HIDDEN16]
  check_against_tf(
      mesh_impl, [(x, shape)] * 3,
      lambda a, b, c: (mtf.split(a, BATCH24, [8, 16]) + mtf.split(b, "hidden", 2) +
                       mtf.split(c, LENGTH, [1, 2])),
      lambda a, b, c: (tf.split(a, [8, 16], 0) + tf.split(b, 2, 2) +
                       tf.split(c, [1, 2], 1)),
      labels=["batch[:8]", "batch[8:]", "hidden[:8]", "hidden[8:]", "length[:1]",
              "length[1:]"])


def test_split_gradient_with_unused_part(mesh_impl):
  x = random_array([BATCH24, HIDDEN], 7)
  check_against_tf(mesh_impl, [(x, [BATCH24, HIDDEN])],
                   lambda a: [mtf.split(a, "batch", [16, 8])[0]],
                   lambda t: [t[:16]])


def test_stack_and_unstack(mesh_impl):
  bh = [BATCH, HIDDEN]
  parts = [random_array(bh, 10 + k) for k in range(3)]
  lh = [LENGTH, HIDDEN]
  rows = [random_array(lh, 20 + k) for k in range(8)]
  inputs = [(p, bh) for p in parts] + [(r, lh) for r in rows] + [(random_array(
      X_SHAPE, 30), X_SHAPE)] * 2
  check_against_tf(
      mesh_impl, inputs,
      lambda *xs: ([mtf.stack(xs[:3], "length", axis=1),  # new unsplit dim
                    mtf.stack(xs[3:11], "batch", axis=0)] +  # new split dim
                   mtf.unstack(xs[11], LENGTH) + mtf.unstack(xs[12], "batch")),
      lambda *ts: ([tf.stack(ts[:3], 1), tf.stack(ts[3:11], 0)] +
                   tf.unstack(ts[11], axis=1) + tf.unstack(ts[12], axis=0)),
      labels=(["stack to length", "stack to batch"] +
              ["unstack length %d" % i for i in range(3)] +
              ["unstack batch %d" % i for i in range(8)]))


def _tf_shift(t, offset, axis, wrap):
  if wrap:
    return tf.roll(t, offset, axis)
  n = t.shape[axis]
  idx = tf.range(n) - offset
  valid = tf.cast((idx >= 0) & (idx < n), t.dtype)
  shape = [1] * t.shape.rank
  shape[axis] = n
  return tf.gather(t, tf.clip_by_value(idx, 0, n - 1), axis=axis) * tf.reshape(valid, shape)


SHIFTS = [(1, "batch", 0), (-2, "batch", 0), (3, "hidden", 2), (-1, "hidden", 2),
          (1, "length", 1), (-2, "length", 1), (9, "batch", 0)]


@pytest.mark.parametrize("wrap", [False, True], ids=["zero-fill", "wrap"])
def test_shift(mesh_impl, wrap):
  x = random_array(X_SHAPE, 8)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)] * len(SHIFTS),
      lambda *xs: [mtf.shift(a, off, d, wrap) for a, (off, d, _) in zip(xs, SHIFTS)],
      lambda *ts: [_tf_shift(t, off, ax, wrap) for t, (off, _, ax) in zip(ts, SHIFTS)],
      labels=["shift %d along %s" % (o, d) for o, d, _ in SHIFTS])


def test_slicing_errors():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  with pytest.raises(ValueError, match="outside"):
    mtf.slice(x, 4, 8, "batch")
  with pytest.raises(ValueError, match="classes"):
    mtf.pad(x, [1, 1], "classes")
  with pytest.raises(ValueError, match="divisible"):
    mtf.split(x, LENGTH, 2)
  with pytest.raises(ValueError, match="add up"):
    mtf.split(x, LENGTH, [1, 1])
  assert graph is x.graph
