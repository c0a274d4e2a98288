"""Random ops (mesh_tf/ops/random.py): layout-independent values, ranges, moments, dropout."""
import functools

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, LENGTH, lower_and_export, new_mesh, random_array

SAMPLES = mtf.Dimension("samples", 64)
R_SHAPE = [BATCH, SAMPLES, HIDDEN]  # 4096 values per tensor


def _random_graph():
  """A graph of seeded and unseeded random tensors; returns (graph, mesh, tensors)."""
  graph, mesh = new_mesh()
  tensors = [
      mtf.random_uniform(mesh, R_SHAPE, seed=7),
      mtf.random_uniform(mesh, R_SHAPE, minval=-3.0, maxval=5.0, seed=7),
      mtf.random_normal(mesh, R_SHAPE, seed=8),
      mtf.random_normal(mesh, R_SHAPE, mean=2.0, stddev=0.5, seed=9),
      mtf.random_uniform(mesh, [LENGTH, HIDDEN], name="unseeded"),
      mtf.random_uniform(mesh, R_SHAPE, seed=11, dtype=tf.float64),
  ]
  return graph, mesh, tensors


@functools.lru_cache(maxsize=None)
def _single_device_values(build, *args):
  """Values of build(*args)'s tensors on a fresh one-processor mesh (computed once)."""
  graph, mesh, tensors = build(*args)
  impl = mtf.PlacementMeshImpl("", "", ["/cpu:0"])
  return lower_and_export(graph, mesh, impl, tensors)


def test_random_uniform_and_normal(mesh_impl):
  graph, mesh, tensors = _random_graph()
  got = lower_and_export(graph, mesh, mesh_impl, tensors)
  # Layout-independent by design: bitwise the same values as on one device.
  for k, (a, b) in enumerate(zip(got, _single_device_values(_random_graph))):
    np.testing.assert_array_equal(a, b, err_msg="random tensor %d" % k)
  u01, u35, n01, n2, small, u64 = got
  assert u01.dtype == np.float32 and u64.dtype == np.float64 and small.shape == (3, 8)
  assert u01.min() >= 0.0 and u01.max() < 1.0
  assert u35.min() >= -3.0 and u35.max() < 5.0
  assert abs(u01.mean() - 0.5) < 0.02 and abs(u01.std() - np.sqrt(1 / 12.)) < 0.02
  assert abs(u35.mean() - 1.0) < 0.15
  assert abs(n01.mean()) < 0.05 and abs(n01.std() - 1.0) < 0.05
  assert abs(n2.mean() - 2.0) < 0.03 and abs(n2.std() - 0.5) < 0.03
  # Different ops (even with one seed) give uncorrelated values.
  for other in (u35, n01, u64):
    assert abs(np.corrcoef(u01.ravel(), other.ravel())[0, 1]) < 0.1
  assert len(np.unique(u01)) > 4000


def test_random_ops_draw_fresh_values_each_run(make_mesh_impl):
  impl = make_mesh_impl("all:8", "batch:all")
  graph, mesh = new_mesh()
  u = mtf.random_uniform(mesh, [BATCH, HIDDEN], seed=3)
  first = lower_and_export(graph, mesh, impl, [u])[0]
  second = lower_and_export(graph, mesh, impl, [u])[0]
  assert not np.array_equal(first, second)


@pytest.mark.parametrize("in_loop", [False, True], ids=["plain", "in_a_while_loop"])
def test_a_function_lowering_random_ops_traces_once_after_an_eager_lowering(in_loop):
  # The pattern of the trainer: variables made by an eager Lowering, then the step as a
  # tf.function. TF traces a function again when its first trace creates a variable,
  # which the random ops' counter used to be (also where only a loop body draws).
  graph, mesh = new_mesh()
  w = mtf.get_variable(mesh, "w", [BATCH, HIDDEN])
  if in_loop:
    u = mtf.while_loop(
        lambda i, a: mtf.less(i, 2),
        lambda i, a: [i + 1, a + mtf.random_uniform(mesh, [BATCH, HIDDEN], seed=3)],
        [mtf.constant(mesh, 0, dtype=tf.int32), w])[1]
  else:
    u = w * mtf.random_uniform(mesh, [BATCH, HIDDEN], seed=3)
  impl = mtf.PlacementMeshImpl("all:8", "batch:all", ["/cpu:%d" % i for i in range(8)])
  mtf.Lowering(graph, {mesh: impl})
  traces = []

  @tf.function
  def step():
    traces.append(1)
    return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(u)
  first, second = step().numpy(), step().numpy()
  assert len(traces) == 1
  assert not np.array_equal(first, second)  # the counter still advances per run


def _dropout_graph(rate):
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(R_SHAPE, 1, 0.5, 2.0), R_SHAPE)
  y = mtf.dropout(x, rate=rate)
  w = mtf.import_tf_tensor(mesh, random_array(R_SHAPE, 2), R_SHAPE)
  gx, = mtf.gradients([mtf.reduce_sum(y * w)], [x])
  return graph, mesh, [x, y, gx, w]


@pytest.mark.parametrize("rate", [0.25, 0.6])
def test_dropout(mesh_impl, rate):
  graph, mesh, tensors = _dropout_graph(rate)
  x, y, gx, w = lower_and_export(graph, mesh, mesh_impl, tensors)
  keep = y != 0
  assert abs(1.0 - keep.mean() - rate) < 0.03
  np.testing.assert_allclose(y[keep], x[keep] / (1.0 - rate), rtol=1e-6)
  # The gradient is the same mask, scaled: w * mask / keep_prob.
  np.testing.assert_allclose(gx, w * keep / (1.0 - rate), rtol=1e-6, atol=1e-7)
  # The mask does not depend on the layout.
  _, y_ref, gx_ref, _ = _single_device_values(_dropout_graph, rate)
  np.testing.assert_array_equal(y, y_ref)
  np.testing.assert_array_equal(gx, gx_ref)


def test_dropout_noise_shape_and_arguments(mesh_impl):
  graph, mesh = new_mesh()
  ones = mtf.ones(mesh, R_SHAPE)
  shared = mtf.dropout(ones, keep_prob=0.5, noise_shape=[SAMPLES, HIDDEN])
  positional = mtf.dropout(ones, 0.5)  # the original's dropout(x, keep_prob)
  assert mtf.dropout(ones, is_training=False, rate=0.5) is ones
  assert mtf.dropout(ones, rate=0.0) is ones
  with pytest.raises(ValueError, match="exactly one"):
    mtf.dropout(ones, keep_prob=0.5, rate=0.5)
  with pytest.raises(ValueError, match="noise_shape"):
    mtf.dropout(ones, rate=0.5, noise_shape=[LENGTH])
  s, p = lower_and_export(graph, mesh, mesh_impl, [shared, positional])
  # One mask for all of batch: every batch row is the same.
  assert (s == s[:1]).all()
  assert set(np.unique(s)) == {0.0, 2.0} and set(np.unique(p)) == {0.0, 2.0}
  assert abs((p == 0).mean() - 0.5) < 0.03
