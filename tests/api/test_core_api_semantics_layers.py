"""mtf.layers and mtf.optimize signatures that changed to the original's, called the
original's way and compared with plain TF."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from layers.layer_testing import check_layer
from mtf_testing import (BATCH, HIDDEN, assert_close, lower_and_export, new_mesh,
                         random_array, random_ints)

CPUS = ["/cpu:%d" % i for i in range(8)]
CASES = pytest.mark.parametrize("mesh_shape,layout", [
    ("", ""), ("rows:2;cols:4", "batch:rows;hidden:cols")], ids=["single", "2x4"])
LENGTH = mtf.Dimension("length", 6)
CHANNELS = mtf.Dimension("channels", 4)


def _impl(mesh_shape, layout):
  return mtf.PlacementMeshImpl(mesh_shape, layout,
                               CPUS[:mtf.convert_to_shape(mesh_shape).size])


@CASES
def test_weights_nonzero_is_float_by_default(mesh_shape, layout):
  targets_np = random_ints([BATCH, HIDDEN], 1, 0, 3)
  loss_np = random_array([BATCH, HIDDEN], 2)
  graph, mesh = new_mesh()
  targets = mtf.import_tf_tensor(mesh, targets_np, [BATCH, HIDDEN])
  loss = mtf.import_tf_tensor(mesh, loss_np, [BATCH, HIDDEN])
  weighted = mtf.reduce_sum(loss * mtf.layers.weights_nonzero(targets))
  got = lower_and_export(graph, mesh, _impl(mesh_shape, layout), [weighted])[0]
  expected = tf.reduce_sum(loss_np * tf.cast(tf.not_equal(targets_np, 0), tf.float32))
  assert_close(got, expected, "weighted loss", rtol=1e-5)


@CASES
def test_conv1d_kw_args_and_separable_conv1d_positional(mesh_shape, layout):
  shape = [BATCH, LENGTH, CHANNELS]
  # One weight per channel and tap, used as the taps' kernels.
  weights = np.arange(3 * CHANNELS.size, dtype=np.float32).reshape(3, -1) / 4 - 1

  def build(x):
    taps = [mtf.import_tf_tensor(x.mesh, w, [CHANNELS]) for w in weights]
    return [mtf.layers.conv1d(x, HIDDEN, 3, 1, padding="VALID", name="c1"),
            # (x, output_dim, min/max_relative_pos, two init scales, name, use_bias,
            #  kernel_depth_weights), as in the original
            mtf.layers.separable_conv1d(x, HIDDEN, -1, 1, 1.0, 1.0, "sep", True, taps)]

  def reference(xs, p):
    x = xs[0]
    conv = tf.nn.conv1d(x, p["c1/kernel"][0], 1, "VALID")
    padded = tf.pad(x, [[0, 0], [1, 1], [0, 0]])
    mixed = tf.add_n([weights[k] * padded[:, k:k + 6] for k in range(3)])
    mixed += p["sep/depthwise_conv_hack/depthwise_dense_0/bias"]
    return [conv, tf.einsum("blc,co->blo", mixed, p["sep/pointwise_dense/kernel"]) +
            p["sep/pointwise_dense/bias"]]
  check_layer(_impl(mesh_shape, layout), [(random_array(shape, 3), shape)], build,
              reference, rtol=1e-4, atol=1e-5)


@CASES
def test_conv2d_with_blocks_takes_x(mesh_shape, layout):
  h, w = mtf.Dimension("h", 4), mtf.Dimension("w", 4)
  hb, wb = mtf.Dimension("h_blocks", 1), mtf.Dimension("w_blocks", 1)
  shape = [BATCH, hb, wb, h, w, CHANNELS]

  def build(x):
    return mtf.layers.conv2d_with_blocks(x=x, output_dim=HIDDEN, filter_size=(3, 3),
                                         strides=(1, 1), padding="SAME", h_blocks_dim=hb,
                                         w_blocks_dim=wb, name="cb")

  def reference(xs, p):
    y = tf.nn.conv2d(tf.reshape(xs[0], [8, 4, 4, 4]), p["cb/kernel"], 1, "SAME")
    return tf.reshape(y, [8, 1, 1, 4, 4, 8])
  check_layer(_impl(mesh_shape, layout), [(random_array(shape, 4), shape)], build,
              reference, rtol=1e-4, atol=1e-5)


def test_annealed_dropout_in_the_original_order():
  graph, mesh = new_mesh()
  x = mtf.ones(mesh, [BATCH, mtf.Dimension("many", 256)])
  step = tf.compat.v1.train.get_or_create_global_step()
  # (x, is_training, start_step, end_step, init_rate, noise_shape, name)
  y = mtf.layers.annealed_dropout(x, True, 10, 20, 0.5, None, "annealed")
  assert mtf.layers.annealed_dropout(x, True, 10, 20) is x  # no init_rate: no dropout
  impl = _impl("", "")
  step.assign(0)
  early = lower_and_export(graph, mesh, impl, [y])[0]
  assert abs((early == 0).mean() - 0.5) < 0.05
  np.testing.assert_allclose(early[early != 0], 2.0)
  step.assign(20)
  np.testing.assert_array_equal(lower_and_export(graph, mesh, impl, [y])[0], 1.0)


def test_optimizer_helpers_in_the_original_form():
  step = mtf.optimize.get_global_step()
  step.assign(9)
  rate = mtf.optimize.adafactor_decay_rate_pow()  # exponent=0.8 by default
  np.testing.assert_allclose(float(rate()), 1.0 - 10.0 ** -0.8, rtol=1e-6)
  x_np = random_array([BATCH, HIDDEN], 5)
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, HIDDEN])
  rms = mtf.optimize.reduce_rms(x, reduced_dim=HIDDEN)
  got = lower_and_export(graph, mesh, _impl("rows:2;cols:4", "batch:rows;hidden:cols"),
                         [rms, mtf.optimize.reduce_rms(x)])
  assert_close(got[0], tf.sqrt(tf.reduce_mean(tf.square(x_np), axis=1)), "rms per row")
  assert_close(got[1], np.sqrt(np.mean(x_np ** 2)), "rms", rtol=1e-5)
  opt = mtf.optimize.AdamWithMultiLRSchedule(variable_search=None, alt_lr_schedules=None,
                                             learning_rate=0.1, train_steps=100)
  assert isinstance(opt, mtf.optimize.AdamWeightDecayOptimizer)
  with pytest.raises(TypeError):
    mtf.optimize.AdafactorWithMultiLRSchedule(None, None, no_such_option=1)


@CASES
def test_corr_is_pearson_correlation(mesh_shape, layout):
  x_np = random_array([BATCH, HIDDEN], 6)
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, HIDDEN])
  c = mtf.layers.corr(x, HIDDEN)
  assert c.shape.dimension_names == ["hidden", "hidden_prime"]
  got = lower_and_export(graph, mesh, _impl(mesh_shape, layout), [c])[0]
  assert_close(got, np.corrcoef(x_np, rowvar=False), "corr", rtol=1e-4, atol=1e-5)
