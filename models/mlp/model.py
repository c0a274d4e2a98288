"""The README's 2-layer MLP, built once as an mtf graph and trained under tf.function.

    hidden = relu(einsum(images, w1))      # [batch, hidden]
    logits = einsum(hidden, w2)            # [batch, classes]
    loss   = mean softmax cross-entropy

Layout is chosen at lowering time: e.g. mesh "rows:2;cols:4" with rules
"batch:rows;hidden:cols" is data parallel over rows and model parallel over cols.
"""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from models import train_steps


class MlpModel:
  """The graph, its placeholders and the ops a training step runs."""

  def __init__(self, batch_size=32, rows=28, cols=28, hidden_size=64, num_classes=10,
               learning_rate=0.1):
    self.graph = mtf.Graph()
    self.mesh = mtf.Mesh(self.graph, "my_mesh")
    batch_dim = mtf.Dimension("batch", batch_size)
    rows_dim = mtf.Dimension("rows", rows)
    cols_dim = mtf.Dimension("cols", cols)
    hidden_dim = mtf.Dimension("hidden", hidden_size)
    classes_dim = mtf.Dimension("classes", num_classes)
    # Placeholders: each Lowering feeds them with a batch.
    self.images = mtf.import_tf_tensor(
        self.mesh, tf.TensorSpec([batch_size, rows, cols], tf.float32),
        [batch_dim, rows_dim, cols_dim], name="images")
    self.labels = mtf.import_tf_tensor(
        self.mesh, tf.TensorSpec([batch_size], tf.int32), [batch_dim], name="labels")
    w1 = mtf.get_variable(self.mesh, "w1", [rows_dim, cols_dim, hidden_dim])
    w2 = mtf.get_variable(self.mesh, "w2", [hidden_dim, classes_dim])
    hidden = mtf.relu(mtf.einsum([self.images, w1], output_shape=[batch_dim, hidden_dim]))
    logits = mtf.einsum([hidden, w2], output_shape=[batch_dim, classes_dim])
    self.loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(
        logits, mtf.one_hot(self.labels, classes_dim), classes_dim))
    w1_grad, w2_grad = mtf.gradients([self.loss], [w1, w2])
    self.update_ops = [mtf.assign(w1, w1 - w1_grad * learning_rate),
                       mtf.assign(w2, w2 - w2_grad * learning_rate)]

  def lowering(self, mesh_impl, images=None, labels=None):
    """A Lowering of the graph on mesh_impl, fed with one batch (if given)."""
    feeds = {} if images is None else {self.images: images, self.labels: labels}
    return mtf.Lowering(self.graph, {self.mesh: mesh_impl}, feeds=feeds)

  def make_train_step(self, mesh_impl, jit_compile=False):
    """A tf.function(images, labels) running one SGD step; returns the loss before it."""
    return train_steps.make_train_step(self, mesh_impl, jit_compile)

  def make_eval_step(self, mesh_impl):
    """A tf.function(images, labels) computing the loss of a batch without updating."""
    return train_steps.make_eval_step(self, mesh_impl)


def synthetic_digits(num_examples, rows=28, cols=28, num_classes=10, seed=0):
  """Images of class prototypes plus noise: learnable, and made here (no download)."""
  rng = np.random.RandomState(seed)
  prototypes = np.random.RandomState(1234).rand(num_classes, rows, cols).astype(np.float32)
  labels = rng.randint(0, num_classes, size=num_examples).astype(np.int32)
  images = prototypes[labels] + 0.5 * rng.randn(num_examples, rows, cols).astype(np.float32)
  return images, labels
