"""Random ops (mesh_tf/ops/random.py): layout-independent values, ranges, moments, dropout."""
import functools

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.ops import random as random_ops
from mtf_testing import BATCH, HIDDEN, LENGTH, lower_and_export, new_mesh, random_array

SAMPLES = mtf.Dimension("samples", 64)
R_SHAPE = [BATCH, SAMPLES, HIDDEN]  # 4096 values per tensor: drawn whole
BIG_SHAPE = R_SHAPE + [mtf.Dimension("big", 17)]  # 69,632 values: hashed per slice
EULER_GAMMA = 0.5772156649


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
      random_ops.random_gumbel(mesh, R_SHAPE, seed=12),
      mtf.random_uniform(mesh, BIG_SHAPE, seed=7),
      mtf.random_normal(mesh, BIG_SHAPE, mean=2.0, stddev=0.5, seed=13),
      random_ops.random_gumbel(mesh, BIG_SHAPE, seed=12),
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
  u01, u35, n01, n2, small, u64, g, big_u, big_n, big_g = got
  assert (mtf.Shape(R_SHAPE).size <= random_ops.WHOLE_DRAW_ELEMENTS
          < mtf.Shape(BIG_SHAPE).size)  # both generators are under test
  for name, value, tol in (("gumbel", g, 0.08), ("big gumbel", big_g, 0.02)):
    assert np.isfinite(value).all(), name
    assert abs(value.mean() - EULER_GAMMA) < tol, name
    assert abs(value.std() - np.pi / np.sqrt(6)) < tol, name
  assert big_u.min() >= 0.0 and big_u.max() < 1.0
  assert abs(big_u.mean() - 0.5) < 0.005 and abs(big_n.mean() - 2.0) < 0.01
  assert abs(big_n.std() - 0.5) < 0.01
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


STEPS = mtf.Dimension("steps", 3)


def _draws_graph(nested):
  """A while loop of three rounds of two draws (a small uniform, then a big normal;
  nested: made by a loop of one iteration inside the loop), then one more uniform.
  Returns (graph, mesh, [the uniform of each round, the normal of each round, the draw
  after the loop])."""
  graph, mesh = new_mesh()

  def one_round():
    return [mtf.random_uniform(mesh, R_SHAPE, seed=5),
            mtf.random_normal(mesh, BIG_SHAPE, seed=6)]

  def body(i, u, n):
    at = mtf.one_hot(i, STEPS, dtype=tf.float32)
    if nested:
      du, dn = mtf.while_loop(
          lambda j, a, b: mtf.less(j, 1), lambda j, a, b: [j + 1] + one_round(),
          [mtf.constant(mesh, 0, dtype=tf.int32), mtf.zeros(mesh, R_SHAPE),
           mtf.zeros(mesh, BIG_SHAPE)])[1:]
    else:
      du, dn = one_round()
    return [i + 1, u + at * du, n + at * dn]
  outs = mtf.while_loop(
      lambda i, u, n: mtf.less(i, STEPS.size), body,
      [mtf.constant(mesh, 0, dtype=tf.int32), mtf.zeros(mesh, [STEPS] + R_SHAPE),
       mtf.zeros(mesh, [STEPS] + BIG_SHAPE)])[1:]
  return graph, mesh, list(outs) + [mtf.random_uniform(mesh, R_SHAPE, seed=5)]


def _drawn_at(step, shape, seed, dist, **params):
  """The values a draw of dist with seed gets at counter step (the module's formula)."""
  key = random_ops.op_key(seed, tf.constant(step, tf.int64))
  full = mtf.Shape(shape).to_integer_list
  # pylint: disable=protected-access
  if mtf.Shape(shape).size <= random_ops.WHOLE_DRAW_ELEMENTS:
    return random_ops._draw_whole(dist, params, key, full).numpy()
  index = random_ops.global_flat_index(full, [0] * len(full), full)
  return random_ops._hash_slice(dist, params, key, index).numpy()


@pytest.mark.parametrize("nested", [False, True], ids=["loop", "loop_of_loops"])
def test_draws_in_a_loop_take_the_steps_of_draws_one_after_another(make_mesh_impl,
                                                                    nested):
  """A loop numbers its body's draws from the counter and advances the counter once
  after the loop: each draw gets the step it would get by advancing the counter itself
  (1, 2, ... in order), on any layout, and a draw after the loop the next one."""
  uniform = {"minval": 0.0, "maxval": 1.0}
  normal = {"mean": 0.0, "stddev": 1.0}
  want_u = [_drawn_at(2 * r + 1, R_SHAPE, 5, "uniform", **uniform) for r in range(3)]
  want_n = [_drawn_at(2 * r + 2, BIG_SHAPE, 6, "normal", **normal) for r in range(3)]
  want_after = _drawn_at(7, R_SHAPE, 5, "uniform", **uniform)
  for impl in (make_mesh_impl(),
               make_mesh_impl("rows:2;cols:4", "batch:rows;samples:cols")):
    graph, mesh, tensors = _draws_graph(nested)
    u, n, after = lower_and_export(graph, mesh, impl, tensors)
    for r in range(3):
      np.testing.assert_array_equal(u[r], want_u[r], err_msg="uniform, round %d" % r)
      np.testing.assert_allclose(n[r], want_n[r], rtol=1e-6, err_msg="normal, %d" % r)
    np.testing.assert_array_equal(after, want_after)


def test_a_loop_that_draws_draws_anew_each_run_in_a_tf1_session():
  """In a tf.compat.v1 Session (the original's tests), each run of a loop draws fresh
  values in every iteration."""
  with tf.Graph().as_default():
    graph, mesh, tensors = _draws_graph(nested=False)
    impl = mtf.PlacementMeshImpl("", "", [""])
    fetched = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(tensors[0])
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      first, second = session.run(fetched), session.run(fetched)
  # (there the loop keeps advancing the counter at each draw, in no set order)
  for a, b in [(first, second), (first[0], first[1])]:
    assert not np.array_equal(a, b)


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
