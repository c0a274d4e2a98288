"""Dropout, jitter, annealed dropout and gradient clipping (layers/regularization.py)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from layer_testing import FOCUSED_CASES, FOCUSED_IDS, check_layer
from mtf_testing import BATCH, HIDDEN, check_against_tf, new_mesh, random_array

SAMPLES = mtf.Dimension("samples", 64)
SHAPE = [BATCH, SAMPLES, HIDDEN]


def _values_on(case_list, build, make_mesh_impl):
  """Exports build(mesh)'s tensors on a fresh MeshImpl for each case."""
  results = []
  for case in case_list:
    graph, mesh = new_mesh()
    tensors = build(mesh)
    lowering = mtf.Lowering(graph, {mesh: make_mesh_impl(*case)})
    results.append([lowering.export_to_tf_tensor(t).numpy() for t in tensors])
  return results


def test_layers_dropout_is_mtf_dropout(make_mesh_impl):
  x_val = random_array(SHAPE, 1, 0.5, 2.0)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_val, SHAPE)
    return [mtf.layers.dropout(x, True, rate=0.3), mtf.layers.dropout(x, False, rate=0.3)]
  (single, off), (split, _) = _values_on(FOCUSED_CASES[:2], build, make_mesh_impl)
  np.testing.assert_array_equal(single, split)
  np.testing.assert_array_equal(off, x_val)
  kept = single != 0
  assert abs(kept.mean() - 0.7) < 0.03
  np.testing.assert_allclose(single[kept], x_val[kept] / 0.7, rtol=1e-6)


def test_multiplicative_jitter(make_mesh_impl):
  x_val = random_array(SHAPE, 2, 0.5, 2.0)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_val, SHAPE)
    return [mtf.layers.multiplicative_jitter(x, epsilon=0.1),
            mtf.layers.multiplicative_jitter(x, epsilon=0)]
  results = _values_on(FOCUSED_CASES, build, make_mesh_impl)
  ratio = results[0][0] / x_val
  assert ratio.min() >= 0.9 - 1e-6 and ratio.max() < 1.1 + 1e-6
  assert abs(ratio.mean() - 1.0) < 0.01 and ratio.std() > 0.05
  np.testing.assert_array_equal(results[0][1], x_val)
  for other in results[1:]:
    np.testing.assert_array_equal(other[0], results[0][0])


@pytest.mark.parametrize("step,expected_rate", [(0, 0.6), (100, 0.6), (150, 0.4),
                                                (200, 0.2), (900, 0.2)])
def test_annealed_dropout_rate_follows_the_step(make_mesh_impl, step, expected_rate):
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  x_val = np.ones([8, 64, 8], np.float32)
  global_step = tf.Variable(0, dtype=tf.int64)
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_val, SHAPE)
  y = mtf.layers.annealed_dropout(x, True, start_step=100, end_step=200, init_rate=0.6,
                                  final_rate=0.2, global_step=global_step)
  global_step.assign(step)  # read when lowered, not when the graph was built
  got = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(y).numpy()
  kept = got != 0
  assert abs(1.0 - kept.mean() - expected_rate) < 0.04
  np.testing.assert_allclose(got[kept], 1.0 / (1.0 - expected_rate), rtol=1e-5)


def test_annealed_dropout_uses_tf_global_step_by_default():
  graph, mesh = new_mesh()
  x = mtf.ones(mesh, SHAPE)
  step = tf.compat.v1.train.get_or_create_global_step()
  step.assign(1000)
  y = mtf.layers.annealed_dropout(x, True, 0, 10, init_rate=0.5, final_rate=0.0)
  assert mtf.layers.annealed_dropout(x, False, 0, 10, init_rate=0.5) is x
  got = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", ["/cpu:0"])
                            }).export_to_tf_tensor(y).numpy()
  step.assign(0)
  np.testing.assert_array_equal(got, np.ones([8, 64, 8], np.float32))


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
@pytest.mark.parametrize("clip", [None, 0.05, 100.0])
def test_clip_activation_gradient(make_mesh_impl, case, clip):
  shape = [BATCH, HIDDEN]

  def reference(xs, p):
    del p
    if clip is None:
      return xs[0] * 3.0

    @tf.custom_gradient
    def clipped(t):
      def grad(dy):
        rms = tf.sqrt(tf.reduce_mean(tf.square(dy)))
        return dy * tf.minimum(1.0, clip / rms)
      return tf.identity(t), grad
    return clipped(xs[0]) * 3.0
  got, _ = check_layer(make_mesh_impl(*case), [(random_array(shape, 3), shape)],
                       lambda x: mtf.layers.clip_activation_gradient(x, clip) * 3.0,
                       reference)
  assert got[0].shape == (8, 8)


