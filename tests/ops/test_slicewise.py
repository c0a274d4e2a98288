"""User slice-wise ops (mesh_tf/ops/slicewise.py): whole dims, several outputs, TF grads."""
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.ops.slicewise import generic_gradient
from mtf_testing import (BATCH, HIDDEN, LENGTH, check_against_tf, random_array)

X_SHAPE = [BATCH, LENGTH, HIDDEN]


def test_slicewise_with_whole_dims(mesh_impl):
  # Functions that need all of "hidden" say so by leaving it out of splittable_dims.
  x = random_array(X_SHAPE, 0)
  whole_hidden = [BATCH, LENGTH]
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)] * 4,
      lambda a, b, c, d: [
          mtf.slicewise(lambda t: tf.cumsum(t, axis=2), [a], splittable_dims=whole_hidden,
                        grad_function=generic_gradient),
          mtf.slicewise(lambda t: tf.reduce_max(t, axis=2), [b],
                        output_shape=[BATCH, LENGTH], splittable_dims=whole_hidden,
                        grad_function=generic_gradient),
          mtf.slicewise(lambda t: t * tf.sin(t), [c], grad_function=generic_gradient),
          mtf.cwise(tf.atan, [d], grad_function=generic_gradient)],
      lambda a, b, c, d: [tf.cumsum(a, axis=2), tf.reduce_max(b, axis=2), c * tf.sin(c),
                          tf.atan(d)],
      labels=["cumsum over whole hidden", "max over whole hidden", "x sin x", "cwise atan"])


def test_slicewise_several_outputs(mesh_impl):
  x, y = random_array(X_SHAPE, 1), random_array(X_SHAPE, 2)
  shape = mtf.Shape(X_SHAPE)

  def two_outputs(a, b):
    return mtf.slicewise(lambda s, t: (s * t, tf.nn.softmax(s + t, axis=2)), [a, b],
                         output_shape=[shape, shape], output_dtype=[tf.float32] * 2,
                         splittable_dims=[BATCH, LENGTH], grad_function=generic_gradient)

  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (y, X_SHAPE)], lambda a, b: list(two_outputs(a, b)),
      lambda a, b: [a * b, tf.nn.softmax(a + b, axis=2)], labels=["product", "softmax"])
  # Only the second output feeds the loss: the first gets no upstream gradient.
  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (y, X_SHAPE)], lambda a, b: [two_outputs(a, b)[1]],
      lambda a, b: [tf.nn.softmax(a + b, axis=2)], labels=["softmax only"])


def test_slicewise_without_gradient():
  graph = mtf.Graph()
  x = mtf.import_tf_tensor(mtf.Mesh(graph, "m"), random_array(X_SHAPE, 3), X_SHAPE)
  y = mtf.slicewise(tf.exp, [x])
  assert mtf.gradients([mtf.reduce_sum(y)], [x]) == [None]
