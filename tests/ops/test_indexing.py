"""Index ops (mesh_tf/ops/indexing.py): range, one_hot, gather, cumsum, top_1, argmax."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, CLASSES, HIDDEN, LENGTH, check_against_tf, new_mesh,
                         random_array, random_ints)

X_SHAPE = [BATCH, LENGTH, HIDDEN]


def test_mtf_range(mesh_impl):
  check_against_tf(
      mesh_impl, [],
      lambda mesh: [mtf.mtf_range(mesh, HIDDEN, tf.int32),
                    mtf.mtf_range(mesh, BATCH, tf.float32),
                    mtf.range(mesh, LENGTH, tf.int64)],
      lambda: [tf.range(8), tf.range(8, dtype=tf.float32), tf.range(3, dtype=tf.int64)],
      labels=["range over hidden", "float range over batch", "int64 range over length"],
      pass_mesh=True)


def test_one_hot(mesh_impl):
  idx_b = random_ints([BATCH], 0, 0, 8)
  idx_bl = random_ints([BATCH, LENGTH], 1, -1, 5)  # -1 and 4 are outside [0, 4)
  check_against_tf(
      mesh_impl, [(idx_b, [BATCH]), (idx_bl, [BATCH, LENGTH])],
      lambda i, j: [mtf.one_hot(i, HIDDEN),  # along a split output dim
                    mtf.one_hot(j, CLASSES, on_value=2.0, off_value=-1.0),
                    mtf.one_hot(j, HIDDEN, dtype=tf.int32)],
      lambda i, j: [tf.one_hot(i, 8), tf.one_hot(j, 4, on_value=2.0, off_value=-1.0),
                    tf.one_hot(j, 8, dtype=tf.int32)],
      labels=["one_hot along hidden", "one_hot with on/off values", "int32 one_hot"])


def test_gather(mesh_impl):
  w_hc = random_array([HIDDEN, CLASSES], 2)
  w_bh = random_array([BATCH, HIDDEN], 3)
  idx_bl = random_ints([BATCH, LENGTH], 4, 0, 8)
  idx_l = np.array([5, 0, 5], np.int32)  # a repeated index accumulates gradient
  check_against_tf(
      mesh_impl, [(w_hc, [HIDDEN, CLASSES]), (w_bh, [BATCH, HIDDEN]),
                  (idx_bl, [BATCH, LENGTH]), (idx_l, [LENGTH])],
      lambda a, b, i, j: [mtf.gather(a, i, HIDDEN),  # along split hidden
                          mtf.gather(b, j, BATCH),  # along split batch
                          mtf.gather(b, j, BATCH, output_shape=[HIDDEN, LENGTH])],
      lambda a, b, i, j: [tf.gather(a, i), tf.gather(b, j),
                          tf.transpose(tf.gather(b, j))],
      labels=["gather along hidden", "gather along batch", "gather with output_shape"],
      input_labels=["[hidden, classes]", "[batch, hidden]", "indices", "indices"])


@pytest.mark.parametrize("exclusive", [False, True], ids=["inclusive", "exclusive"])
def test_cumsum(mesh_impl, exclusive):
  x = random_array(X_SHAPE, 5)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)] * 3,
      lambda a, b, c: [mtf.cumsum(a, BATCH, exclusive=exclusive),
                       mtf.cumsum(b, HIDDEN, exclusive=exclusive),
                       mtf.cumsum(c, LENGTH, exclusive=exclusive)],
      lambda a, b, c: [tf.cumsum(a, 0, exclusive=exclusive),
                       tf.cumsum(b, 2, exclusive=exclusive),
                       tf.cumsum(c, 1, exclusive=exclusive)],
      labels=["cumsum along batch", "cumsum along hidden", "cumsum along length"],
      atol=1e-5)


def test_top_1_and_argmax(mesh_impl):
  x = random_array(X_SHAPE, 6)
  # Integer values with many ties: argmax is the last index of the max (the original's).
  ties = random_ints(X_SHAPE, 7, 0, 3).astype(np.float32)
  last_argmax = lambda t, axis: (t.shape[axis] - 1 - np.argmax(
      np.flip(t.numpy(), axis), axis)).astype(np.int32)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (x, X_SHAPE), (ties, X_SHAPE)],
      lambda a, b, c: (list(mtf.top_1(a, HIDDEN)) + list(mtf.top_1(b, BATCH)) +
                       [mtf.argmax(c, HIDDEN), mtf.argmax(c, BATCH),
                        mtf.argmax(c, LENGTH)]),
      lambda a, b, c: [tf.argmax(a, 2, output_type=tf.int32), tf.reduce_max(a, 2),
                       tf.argmax(b, 0, output_type=tf.int32), tf.reduce_max(b, 0),
                       last_argmax(c, 2), last_argmax(c, 0), last_argmax(c, 1)],
      labels=["argmax over hidden", "max over hidden", "argmax over batch",
              "max over batch", "argmax with ties over hidden",
              "argmax with ties over batch", "argmax with ties over length"])


def test_indexing_errors():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  i = mtf.import_tf_tensor(mesh, random_ints([BATCH], 0, 0, 3), [BATCH])
  with pytest.raises(ValueError, match="integers"):
    mtf.one_hot(x, CLASSES)
  with pytest.raises(ValueError, match="already"):
    mtf.one_hot(i, BATCH)
  with pytest.raises(ValueError, match="classes"):
    mtf.gather(x, i, CLASSES)
  with pytest.raises(ValueError, match="classes"):
    mtf.cumsum(x, CLASSES)
  assert graph is x.graph
