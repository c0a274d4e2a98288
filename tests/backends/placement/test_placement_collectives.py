"""Ring and point-to-point collectives of the placement backend, against plain reductions."""
import numpy as np
import pytest
import tensorflow as tf

from mesh_tf import placement_mesh_impl as pmi

DEVICES = ["/cpu:%d" % i for i in range(8)]
NUMPY = {"SUM": np.sum, "MAX": np.max, "MIN": np.min}


def _inputs(n, shape, seed=0):
  rng = np.random.RandomState(seed)
  values = [rng.randn(*shape).astype(np.float32) for _ in range(n)]
  xs = []
  for v, d in zip(values, DEVICES):
    with tf.device(d):
      xs.append(tf.constant(v))
  return values, xs


def _assert_on_devices(results, devices):
  for r, d in zip(results, devices):
    assert r.device.endswith("CPU:%s" % d.split(":")[-1]), (r.device, d)


@pytest.mark.parametrize("n", [1, 2, 3, 8])
@pytest.mark.parametrize("shape", [[3, 5], [16, 64]], ids=["small", "sharded"])
@pytest.mark.parametrize("reduction", ["SUM", "MAX", "MIN"])
def test_allreduce_ring(n, shape, reduction):
  values, xs = _inputs(n, shape)
  expected = NUMPY[reduction](np.stack(values), axis=0)
  for fn in (pmi.allreduce_ring, pmi.allreduce_ring_single_shard):
    out = fn(xs, DEVICES[:n], reduction)
    assert len(out) == n
    _assert_on_devices(out, DEVICES[:n])
    for o in out:
      np.testing.assert_allclose(o.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("concat_axis", [0, 1])
def test_allconcat_ring(n, concat_axis):
  values, xs = _inputs(n, [2, 3])
  expected = np.concatenate(values, axis=concat_axis)
  out = pmi.allconcat_ring(xs, DEVICES[:n], concat_axis)
  _assert_on_devices(out, DEVICES[:n])
  for o in out:
    np.testing.assert_array_equal(o.numpy(), expected)


@pytest.mark.parametrize("fn", [pmi.alltoall_pointtwise, pmi.alltoall_ring])
@pytest.mark.parametrize("split_axis,concat_axis", [(0, 1), (1, 0), (1, 1)])
def test_alltoall(fn, split_axis, concat_axis):
  n = 4
  values, xs = _inputs(n, [8, 8])
  out = fn(xs, DEVICES[:n], split_axis, concat_axis)
  _assert_on_devices(out, DEVICES[:n])
  for j, o in enumerate(out):
    pieces = [np.split(v, n, axis=split_axis)[j] for v in values]
    np.testing.assert_array_equal(o.numpy(), np.concatenate(pieces, axis=concat_axis))


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("split_axis", [0, 1])
def test_reduce_scatter_keeps_each_devices_piece_of_the_sum(n, split_axis):
  from mesh_tf.backends import placement_collectives  # pylint: disable=g-import-not-at-top
  values, xs = _inputs(n, [8, 4])
  out = placement_collectives.reduce_scatter(xs, DEVICES[:n], split_axis)
  _assert_on_devices(out, DEVICES[:n])
  total = np.sum(np.stack(values), axis=0)
  for j, o in enumerate(out):
    np.testing.assert_allclose(o.numpy(), np.split(total, n, axis=split_axis)[j],
                               rtol=1e-5, atol=1e-6)


def test_unknown_reduction_is_named():
  _, xs = _inputs(2, [2])
  with pytest.raises(ValueError, match="'PROD'.*MAX.*MIN.*SUM"):
    pmi.allreduce_ring(xs, DEVICES[:2], "PROD")


def test_add_n_allreduce_in_a_graph_is_one_addn_and_differentiable_under_a_tape():
  """In a graph the AddN is made directly (not through tf.math.add_n), except where a
  tape may record it: there tf.math.add_n makes it, so the tape sees it."""
  from mesh_tf.backends import placement_collectives  # pylint: disable=g-import-not-at-top
  values, _ = _inputs(4, [3, 5])

  @tf.function(autograph=False)
  def run(*xs):
    total = placement_collectives.allreduce_add_n(list(xs), DEVICES[:4])
    with tf.GradientTape() as tape:
      tape.watch(xs)
      taped = placement_collectives.allreduce_add_n(list(xs), DEVICES[:4])[0]
      loss = tf.reduce_sum(taped * taped)
    return total, tape.gradient(loss, xs)
  concrete = run.get_concrete_function(*[tf.constant(v) for v in values])
  (add_n, _) = [op for op in concrete.graph.get_operations() if op.type == "AddN"][:2]
  assert add_n.get_attr("N") == 4 and add_n.device.endswith("CPU:0")
  total, grads = run(*[tf.constant(v) for v in values])
  np.testing.assert_allclose(total[0].numpy(), np.sum(values, 0), rtol=1e-6)
  for g in grads:
    np.testing.assert_allclose(g.numpy(), 2 * np.sum(values, 0), rtol=1e-5)
