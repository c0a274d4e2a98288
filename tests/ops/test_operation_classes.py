"""The original's elementwise Operation classes (mesh_tf/ops/operation_classes.py)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, HIDDEN, LENGTH, check_against_tf, new_mesh, random_array,
                         random_ints)

X_SHAPE = [BATCH, LENGTH, HIDDEN]
OUT_SHAPE = [BATCH, HIDDEN, LENGTH]  # a different order than the inputs


def test_operation_classes(mesh_impl):
  x = random_array(X_SHAPE, 0)
  h = random_array([HIDDEN, LENGTH], 1)
  # Integer-valued floats make ties in min/max likely (the gradient goes to x1 on ties).
  tx = random_ints(X_SHAPE, 2, 0, 3).astype(np.float32)
  th = random_ints([HIDDEN], 3, 0, 3).astype(np.float32)
  perm = lambda t: tf.transpose(t, [0, 2, 1])

  def mtf_fn(a, b, c, d):
    return [mtf.AddOperation(a, b, OUT_SHAPE).outputs[0],
            mtf.MinMaxOperation(tf.maximum, c, d, X_SHAPE).outputs[0],
            mtf.MinMaxOperation(tf.minimum, d, c, X_SHAPE).outputs[0],
            mtf.BinaryOpWithBroadcasting(tf.less, a, b, X_SHAPE, tf.bool).outputs[0],
            mtf.ScalarMultiplyOperation(a, 2.5).outputs[0],
            mtf.ScalarAddOperation(b, tf.constant(-1.5)).outputs[0]]

  def tf_fn(a, b, c, d):
    return [perm(a + tf.transpose(b)), tf.maximum(c, d), tf.minimum(d, c),
            a < tf.transpose(b), a * 2.5, b - 1.5]
  check_against_tf(mesh_impl, [(x, X_SHAPE), (h, [HIDDEN, LENGTH]), (tx, X_SHAPE),
                               (th, [HIDDEN])], mtf_fn, tf_fn,
                   labels=["add", "max", "min", "less", "scalar mul", "scalar add"])


def test_operation_class_errors():
  _, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  h = mtf.import_tf_tensor(mesh, random_array([HIDDEN], 1), [HIDDEN])
  assert isinstance(mtf.shift(x, 1, BATCH, wrap=False).operation, mtf.ShiftOperation)
  with pytest.raises(mtf.ShapeError, match="must have exactly the dims"):
    mtf.AddOperation(x, h, [BATCH, HIDDEN])
  with pytest.raises(mtf.ShapeError, match="must have exactly the dims"):
    mtf.MinMaxOperation(tf.minimum, x, h, X_SHAPE + [mtf.Dimension("extra", 2)])
