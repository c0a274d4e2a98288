"""mtf.layers.dense and friends (mesh_tf/layers/dense.py, initializers.py, scoping.py)."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from layer_testing import FOCUSED_CASES, FOCUSED_IDS, check_layer, variable_values
from mtf_testing import BATCH, CLASSES, HIDDEN, LENGTH, new_mesh, random_array

FF = mtf.Dimension("ff", 16)
EXPERTS = mtf.Dimension("experts", 2)
X_SHAPE = [BATCH, LENGTH, HIDDEN]


def test_dense_two_layers_every_layout(mesh_impl):
  """hidden -> ff (relu, bias) -> hidden: the new dim is split in some layouts."""
  def build(x):
    h = mtf.layers.dense(x, FF, activation=mtf.relu)
    return mtf.layers.dense(h, HIDDEN, use_bias=False)

  def reference(xs, p):
    h = tf.nn.relu(tf.einsum("blh,hf->blf", xs[0], p["dense/kernel"]) + p["dense_1/bias"])
    return tf.einsum("blf,fh->blh", h, p["dense_2/kernel"])
  _, params = check_layer(mesh_impl, [(random_array(X_SHAPE, 1), X_SHAPE)], build,
                          reference)
  # Unnamed, the kernel and the bias each take a fresh scope, as in the original.
  assert sorted(params) == ["dense/kernel", "dense_1/bias", "dense_2/kernel"]
  assert params["dense/kernel"].shape == (8, 16)
  np.testing.assert_array_equal(params["dense_1/bias"], np.zeros(16, np.float32))


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_dense_several_reduced_and_new_dims(make_mesh_impl, case):
  def build(x):
    return mtf.layers.dense(x, [FF, CLASSES], reduced_dims=[LENGTH, HIDDEN], name="proj")

  def reference(xs, p):
    return (tf.einsum("blh,lhfc->bfc", xs[0], p["proj/kernel"]) + p["proj/bias"])
  got, params = check_layer(make_mesh_impl(*case), [(random_array(X_SHAPE, 2), X_SHAPE)],
                            build, reference)
  assert got[0].shape == (8, 16, 4)
  assert params["proj/kernel"].shape == (3, 8, 16, 4)


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_dense_expert_dims(make_mesh_impl, case):
  shape = [EXPERTS, BATCH, HIDDEN]

  def build(x):
    return mtf.layers.dense(x, FF, expert_dims=[EXPERTS], name="moe")

  def reference(xs, p):
    y = tf.einsum("ebh,ehf->ebf", xs[0], p["moe/kernel"])
    return y + p["moe/bias"][:, None, :]
  _, params = check_layer(make_mesh_impl(*case), [(random_array(shape, 3), shape)], build,
                          reference)
  assert params["moe/kernel"].shape == (2, 8, 16)
  assert params["moe/bias"].shape == (2, 16)


def test_dense_with_given_kernel_creates_only_the_bias(make_mesh_impl):
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  w_value = random_array([HIDDEN, FF], 4)

  def build(x, w):
    return mtf.layers.dense(x, FF, kernel_weights=w, name="given")

  def reference(xs, p):
    return tf.einsum("blh,hf->blf", xs[0], xs[1]) + p["given/bias"]
  _, params = check_layer(impl, [(random_array(X_SHAPE, 5), X_SHAPE),
                                 (w_value, [HIDDEN, FF])], build, reference)
  assert list(params) == ["given/bias"]


def test_dense_variable_names_follow_tf1_scopes():
  graph, mesh = new_mesh()
  x = mtf.zeros(mesh, X_SHAPE)
  with mtf.variable_scope("DenseReluDense"):
    mtf.layers.dense(x, FF, use_bias=False, name="wi")
  mtf.layers.dense(x, FF)
  mtf.layers.dense(x, FF)
  mtf.layers.dense(x, FF, name="named")
  with mtf.variable_scope("outer"):
    mtf.layers.dense(x, FF, use_bias=False)
  names = [v.name for v in graph.all_variables]
  # Unnamed, the kernel and the bias each open a fresh default scope (the original's
  # dense and get_dense_kernel_weights each did); named, they share it.
  assert names == ["DenseReluDense/wi/kernel", "dense/kernel", "dense_1/bias",
                   "dense_2/kernel", "dense_3/bias", "named/kernel", "named/bias",
                   "outer/dense/kernel"]
  # An explicit "dense" takes the name, so the next default scope skips it.
  graph, mesh = new_mesh()
  x = mtf.zeros(mesh, X_SHAPE)
  mtf.layers.dense(x, FF, name="dense", use_bias=False)
  mtf.layers.dense(x, FF, use_bias=False)
  assert [v.name for v in graph.all_variables] == ["dense/kernel", "dense_1/kernel"]


def test_get_dense_kernel_weights_shape_dtype_and_name():
  graph, mesh = new_mesh()
  x = mtf.zeros(mesh, [EXPERTS, BATCH, HIDDEN], dtype=tf.bfloat16)
  w = mtf.layers.get_dense_kernel_weights(x, [FF], [HIDDEN], [EXPERTS], None, name="k")
  var = graph.all_variables[0]
  assert var.name == "k/kernel"
  assert var.shape == mtf.Shape([EXPERTS, HIDDEN, FF])
  assert var.master_dtype == tf.float32 and w.dtype == tf.bfloat16


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_dense_product_is_a_gated_linear_unit(make_mesh_impl, case):
  def build(x):
    return mtf.layers.dense_product(x, [HIDDEN], [FF],
                                    activation_functions=["linear", "sigmoid"])

  def reference(xs, p):
    a = tf.einsum("blh,hf->blf", xs[0], p["dense_product_0/kernel"])
    b = tf.einsum("blh,hf->blf", xs[0], p["dense_product_1/kernel"])
    return (a + p["dense_product_0/bias"]) * tf.sigmoid(b + p["dense_product_1/bias"])
  check_layer(make_mesh_impl(*case), [(random_array(X_SHAPE, 6), X_SHAPE)], build,
              reference)


def _kernel_sample(initializer, reduced, new):
  init_fn = initializer([mtf.Dimension("r", reduced)], [mtf.Dimension("n", new)])
  return init_fn([reduced, new], dtype=tf.float32).numpy()


@pytest.mark.parametrize("mode,distribution,expected_var", [
    ("fan_in", "normal", 1.0 / 256),
    ("fan_in", "truncated_normal", 1.0 / 256),
    ("fan_out", "untruncated_normal", 1.0 / 64),
    ("fan_avg", "uniform", 2.0 / ((256 + 64) / 2)),
])
def test_variance_scaling_initializer(mode, distribution, expected_var):
  init = mtf.layers.VarianceScalingInitializer(2.0 if mode == "fan_avg" else 1.0, mode,
                                               distribution)
  w = _kernel_sample(init, 256, 64)
  assert w.shape == (256, 64)
  assert abs(w.mean()) < 0.05 * np.sqrt(expected_var)
  assert abs(w.var() / expected_var - 1.0) < 0.05
  if distribution == "uniform":
    assert np.abs(w).max() <= np.sqrt(3 * expected_var)
  elif distribution != "untruncated_normal":
    assert np.abs(w).max() <= 2 * np.sqrt(expected_var) / 0.87962566103423978 + 1e-6


def test_variance_scaling_rejects_unknown_mode_and_distribution():
  with pytest.raises(mtf.MtfError, match="fan_sideways"):
    mtf.layers.VarianceScalingInitializer(mode="fan_sideways")
  with pytest.raises(mtf.MtfError, match="cauchy"):
    mtf.layers.VarianceScalingInitializer(distribution="cauchy")


def test_unit_scaling_convention_moves_the_scale_into_the_einsum(make_mesh_impl):
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  big = mtf.Dimension("hidden", 64)
  x_shape = [BATCH, big]
  assert not mtf.layers.unit_scaling_convention()
  with gin.unlock_config():
    gin.bind_parameter("unit_scaling_convention.value", True)
  try:
    assert mtf.layers.unit_scaling_convention()
    w = _kernel_sample(mtf.layers.VarianceScalingInitializer(), 64, 256)
    assert abs(w.var() - 1.0) < 0.05  # unit variance, not 1/fan_in

    def build(x):
      return mtf.layers.dense(x, FF, use_bias=False, name="us")

    def reference(xs, p):
      return tf.einsum("bh,hf->bf", xs[0], p["us/kernel"]) / 8.0
    check_layer(impl, [(random_array(x_shape, 7), x_shape)], build, reference)
    with pytest.raises(mtf.MtfError, match="fan_in"):
      mtf.layers.VarianceScalingInitializer(mode="fan_out")([big], [FF])
  finally:
    gin.clear_config()
  assert not mtf.layers.unit_scaling_convention()


def test_us_einsum_without_convention_is_einsum(make_mesh_impl):
  impl = make_mesh_impl("all:8", "hidden:all")
  graph, mesh = new_mesh()
  a_val, b_val = random_array([BATCH, HIDDEN], 8), random_array([HIDDEN, FF], 9)
  a = mtf.import_tf_tensor(mesh, a_val, [BATCH, HIDDEN])
  b = mtf.import_tf_tensor(mesh, b_val, [HIDDEN, FF])
  y = mtf.layers.us_einsum([a, b], output_shape=[BATCH, FF])
  got = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(y).numpy()
  np.testing.assert_allclose(got, a_val @ b_val, rtol=1e-5, atol=1e-5)
  assert variable_values(graph, impl) == {}
