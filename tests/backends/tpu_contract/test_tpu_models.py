"""The README MLP, a Transformer layer and log_cumsum_exp on the SIMD TPU runtime.

Training steps run as on a TPU: variables created under strategy.scope(), the step a
tf.function around strategy.run. They must give the CPU emulation's loss, gradients and
updated variables (MirroredStrategy on 8 virtual CPUs, collective stand-ins).
"""
import numpy as np
import pytest
import tensorflow as tf

import gspmd_models
import mesh_tf as mtf
from tpu_standins import per_core

SCRAMBLED = [5, 2, 7, 0, 3, 6, 1, 4]


def build_readme_mlp(batch=8, pixels=4, hidden=16, classes=10):
  """The README example at toy size (images [batch, rows, cols], two layers)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  batch_dim = mtf.Dimension("batch", batch)
  rows_dim, cols_dim = mtf.Dimension("rows", pixels), mtf.Dimension("cols", pixels)
  hidden_dim, classes_dim = mtf.Dimension("hidden", hidden), mtf.Dimension("classes", classes)
  rng = np.random.RandomState(1)
  images_value = rng.randn(batch, pixels, pixels).astype(np.float32)
  labels_value = rng.randint(0, classes, size=[batch]).astype(np.int32)
  images = mtf.import_tf_tensor(mesh, tf.TensorSpec([batch, pixels, pixels]),
                                [batch_dim, rows_dim, cols_dim])
  labels = mtf.import_tf_tensor(mesh, tf.TensorSpec([batch], tf.int32), [batch_dim])
  w1 = mtf.get_variable(mesh, "w1", [rows_dim, cols_dim, hidden_dim])
  w2 = mtf.get_variable(mesh, "w2", [hidden_dim, classes_dim])
  hidden = mtf.relu(mtf.einsum([images, w1], output_shape=[batch_dim, hidden_dim]))
  logits = mtf.einsum([hidden, w2], output_shape=[batch_dim, classes_dim])
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(labels, classes_dim), classes_dim))
  return gspmd_models.Model(graph, mesh, [(images, images_value), (labels, labels_value)],
                            loss, [w1, w2])


def tpu_train_step(model, impl, strategy):
  """The TPU recipe: variables under the scope, one value per core from strategy.run."""
  placeholders = [p for p, _ in model.inputs]
  with strategy.scope():
    mtf.Lowering(model.graph, {model.mesh: impl})

  def replica_step(*values):
    lowering = mtf.Lowering(model.graph, {model.mesh: impl},
                            feeds=dict(zip(placeholders, values)))
    outs = [lowering.export_to_tf_tensor(t) for t in [model.loss] + model.grads]
    for op in model.update_ops:
      lowering.lowered_operation(op)
    return outs

  @tf.function(autograph=False)
  def step(*values):
    return strategy.run(replica_step, args=values)
  return step


def _emulation_steps(build, layout, steps):
  model = build()
  impl = mtf.SimdMeshImpl(gspmd_models.MESH_SHAPE, layout, logical_to_physical=SCRAMBLED)
  step = gspmd_models.make_step(model, impl)
  outs = [[o.numpy() for o in step(*model.input_values())] for _ in range(steps)]
  return outs, {n: impl.variable_store[n].read_full().numpy() for n in model.variable_names}


@pytest.mark.parametrize("build,layout", [
    (build_readme_mlp, "batch:rows;hidden:cols"),
    (gspmd_models.build_transformer_layer, "batch:rows;heads:cols;d_ff:cols"),
])
def test_training_steps_match_the_emulation(strategy, standins, device_assignment, build,
                                            layout):
  model = build()
  impl = mtf.SimdMeshImpl(gspmd_models.MESH_SHAPE, layout,
                          device_assignment=device_assignment, logical_to_physical=SCRAMBLED)
  step = tpu_train_step(model, impl, strategy)
  want_outs, want_vars = _emulation_steps(build, layout, steps=2)
  for want in want_outs:
    got = [per_core(strategy, o) for o in step(*model.input_values())]
    for i, (per_core_values, w) in enumerate(zip(got, want)):
      for core, value in enumerate(per_core_values):  # every core has the full value
        np.testing.assert_allclose(value, w, rtol=2e-5, atol=2e-6,
                                   err_msg="output %d on core %d" % (i, core))
  for name, value in want_vars.items():
    np.testing.assert_allclose(impl.variable_store[name].read_full().numpy(), value,
                               rtol=2e-5, atol=2e-6, err_msg=name)
  assert want_outs[1][0] < want_outs[0][0]  # the step trained
  assert ("CrossReplicaSum", "float32") in standins.ops_used()


def test_log_cumsum_exp_on_a_split_dim(strategy, standins, device_assignment):
  del standins
  value = np.random.RandomState(2).randn(4, 8).astype(np.float32)
  # -inf inside a row (the scan itself masks with -inf: on a split dim its MAX-allreduce
  # of all -inf pieces gave NaN everywhere before)
  value[1, 2:5] = -np.inf
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  batch, length = mtf.Dimension("batch", 4), mtf.Dimension("length", 8)
  x = mtf.import_tf_tensor(mesh, tf.TensorSpec([4, 8]), [batch, length])
  y = mtf.log_cumsum_exp(x, length)
  impl = mtf.SimdMeshImpl("a:2;b:4", "length:b;batch:a", device_assignment=device_assignment,
                          logical_to_physical=SCRAMBLED)

  def replica():
    return mtf.Lowering(graph, {mesh: impl}, feeds={x: value}).export_to_tf_tensor(y)
  got = per_core(strategy, tf.function(lambda: strategy.run(replica), autograph=False)())
  want = tf.math.cumulative_logsumexp(value, axis=1).numpy()
  assert np.isfinite(want).all()
  for core in range(8):
    np.testing.assert_allclose(got[core], want, rtol=1e-5, atol=1e-6,
                               err_msg="core %d" % core)
