"""A small MLP trains to a loss threshold with each optimizer, under tf.function.

Tracing dominates the run time, so most optimizers train on one device and factored
Adafactor on a 2x2 mesh (batch split over rows, hidden over cols); updates on one device
and on the 2x4 mesh are compared number by number in test_optimizer_updates.py."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from optimizer_testing import fresh_global_step, make_impl

BATCH = mtf.Dimension("batch", 32)
FEATURES = mtf.Dimension("features", 8)
HIDDEN = mtf.Dimension("hidden", 16)
CLASSES = mtf.Dimension("classes", 4)
STEPS = 40


def _data(seed):
  rng = np.random.RandomState(seed)
  x = rng.randn(BATCH.size, FEATURES.size).astype(np.float32)
  true_w = np.random.RandomState(99).randn(FEATURES.size, CLASSES.size)
  return x, np.argmax(x @ true_w, axis=1).astype(np.int32)


def _train(make_optimizer, mesh_shape, layout):
  fresh_global_step()
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, tf.TensorSpec([BATCH.size, FEATURES.size]),
                           [BATCH, FEATURES], name="x")
  y = mtf.import_tf_tensor(mesh, tf.TensorSpec([BATCH.size], tf.int32), [BATCH], name="y")
  w1 = mtf.get_variable(mesh, "w1", [FEATURES, HIDDEN])
  w2 = mtf.get_variable(mesh, "w2", [HIDDEN, CLASSES])
  hidden = mtf.relu(mtf.einsum([x, w1], [BATCH, HIDDEN]))
  logits = mtf.einsum([hidden, w2], [BATCH, CLASSES])
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(y, CLASSES), CLASSES))
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  update_ops = make_optimizer().apply_grads(grads, variables)
  impl = make_impl(mesh_shape, layout)
  mtf.Lowering(graph, {mesh: impl})
  step = mtf.optimize.get_global_step()

  @tf.function
  def train_step(tf_x, tf_y):
    lowering = mtf.Lowering(graph, {mesh: impl}, feeds={x: tf_x, y: tf_y})
    for op in update_ops:
      lowering.lowered_operation(op)
    step.assign_add(1)
    return lowering.export_to_tf_tensor(loss)

  batches = [_data(seed) for seed in range(4)]
  losses = [float(train_step(*batches[i % 4])) for i in range(STEPS)]
  assert train_step.experimental_get_tracing_count() == 1
  assert int(step.numpy()) == STEPS
  return losses, {v.name for v in graph.all_variables}


SINGLE = ("", "")
MESH_2X2 = ("rows:2;cols:2", "batch:rows;hidden:cols")


@pytest.mark.parametrize("name,make,slots,case", [
    ("sgd", lambda: mtf.optimize.SgdOptimizer(0.5), set(), SINGLE),
    ("momentum", lambda: mtf.optimize.MomentumOptimizer(0.1, 0.9),
     {"w1_momentum_v", "w2_momentum_v"}, SINGLE),
    ("adam", lambda: mtf.optimize.AdamWeightDecayOptimizer(0.03, weight_decay_rate=1e-4),
     {"w1/adam_m", "w1/adam_v", "w2/adam_m", "w2/adam_v"}, SINGLE),
    # w1 [features 8, hidden 16] is factored; w2 [hidden 16, classes 4] is not.
    ("adafactor_factored", lambda: mtf.optimize.AdafactorOptimizer(
        learning_rate=0.1, min_dim_size_to_factor=8),
     {"w1_slot_vr", "w1_slot_vc", "w2_slot_v"}, MESH_2X2),
    ("adafactor_beta1", lambda: mtf.optimize.AdafactorOptimizer(
        beta1=0.9, multiply_by_parameter_scale=False, learning_rate=0.05),
     {"w1_slot_v", "w1_slot_m", "w2_slot_v", "w2_slot_m"}, SINGLE),
])
def test_mlp_trains_below_threshold(name, make, slots, case):
  losses, names = _train(make, *case)
  assert names == {"w1", "w2"} | slots, name
  assert losses[0] > 1.0, (name, losses[0])
  assert np.mean(losses[-4:]) < 0.3, (name, losses[::5])
