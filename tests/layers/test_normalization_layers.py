"""layer_norm, rms_norm and batch_norm (mesh_tf/layers/normalization.py)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from layer_testing import FOCUSED_CASES, FOCUSED_IDS, check_layer, variable_values
from mtf_testing import BATCH, HIDDEN, LENGTH, new_mesh, random_array

X_SHAPE = [BATCH, LENGTH, HIDDEN]


def test_layer_norm_every_layout(mesh_impl):
  def reference(xs, p):
    mean, var = tf.nn.moments(xs[0], axes=[2], keepdims=True)
    prefix = "layer_prepostprocess/layer_norm/"
    return ((xs[0] - mean) * tf.math.rsqrt(var + 1e-6) * p[prefix + "layer_norm_scale"]
            + p[prefix + "layer_norm_bias"])
  _, params = check_layer(mesh_impl, [(random_array(X_SHAPE, 1), X_SHAPE)],
                          lambda x: mtf.layers.layer_norm(x, HIDDEN), reference,
                          rtol=1e-4, atol=1e-5)
  assert sorted(params) == ["layer_prepostprocess/layer_norm/layer_norm_bias",
                            "layer_prepostprocess/layer_norm/layer_norm_scale"]


def test_layer_norm_matches_keras_with_trained_weights(make_mesh_impl):
  """Non-trivial scale and bias, compared with tf.keras.layers.LayerNormalization."""
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  graph, mesh = new_mesh()
  x_val = random_array(X_SHAPE, 2)
  scale, bias = random_array([HIDDEN], 3), random_array([HIDDEN], 4)
  x = mtf.import_tf_tensor(mesh, x_val, X_SHAPE)
  y = mtf.layers.layer_norm(x, HIDDEN, epsilon=1e-3, name="ln")
  lowering = mtf.Lowering(graph, {mesh: impl})
  impl.variable_store["ln/layer_norm/layer_norm_scale"].assign_full(scale)
  impl.variable_store["ln/layer_norm/layer_norm_bias"].assign_full(bias)
  got = lowering.export_to_tf_tensor(y).numpy()
  keras_ln = tf.keras.layers.LayerNormalization(axis=-1, epsilon=1e-3)
  keras_ln.build(x_val.shape)
  keras_ln.set_weights([scale, bias])
  np.testing.assert_allclose(got, keras_ln(x_val).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_rms_norm(make_mesh_impl, case):
  def reference(xs, p):
    ms = tf.reduce_mean(tf.square(xs[0]), axis=2, keepdims=True)
    return xs[0] * tf.math.rsqrt(ms + 1e-6) * p["rms_norm/rms_norm/rms_norm_scale"]
  _, params = check_layer(make_mesh_impl(*case), [(random_array(X_SHAPE, 5), X_SHAPE)],
                          lambda x: mtf.layers.rms_norm(x, HIDDEN), reference,
                          rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(params["rms_norm/rms_norm/rms_norm_scale"], np.ones(8))


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_batch_norm_training_forward_and_gradient(make_mesh_impl, case):
  def build(x):
    y, updates = mtf.layers.batch_norm(x, True, momentum=0.9, epsilon=1e-5, name="bn")
    assert len(updates) == 2
    return y

  def reference(xs, p):
    mean, var = tf.nn.moments(xs[0], axes=[0, 1])
    return ((xs[0] - mean) * tf.math.rsqrt(var + 1e-5) * p["bn/batch_norm_scale"] +
            p["bn/batch_norm_bias"])
  _, params = check_layer(make_mesh_impl(*case), [(random_array(X_SHAPE, 6), X_SHAPE)],
                          build, reference, rtol=1e-4, atol=1e-5)
  assert sorted(params) == ["bn/batch_norm_bias", "bn/batch_norm_scale",
                            "bn/bn_moving_mean", "bn/bn_moving_variance"]


def test_batch_norm_update_ops_move_the_statistics(make_mesh_impl):
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  graph, mesh = new_mesh()
  x_val = random_array(X_SHAPE, 7, 1.0, 3.0)
  x = mtf.import_tf_tensor(mesh, x_val, X_SHAPE)
  y_train, updates = mtf.layers.batch_norm(x, True, momentum=0.75, name="bn")
  y_eval, no_updates = mtf.layers.batch_norm(x, False, momentum=0.75, name="bn_eval")
  assert no_updates == []
  assert [v.name for v in graph.trainable_variables] == [
      "bn/batch_norm_scale", "bn/batch_norm_bias", "bn_eval/batch_norm_scale",
      "bn_eval/batch_norm_bias"]
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.export_to_tf_tensor(y_train)
  for op in updates:
    lowering.lowered_operation(op)
  values = variable_values(graph, impl)
  mean, var = x_val.mean(axis=(0, 1)), x_val.var(axis=(0, 1))
  np.testing.assert_allclose(values["bn/bn_moving_mean"], 0.25 * mean, rtol=1e-5)
  np.testing.assert_allclose(values["bn/bn_moving_variance"], 0.75 + 0.25 * var,
                             rtol=1e-5)
  # Eval mode uses the (initial) moving statistics: mean 0, variance 1.
  np.testing.assert_allclose(lowering.export_to_tf_tensor(y_eval).numpy(),
                             x_val / np.sqrt(1 + 1e-9), rtol=1e-6)


def test_batch_norm_init_zero_starts_at_zero():
  graph, mesh = new_mesh()
  x = mtf.zeros(mesh, X_SHAPE)
  mtf.layers.batch_norm(x, False, 0.9, init_zero=True)
  impl = mtf.PlacementMeshImpl("", "", ["/cpu:0"])
  mtf.Lowering(graph, {mesh: impl})
  values = variable_values(graph, impl)
  np.testing.assert_array_equal(values["batch_norm/batch_norm_scale"], np.zeros(8))