def test_clip_activation_gradient_scales_to_the_rms(make_mesh_impl):
  """Forward is the identity; the clipped gradient's RMS is exactly the limit."""
  shape = [BATCH, HIDDEN]
  check_against_tf(make_mesh_impl("all:8", "hidden:all"), [(random_array(shape, 4), shape)],
                   lambda x: mtf.layers.clip_activation_gradient(x, 0.25), lambda x: x,
                   grad=False)
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(shape, 5), shape)
  y = mtf.layers.clip_activation_gradient(x, 0.25)
  dy = mtf.import_tf_tensor(mesh, random_array(shape, 6, -5.0, 5.0), shape)
  gx, = mtf.gradients([y], [x], grad_ys=[dy])
  got = mtf.Lowering(graph, {mesh: make_mesh_impl("rows:2;cols:4", "batch:rows")}
                    ).export_to_tf_tensor(gx).numpy()
  np.testing.assert_allclose(np.sqrt(np.mean(got ** 2)), 0.25, rtol=1e-5)


def _summary_values(graph, lowering):
  """{tag: value} of the scalar summaries in graph (each lowered on demand)."""
  return {op.name: float(lowering.lowered_operation(op).numpy())
          for op in graph.operations if isinstance(op, mtf.ScalarSummaryOperation)}


@pytest.mark.parametrize("case", FOCUSED_CASES[:2], ids=FOCUSED_IDS[:2])
def test_summary_for_clip_activation_gradient(make_mesh_impl, case):
  """Forward and gradient pass through; the summaries are the gradient's RMS overall and
  the largest per-example RMS (examples = batch, RMS over samples and hidden)."""
  x_val = random_array(SHAPE, 7)
  dy_val = random_array(SHAPE, 8, -3.0, 3.0)
  dy_val[5] *= 4.0  # one example with a clearly larger gradient
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_val, SHAPE)
  y = mtf.layers.summary_for_clip_activation_gradient(x, "act", [BATCH]) * 2.0
  assert not [op for op in graph.operations if isinstance(op, mtf.ScalarSummaryOperation)]
  gx, = mtf.gradients([y], [x], grad_ys=[mtf.import_tf_tensor(mesh, dy_val, SHAPE)])
  lowering = mtf.Lowering(graph, {mesh: make_mesh_impl(*case)})
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(y).numpy(), x_val * 2.0)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(gx).numpy(), dy_val * 2.0)
  dt = dy_val * 2.0
  summaries = _summary_values(graph, lowering)
  assert sorted(summaries) == ["act/grad_rms", "act/grad_rms_max_example"]
  np.testing.assert_allclose(summaries["act/grad_rms"], np.sqrt(np.mean(dt ** 2)),
                             rtol=1e-5)
  np.testing.assert_allclose(summaries["act/grad_rms_max_example"],
                             np.sqrt(np.mean(dt[5] ** 2)), rtol=1e-5)


def test_summary_for_clip_activation_gradient_against_tf(make_mesh_impl):
  shape = [BATCH, HIDDEN]
  check_layer(make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols"),
              [(random_array(shape, 9), shape)],
              lambda x: mtf.layers.summary_for_clip_activation_gradient(
                  mtf.tanh(x), "t", ["batch"]) * x,
              lambda xs, p: tf.tanh(xs[0]) * xs[0])


def test_summary_for_clip_activation_gradient_bad_batch_dim():
  _, mesh = new_mesh()
  x = mtf.zeros(mesh, SHAPE)
  with pytest.raises(mtf.ShapeError, match="batch dim 'examples'") as info:
    mtf.layers.summary_for_clip_activation_gradient(x, "act", ["examples"])
  assert info.value.dim == "examples"
