"""Scans (mesh_tf/ops/scan.py, and cumsum's reverse mode in indexing.py)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, LENGTH, check_against_tf, new_mesh, random_array

X_SHAPE = [BATCH, LENGTH, HIDDEN]


@pytest.mark.parametrize("exclusive", [False, True], ids=["inclusive", "exclusive"])
def test_reverse_cumsum(mesh_impl, exclusive):
  x = random_array(X_SHAPE, 0)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)] * 2,
      lambda a, b: [mtf.cumsum(a, HIDDEN, exclusive=exclusive, reverse=True),
                    mtf.cumsum(b, BATCH, exclusive=exclusive, reverse=True)],
      lambda a, b: [tf.cumsum(a, 2, exclusive=exclusive, reverse=True),
                    tf.cumsum(b, 0, exclusive=exclusive, reverse=True)],
      labels=["reverse cumsum over hidden", "reverse cumsum over batch"], atol=1e-5)


def _reference(t, axis, reverse):
  # In float64: TF's float32 gradient of cumulative_logsumexp is off by ~2e-4 on the wide
  # input below, while the mtf one is within 1e-6 of the float64 value.
  return tf.cast(tf.math.cumulative_logsumexp(tf.cast(t, tf.float64), axis,
                                              reverse=reverse), tf.float32)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_log_cumsum_exp(mesh_impl, reverse):
  x = random_array(X_SHAPE, 1, -3.0, 3.0)
  # Values 100 apart: a single max-shift would underflow the small prefixes.
  wide = (random_array(X_SHAPE, 2) + 100.0 * np.arange(8)[::-1].reshape(8, 1, 1)).astype(
      np.float32)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (x, X_SHAPE), (wide, X_SHAPE)],
      lambda a, b, c: [mtf.log_cumsum_exp(a, HIDDEN, reverse=reverse),
                       mtf.log_cumsum_exp(b, LENGTH, reverse=reverse),
                       mtf.log_cumsum_exp(c, BATCH, reverse=reverse)],
      lambda a, b, c: [_reference(a, 2, reverse), _reference(b, 1, reverse),
                       _reference(c, 0, reverse)],
      labels=["over hidden", "over length", "over batch, wide range"], atol=1e-5)


def test_scan_errors():
  _, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  i = mtf.import_tf_tensor(mesh, np.zeros([8], np.int32), [BATCH])
  with pytest.raises(mtf.ShapeError, match="classes"):
    mtf.log_cumsum_exp(x, mtf.Dimension("classes", 4))
  with pytest.raises(mtf.ShapeError, match="needs floats"):
    mtf.log_cumsum_exp(i, BATCH)
  with pytest.raises(mtf.ShapeError, match="classes"):
    mtf.cumsum(x, mtf.Dimension("classes", 4), reverse=True)
