"""The stand-ins hold the TPU ops' contract: dtype lists, group rules, semantics."""
import numpy as np
import pytest
import tensorflow as tf

import tpu_standins
from tpu_standins import per_core


def test_dtype_lists_are_the_tpu_ops():
  crs = tpu_standins.allowed_dtypes("CrossReplicaSum")
  assert crs == {tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.uint32}
  assert tf.bool not in tpu_standins.allowed_dtypes("CollectivePermute")
  assert {tf.bool, tf.int64} <= tpu_standins.allowed_dtypes("AllToAll")


def _run(strategy, fn):
  return per_core(strategy, tf.function(lambda: strategy.run(fn), autograph=False)())


def _replica_value(dtype=tf.float32):
  r = tf.distribute.get_replica_context().replica_id_in_sync_group
  return tf.cast(tf.range(4) + 10 * r, dtype)


def test_semantics_against_numpy(strategy, standins):
  groups = [[0, 3, 5, 6], [1, 2, 4, 7]]
  inputs = [np.arange(4) + 10 * r for r in range(8)]
  sums = _run(strategy, lambda: tf.raw_ops.CrossReplicaSum(
      input=_replica_value(), group_assignment=tf.constant(groups)))
  for group in groups:
    for r in group:
      np.testing.assert_array_equal(sums[r], sum(inputs[s] for s in group))
  pairs = [[0, 1], [1, 2], [5, 0]]
  permuted = _run(strategy, lambda: tf.raw_ops.CollectivePermute(
      input=_replica_value(), source_target_pairs=tf.constant(pairs)))
  for r in range(8):
    sources = [s for s, t in pairs if t == r]
    want = inputs[sources[0]] if sources else np.zeros(4)
    np.testing.assert_array_equal(permuted[r], want)
  swapped = _run(strategy, lambda: tf.raw_ops.AllToAll(
      input=_replica_value(), group_assignment=tf.constant(groups), concat_dimension=0,
      split_dimension=0, split_count=4))
  for group in groups:
    for j, r in enumerate(group):
      np.testing.assert_array_equal(swapped[r], [inputs[s][j] for s in group])
  assert standins.ops_used() == {("CrossReplicaSum", "float32"), ("AllToAll", "float32"),
                                 ("CollectivePermute", "float32")}


@pytest.mark.parametrize("call,error", [
    (lambda: tf.raw_ops.CrossReplicaSum(input=_replica_value(tf.int64),
                                        group_assignment=tf.constant([list(range(8))])),
     "int64 is not in the list"),
    (lambda: tf.raw_ops.CollectivePermute(input=_replica_value() > 3,
                                          source_target_pairs=tf.constant([[0, 1]])),
     "bool is not in the list"),
    (lambda: tf.raw_ops.CrossReplicaSum(input=_replica_value(),
                                        group_assignment=tf.constant([[0, 1, 2, 3]])),
     "exactly once"),
    (lambda: tf.raw_ops.CollectivePermute(input=_replica_value(),
                                          source_target_pairs=tf.constant([[0, 1], [0, 2]])),
     "source appears twice"),
    (lambda: tf.raw_ops.CollectivePermute(input=_replica_value(),
                                          source_target_pairs=tf.constant([0, 1])),
     "rank 2"),
    (lambda: tf.raw_ops.AllToAll(input=_replica_value(),
                                 group_assignment=tf.constant([list(range(8))]),
                                 concat_dimension=0, split_dimension=0, split_count=8),
     "not divisible"),
    (lambda: tf.raw_ops.CrossReplicaSum(_replica_value(), tf.constant([list(range(8))])),
     "positional"),
])
def test_contract_violations_are_rejected(strategy, standins, call, error):
  del standins
  with pytest.raises((TypeError, ValueError), match=error):
    _run(strategy, call)
