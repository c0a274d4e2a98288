"""stop_gradient (mesh_tf/autodiff): identity forward, no gradient backward."""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, HIDDEN, LENGTH, check_against_tf, new_mesh,
                         random_array)

X_SHAPE = [BATCH, LENGTH, HIDDEN]


def test_stop_gradient_against_tf(mesh_impl):
  x = random_array(X_SHAPE, 0)
  got, grads = check_against_tf(
      mesh_impl, [(x, X_SHAPE), (x, X_SHAPE), (x, X_SHAPE)],
      lambda a, b, c: [mtf.stop_gradient(a), b * mtf.stop_gradient(b),
                       mtf.reduce_sum(mtf.stop_gradient(c), reduced_dim=BATCH) * c],
      lambda a, b, c: [tf.stop_gradient(a), b * tf.stop_gradient(b),
                       tf.reduce_sum(tf.stop_gradient(c), 0) * c],
      labels=["stop_gradient(x)", "x * stop_gradient(x)", "sum(stop_gradient(x)) * x"])
  assert grads[0] is None
  np.testing.assert_array_equal(got[0], x)


def test_gradient_through_stop_gradient_is_none():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 1), X_SHAPE)
  y = mtf.exp(mtf.stop_gradient(x * 2.0))
  assert mtf.gradients([mtf.reduce_sum(y)], [x]) == [None]
  gx, = mtf.gradients([mtf.reduce_sum(y * x)], [x])
  assert gx is not None and graph is x.graph
