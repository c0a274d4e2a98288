"""The placement backend's tree allreduce and direct allconcat (used between CPUs of one
process) against numpy, and the choice between them and the ring algorithms."""
import numpy as np
import pytest
import tensorflow as tf

from mesh_tf.backends import placement_collectives as pc
from test_placement_collectives import DEVICES, NUMPY, _inputs


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("reduction", ["SUM", "MAX", "MIN"])
def test_allreduce_tree_matches_numpy_on_every_device(n, reduction):
  values, xs = _inputs(n, [4, 6], seed=n)
  expected = NUMPY[reduction](np.stack(values), axis=0)
  out = pc.allreduce_tree(xs, DEVICES[:n], reduction)
  assert len(out) == n
  for o, d in zip(out, DEVICES[:n]):
    assert o.device.endswith("CPU:" + d.split(":")[-1]), (o.device, d)
    np.testing.assert_allclose(o.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("concat_axis", [0, 1])
def test_allconcat_direct_matches_numpy(n, concat_axis):
  values, xs = _inputs(n, [2, 3], seed=n)
  out = pc.allconcat_direct(xs, DEVICES[:n], concat_axis)
  assert len(out) == n and all(o is out[0] for o in out)  # one concat every device reads
  np.testing.assert_array_equal(out[0].numpy(), np.concatenate(values, axis=concat_axis))


def test_host_memory_detection():
  assert pc.shares_host_memory(["", "/cpu:0", "CPU:3", "/device:CPU:1",
                                "/job:localhost/replica:0/task:0/device:CPU:2"])
  assert not pc.shares_host_memory(["/cpu:0", "/gpu:0"])
  # the CPUs of one remote worker share that process's memory; two processes do not
  worker = ["/job:worker/replica:0/task:1/device:CPU:%d" % i for i in range(3)]
  assert pc.shares_host_memory(worker)
  assert not pc.shares_host_memory(worker + ["/job:worker/replica:0/task:0/device:CPU:0"])
  assert not pc.shares_host_memory(worker + ["/cpu:0"])
  assert pc.memory_domains(tuple(worker[:1] + ["", "/gpu:0"])) == (
      ("worker", 0, 1), "local", None)


def _op_types(fn, n, shape):
  xs = [tf.TensorSpec(shape, tf.float32)] * n
  graph = tf.function(lambda *a: fn(list(a))).get_concrete_function(*xs).graph
  return [op.type for op in graph.get_operations() if op.type not in ("Placeholder",)]


def test_sum_on_cpus_is_one_add_n_that_every_device_reads():
  n, shape = 8, [64, 64]  # big enough for the ring to shard
  ring = _op_types(lambda xs: pc.allreduce_ring(xs, DEVICES), n, shape)
  chosen = _op_types(lambda xs: pc.allreduce(xs, DEVICES), n, shape)
  # one AddN, no copies: only the outputs' Identity ops of tf.function
  assert chosen.count("AddN") == 1 and "AddV2" not in chosen
  assert chosen.count("Identity") == n
  assert len(chosen) < len(ring) / 10
  assert "Split" in ring and "Split" not in chosen
  _, xs = _inputs(n, shape, seed=n)
  out = pc.allreduce(xs, DEVICES)
  assert all(o is out[0] for o in out)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_add_n_matches_numpy(n):
  values, xs = _inputs(n, [4, 6], seed=n)
  out = pc.allreduce_add_n(xs, DEVICES[:n])
  assert len(out) == n and all(o is out[0] for o in out)
  np.testing.assert_allclose(out[0].numpy(), np.sum(values, axis=0), rtol=1e-5, atol=1e-6)


def test_max_on_cpus_is_a_shared_tree():
  n = 8
  chosen = _op_types(lambda xs: pc.allreduce(xs, DEVICES, "MAX"), n, [64, 64])
  assert chosen.count("Maximum") == n - 1 and chosen.count("Identity") == n
