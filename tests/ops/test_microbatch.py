"""serialize_training_step (mesh_tf/ops/microbatch.py): microbatch sums equal the full batch."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import HIDDEN, assert_close, new_mesh, random_array, random_ints

# 32 rows, so a microbatch of 8 still divides over the 8 processors of "batch:all".
BATCH = mtf.Dimension("batch", 32)
CLASSES = mtf.Dimension("classes", 4)
X_VALUE = random_array([BATCH, HIDDEN], 0)
LABELS = random_ints([BATCH], 1, 0, 4)
W_VALUE = random_array([HIDDEN, CLASSES], 2)
B_VALUE = random_array([CLASSES], 3)


def _model_graph(num_splits):
  """(graph, mesh, tensors): grads of a softmax classifier and its outputs, computed over
  num_splits microbatches (or the whole batch if num_splits is None)."""
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, X_VALUE, [BATCH, HIDDEN])
  labels = mtf.import_tf_tensor(mesh, LABELS, [BATCH])
  w = mtf.get_variable(mesh, "w", [HIDDEN, CLASSES],
                       initializer=tf.constant_initializer(W_VALUE))
  b = mtf.get_variable(mesh, "b", [CLASSES], initializer=tf.constant_initializer(B_VALUE))

  def model_fn(features):
    logits = mtf.einsum([features["x"], w], reduced_dims=[HIDDEN]) + b
    per_example = mtf.layers.softmax_cross_entropy_with_logits(
        logits, mtf.one_hot(features["labels"], CLASSES), CLASSES)
    return {"loss": mtf.reduce_sum(per_example), "per_example": per_example}
  features = {"x": x, "labels": labels}
  if num_splits is None:
    outputs = model_fn(features)
    grads = mtf.gradients([outputs["loss"]], [w, b])
  else:
    grads, outputs = mtf.serialize_training_step(features, model_fn, BATCH, num_splits)
  return graph, mesh, list(grads) + [outputs["loss"], outputs["per_example"]]


def _tf_reference():
  x, w, b = map(tf.constant, (X_VALUE, W_VALUE, B_VALUE))
  with tf.GradientTape() as tape:
    tape.watch([w, b])
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(LABELS, x @ w + b)
    loss = tf.reduce_sum(per_example)
  return tape.gradient(loss, [w, b]) + [loss, per_example]


# Each case runs a whole training step per microbatch eagerly; four cases cover a single
# device, a split batch, a split hidden dim and both (the ops inside are tested on all).
CASES = [("", "", 4), ("all:8", "batch:all", 4), ("all:8", "hidden:all", 2),
         ("rows:2;cols:4", "batch:rows;hidden:cols", 4)]


@pytest.mark.parametrize("mesh_shape,layout,num_splits", CASES)
def test_microbatch_sums_equal_full_batch(make_mesh_impl, mesh_shape, layout, num_splits):
  graph, mesh, tensors = _model_graph(num_splits)
  lowering = mtf.Lowering(graph, {mesh: make_mesh_impl(mesh_shape, layout)})
  got = [lowering.export_to_tf_tensor(t).numpy() for t in tensors]
  for g, r, what in zip(got, _tf_reference(), ["dw", "db", "loss", "per-example loss"]):
    assert_close(g, r.numpy(), what, rtol=1e-5, atol=1e-5)


def test_microbatch_in_tf_function(make_mesh_impl):
  graph, mesh, tensors = _model_graph(4)
  impl = make_mesh_impl("rows:2", "batch:rows")

  @tf.function
  def step():
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(t) for t in tensors]
  for g, r in zip(step(), _tf_reference()):
    assert_close(g.numpy(), r.numpy(), "traced microbatching", rtol=1e-5, atol=1e-5)


def test_microbatch_errors():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, X_VALUE, [BATCH, HIDDEN])
  w = mtf.get_variable(mesh, "w", [HIDDEN])
  unused = mtf.get_variable(mesh, "unused", [HIDDEN])
  model = lambda f: {"loss": mtf.reduce_sum(f["x"] * w)}
  with pytest.raises(mtf.ShapeError, match="does not divide"):
    mtf.serialize_training_step({"x": x}, model, BATCH, 3)
  with pytest.raises(mtf.ShapeError, match="lacks batch dim"):
    mtf.serialize_training_step({"x": x}, model, mtf.Dimension("other", 8), 2)
  with pytest.raises(mtf.ShapeError, match="no 'loss'"):
    mtf.serialize_training_step({"x": x}, lambda f: {"l": f["x"]}, BATCH, 2)
  with pytest.raises(mtf.ShapeError, match="unused"):
    mtf.serialize_training_step({"x": x}, model, BATCH, 2)
  assert unused.graph is graph and np.shape(X_VALUE) == (32, 8)
