"""Positions and windows (mesh_tf/ops/windows.py): reduce_first, dynamic_shift,
pool_tensor_1d, stride_tensor_1d."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, HIDDEN, LENGTH, check_against_tf, new_mesh, random_array,
                         random_ints)

X_SHAPE = [BATCH, LENGTH, HIDDEN]
POSITIONS = mtf.Dimension("positions", 8)  # no layout rule splits it
P_SHAPE = [BATCH, POSITIONS, HIDDEN]


def test_reduce_first_and_pooling(mesh_impl):
  x = random_array(X_SHAPE, 0)
  p = random_array(P_SHAPE, 5)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (x, X_SHAPE), (p, P_SHAPE), (p, P_SHAPE), (p, P_SHAPE)],
      lambda a, b, c, d, e: [mtf.reduce_first(a, HIDDEN), mtf.reduce_first(b, BATCH),
                             mtf.pool_tensor_1d(c, POSITIONS),
                             mtf.pool_tensor_1d(d, POSITIONS, mtf.reduce_max, pool_size=4),
                             mtf.stride_tensor_1d(e, POSITIONS, pool_size=4)],
      lambda a, b, c, d, e: [a[:, :, 0], b[0],
                             tf.reduce_mean(tf.reshape(c, [8, 4, 2, 8]), 2),
                             tf.reduce_max(tf.reshape(d, [8, 2, 4, 8]), 2),
                             e[:, ::4]],
      labels=["first over hidden", "first over batch", "mean pool 2",
              "max pool 4", "stride 4"])


def test_pooling_a_split_dim(make_mesh_impl):
  # batch 8 -> 4 stays divisible by the 2 rows that split it.
  p = random_array(P_SHAPE, 6)
  check_against_tf(
      make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols"), [(p, P_SHAPE)] * 2,
      lambda a, b: [mtf.pool_tensor_1d(a, BATCH, mtf.reduce_sum),
                    mtf.stride_tensor_1d(b, BATCH)],
      lambda a, b: [tf.reduce_sum(tf.reshape(a, [4, 2, 8, 8]), 1), b[::2]])


@pytest.mark.parametrize("wrap", [False, True], ids=["zero-fill", "wrap"])
def test_dynamic_shift(mesh_impl, wrap):
  x = random_array(X_SHAPE, 1)
  per_row = random_ints([BATCH], 2, -9, 10)  # |offset| up to 9 > the size 8 of hidden
  per_length = random_ints([LENGTH], 3, -3, 4)

  def ref(t, offsets, axis, offset_axis):
    """y[i] = x[i - offset] along axis, one offset per index of offset_axis."""
    t = t.numpy()
    out = np.zeros_like(t)
    n = t.shape[axis]
    for j, off in enumerate(offsets):
      src = np.take(t, j, offset_axis)
      a = axis - (1 if offset_axis < axis else 0)
      if wrap:
        moved = np.roll(src, off, a)
      else:
        moved = np.zeros_like(src)
        for i in range(n):
          if 0 <= i - off < n:
            idx = [slice(None)] * src.ndim
            from_idx = list(idx)
            idx[a], from_idx[a] = i, i - off
            moved[tuple(idx)] = src[tuple(from_idx)]
      sel = [slice(None)] * 3
      sel[offset_axis] = j
      out[tuple(sel)] = moved
    return tf.constant(out)

  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (x, X_SHAPE), (per_row, [BATCH]), (per_length, [LENGTH])],
      lambda a, b, r, l: [mtf.dynamic_shift(a, r, HIDDEN, wrap),
                          mtf.dynamic_shift(b, l, BATCH, wrap)],
      lambda a, b, r, l: [ref(a, per_row, 2, 0), ref(b, per_length, 0, 1)],
      grad=False, labels=["shift hidden by row", "shift batch by length position"])


def test_dynamic_shift_gradient(mesh_impl):
  # A shift is linear: its gradient is the opposite shift of the upstream gradient.
  x = random_array(X_SHAPE, 4)
  offset = np.array(3, np.int32)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (offset, [])],
      lambda a, o: mtf.dynamic_shift(a, o, HIDDEN, wrap=True),
      lambda a, o: tf.roll(a, 3, 2))


def test_window_errors():
  _, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  o = mtf.import_tf_tensor(mesh, np.zeros([8], np.int32), [BATCH])
  f = mtf.import_tf_tensor(mesh, np.zeros([8], np.float32), [BATCH])
  c = mtf.import_tf_tensor(mesh, np.zeros([4], np.int32), [mtf.Dimension("classes", 4)])
  with pytest.raises(mtf.ShapeError, match="pool_size 3 does not divide"):
    mtf.pool_tensor_1d(x, HIDDEN, pool_size=3)
  with pytest.raises(mtf.ShapeError, match="classes"):
    mtf.stride_tensor_1d(x, mtf.Dimension("classes", 4))
  with pytest.raises(mtf.ShapeError, match="classes"):
    mtf.reduce_first(x, mtf.Dimension("classes", 4))
  with pytest.raises(mtf.ShapeError, match="must not have the shifted dim"):
    mtf.dynamic_shift(x, o, BATCH, wrap=False)
  with pytest.raises(mtf.ShapeError, match="integer mtf Tensor"):
    mtf.dynamic_shift(x, f, HIDDEN, wrap=False)
  with pytest.raises(mtf.ShapeError, match="classes"):
    mtf.dynamic_shift(x, c, HIDDEN, wrap=False)
