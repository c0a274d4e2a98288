"""Order statistics (mesh_tf/ops/sorting.py): top_k, sort, nth_largest/smallest_element."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, HIDDEN, LENGTH, check_against_tf, new_mesh, random_array,
                         random_ints)

X_SHAPE = [BATCH, LENGTH, HIDDEN]


def _last(t, axis):
  """t with axis moved last (the position top_k puts k_dim in)."""
  perm = [i for i in range(3) if i != axis] + [axis]
  return tf.transpose(t, perm)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_top_k(mesh_impl, k):
  x = random_array(X_SHAPE, 0)
  k_dim = mtf.Dimension("k", k)

  def mtf_fn(a, b):
    v1, i1 = mtf.top_k(a, HIDDEN, k_dim)  # hidden is split by some layouts
    v2, i2 = mtf.top_k(b, BATCH, k_dim)  # so is batch
    assert isinstance(v1.operation, mtf.TopKOperation) and v1.operation is i1.operation
    return [v1, i1, v2, i2]

  def tf_fn(a, b):
    v1, i1 = tf.math.top_k(_last(a, 2), k)
    v2, i2 = tf.math.top_k(_last(b, 0), k)
    return [v1, i1, v2, i2]
  check_against_tf(mesh_impl, [(x, X_SHAPE), (x, X_SHAPE)], mtf_fn, tf_fn,
                   labels=["values over hidden", "indices over hidden",
                           "values over batch", "indices over batch"])


def test_top_k_ties_and_split_k_dim(make_mesh_impl):
  # Many ties: indices come in increasing order among equal values, as in TF. A k_dim
  # that a layout splits is computed whole and cut afterwards.
  ties = random_ints(X_SHAPE, 1, 0, 3).astype(np.float32)
  k_dim = mtf.Dimension("k", 4)
  for mesh_shape, layout in [("all:8", "hidden:all"), ("rows:2;cols:4", "k:rows;batch:cols"),
                             ("rows:2;cols:4", "hidden:cols;k:rows")]:
    check_against_tf(
        make_mesh_impl(mesh_shape, layout), [(ties, X_SHAPE)],
        lambda a: list(mtf.top_k(a, HIDDEN, k_dim)),
        lambda a: list(tf.math.top_k(a, 4)), labels=["tied values", "tied indices"])


def test_top_k_int_values(mesh_impl):
  x = random_ints(X_SHAPE, 2, -50, 50)
  check_against_tf(mesh_impl, [(x, X_SHAPE)],
                   lambda a: list(mtf.top_k(a, HIDDEN, mtf.Dimension("k", 2))),
                   lambda a: list(tf.math.top_k(a, 2)))


@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
def test_sort(mesh_impl, descending):
  x = random_array(X_SHAPE, 3)
  direction = "DESCENDING" if descending else "ASCENDING"
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)] * 3,
      lambda a, b, c: [mtf.sort(a, HIDDEN, descending=descending),
                       mtf.sort(b, BATCH, descending=descending),
                       mtf.sort(c, "length", descending=descending)],
      lambda a, b, c: [tf.sort(a, 2, direction=direction), tf.sort(b, 0, direction=direction),
                       tf.sort(c, 1, direction=direction)],
      labels=["sort over hidden", "sort over batch", "sort over length"])


def test_nth_largest_and_smallest(mesh_impl):
  x = random_array(X_SHAPE, 4)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)] * 3,
      lambda a, b, c: [mtf.nth_largest_element(a, 2, HIDDEN),
                       mtf.nth_smallest_element(b, 0, BATCH),
                       mtf.nth_largest_element(c, 7, HIDDEN)],
      lambda a, b, c: [tf.sort(a, 2, direction="DESCENDING")[:, :, 2],
                       tf.reduce_min(b, 0), tf.reduce_min(c, 2)],
      labels=["3rd largest over hidden", "smallest over batch", "8th largest of 8"])


def test_sorting_errors():
  _, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  with pytest.raises(mtf.ShapeError, match="classes"):
    mtf.top_k(x, mtf.Dimension("classes", 4), mtf.Dimension("k", 2))
  with pytest.raises(mtf.ShapeError, match="size 1..3"):
    mtf.top_k(x, LENGTH, mtf.Dimension("k", 4))
  with pytest.raises(mtf.ShapeError, match="already a dim"):
    mtf.top_k(x, HIDDEN, BATCH)
  with pytest.raises(mtf.ShapeError, match="does not match"):
    mtf.top_k(x, mtf.Dimension("hidden", 5), mtf.Dimension("k", 2))
  with pytest.raises(mtf.ShapeError, match="nope"):
    mtf.sort(x, "nope")
  with pytest.raises(mtf.ShapeError, match="n=3 is outside"):
    mtf.nth_largest_element(x, 3, LENGTH)
  b = mtf.import_tf_tensor(mesh, np.zeros([8, 8], bool), [BATCH, HIDDEN])
  with pytest.raises(mtf.ShapeError, match="needs numbers"):
    mtf.top_k(b, HIDDEN, mtf.Dimension("k", 2))
