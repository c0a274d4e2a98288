"""Einsum, matmul and transpose (mesh_tf/ops/einsum.py) against tf.einsum."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, CLASSES, HIDDEN, LENGTH, check_against_tf, new_mesh,
                         random_array)

X_SHAPE = [BATCH, LENGTH, HIDDEN]
W_SHAPE = [HIDDEN, CLASSES]


def test_einsum_output_shapes(mesh_impl):
  x, w = random_array(X_SHAPE, 0), random_array(W_SHAPE, 1)
  v = random_array([BATCH, HIDDEN], 2)
  inputs = [(x, X_SHAPE), (w, W_SHAPE), (v, [BATCH, HIDDEN])]
  check_against_tf(
      mesh_impl, inputs,
      lambda a, b, c: [
          mtf.einsum([a, b], output_shape=[BATCH, LENGTH, CLASSES]),  # contracts hidden
          mtf.einsum([a, b], output_shape=[CLASSES, LENGTH, BATCH]),  # permuted output
          mtf.einsum([a, c], output_shape=[LENGTH]),  # contracts batch and hidden
          mtf.einsum([a, c], output_shape=[HIDDEN, LENGTH, BATCH]),  # no contraction
          mtf.einsum([c, b], output_shape=[BATCH, HIDDEN, CLASSES]),  # outer product
          mtf.einsum([a, b, c], output_shape=[CLASSES, BATCH]),  # three inputs
          mtf.einsum([a], output_shape=[HIDDEN]),  # single input: a sum
          mtf.einsum([c, c], output_shape=[BATCH]),  # one input twice
      ],
      lambda a, b, c: [
          tf.einsum("blh,hc->blc", a, b), tf.einsum("blh,hc->clb", a, b),
          tf.einsum("blh,bh->l", a, c), tf.einsum("blh,bh->hlb", a, c),
          tf.einsum("bh,hc->bhc", c, b), tf.einsum("blh,hc,bh->cb", a, b, c),
          tf.einsum("blh->h", a), tf.einsum("bh,bh->b", c, c)],
      labels=["contract hidden", "permuted output", "contract batch and hidden",
              "elementwise product", "outer product", "three inputs", "single input",
              "same input twice"],
      input_labels=["x", "w", "v"], atol=1e-5)


def test_einsum_reduced_dims_and_inferred_output(mesh_impl):
  x, w = random_array(X_SHAPE, 3), random_array(W_SHAPE, 4)
  v = random_array([BATCH, HIDDEN], 5)
  inputs = [(x, X_SHAPE), (w, W_SHAPE), (v, [BATCH, HIDDEN])]
  got, _ = check_against_tf(
      mesh_impl, inputs,
      lambda a, b, c: [
          mtf.einsum([a, b], reduced_dims=[HIDDEN]),
          mtf.einsum([a, c], reduced_dims=[BATCH]),
          mtf.einsum([a, c], reduced_dims=[HIDDEN], output_shape=[LENGTH, BATCH]),
          mtf.einsum([a, b]),  # inferred: dims in exactly one input -> [b, l, c]
          mtf.einsum([c, b]),  # inferred: [batch, classes]
          mtf.einsum([a, c]),  # inferred: [length]
      ],
      lambda a, b, c: [
          tf.einsum("blh,hc->blc", a, b), tf.einsum("blh,bh->lh", a, c),
          tf.einsum("blh,bh->lb", a, c), tf.einsum("blh,hc->blc", a, b),
          tf.einsum("bh,hc->bc", c, b), tf.einsum("blh,bh->l", a, c)],
      labels=["reduced_dims hidden", "reduced_dims batch", "reduced_dims + output_shape",
              "inferred [batch, length, classes]", "inferred [batch, classes]",
              "inferred [length]"], atol=1e-5)
  assert [g.shape for g in got] == [(8, 3, 4), (3, 8), (3, 8), (8, 3, 4), (8, 4), (3,)]


def test_matmul_and_transpose(mesh_impl):
  x, w = random_array(X_SHAPE, 6), random_array(W_SHAPE, 7)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (w, W_SHAPE), (x, X_SHAPE)],
      lambda a, b, c: [mtf.matmul(a, b), mtf.matmul(a, b, output_shape=[CLASSES, BATCH,
                                                                         LENGTH]),
                       mtf.transpose(c, [HIDDEN, BATCH, LENGTH]),
                       mtf.transpose(b, [CLASSES, HIDDEN])],
      lambda a, b, c: [tf.einsum("blh,hc->blc", a, b), tf.einsum("blh,hc->cbl", a, b),
                       tf.transpose(c, [2, 0, 1]), tf.transpose(b)],
      labels=["matmul", "matmul with output_shape", "transpose x", "transpose w"],
      atol=1e-5)


def test_scalar_loss_gradients_match_tf(mesh_impl):
  """The README example: a one-layer model, gradient of a scalar loss."""
  x_np, w_np = random_array([BATCH, HIDDEN], 8), random_array(W_SHAPE, 9)
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, HIDDEN])
  w = mtf.get_variable(mesh, "w", W_SHAPE, initializer=tf.constant_initializer(w_np))
  y = mtf.einsum([x, w], [BATCH, CLASSES])
  loss = mtf.reduce_sum(y * y)
  gx, gw = mtf.gradients([loss], [x, w])
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  got = [lowering.export_to_tf_tensor(t).numpy() for t in (loss, gx, gw)]
  tx, tw = tf.constant(x_np), tf.constant(w_np)
  with tf.GradientTape() as tape:
    tape.watch([tx, tw])
    ref_loss = tf.reduce_sum(tf.square(tx @ tw))
  ref = [ref_loss.numpy()] + [g.numpy() for g in tape.gradient(ref_loss, [tx, tw])]
  for a, b, what in zip(got, ref, ["loss", "d loss/dx", "d loss/dw"]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=what)


def test_einsum_errors():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  with pytest.raises(ValueError, match="classes"):
    mtf.einsum([x], output_shape=[BATCH, CLASSES])
  with pytest.raises(ValueError, match="transpose"):
    mtf.transpose(x, [BATCH, HIDDEN])
  assert graph is x.graph
