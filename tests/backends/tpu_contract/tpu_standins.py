"""Stand-ins for the TPU collectives, run under MirroredStrategy on virtual CPUs.

`CrossReplicaSum`, `AllToAll` and `CollectivePermute` have no CPU kernels. These
stand-ins take their place in `tf.raw_ops` (tests only) and hold the SIMD TPU runtime
to the TPU ops' contract:

- signature: keyword arguments only, with the op's argument names;
- dtypes: the `T` list of the op's registered TF definition (read from the op registry,
  so it cannot drift from the TF in use);
- group assignments / source-target pairs: compile-time int32 constants of rank 2, each
  replica in exactly one group of equal size; pairs name replicas in range with no
  source and no target twice; AllToAll's split_count is the group size and divides the
  split dimension;
- semantics (XLA's): CrossReplicaSum sums over the group; AllToAll splits each member's
  input into split_count pieces, sends piece j to member j, and each member concatenates
  what it receives in group order; CollectivePermute delivers each source's input to its
  target, and zeros to replicas nobody sends to.

Each replica's call meets the others through `merge_call`, where the collective is
computed from every replica's value.
"""
import collections

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import values as values_lib
from tensorflow.python.framework import op_def_registry

OP_NAMES = ("CrossReplicaSum", "AllToAll", "CollectivePermute")

Call = collections.namedtuple("Call", ["op", "dtype", "shape"])


def allowed_dtypes(op_name):
  """The `T` dtypes of a registered TF op definition."""
  for attr in op_def_registry.get(op_name).attr:
    if attr.name == "T":
      return frozenset(tf.as_dtype(t) for t in attr.allowed_values.list.type)
  raise AssertionError("%s has no T attribute" % op_name)


def _check_dtype(op_name, x):
  if x.dtype not in allowed_dtypes(op_name):
    raise TypeError("%s: value for attr 'T' of %s is not in the list of allowed values"
                    % (op_name, x.dtype.name))


def _constant_int32(op_name, what, value):
  """The numpy value of a compile-time int32 rank-2 tensor (XLA needs a constant)."""
  value = tf.convert_to_tensor(value)
  if value.dtype != tf.int32:
    raise TypeError("%s: %s must be int32, got %s" % (op_name, what, value.dtype.name))
  static = tf.get_static_value(value)
  if static is None:
    raise ValueError("%s: %s must be a compile-time constant" % (op_name, what))
  if static.ndim != 2:
    raise ValueError("%s: %s must have rank 2, got shape %s" % (op_name, what,
                                                                list(static.shape)))
  return static


class TpuCollectiveStandIns:
  """The three collectives for a MirroredStrategy's replicas; `calls` logs each
  collective once (not once per replica)."""

  def __init__(self, strategy):
    self.strategy = strategy
    self.num_replicas = strategy.num_replicas_in_sync
    self.calls = []

  def install(self, monkeypatch):
    """Puts the stand-ins in tf.raw_ops for the test (monkeypatch undoes it)."""
    monkeypatch.setattr(tf.raw_ops, "CrossReplicaSum", self.cross_replica_sum)
    monkeypatch.setattr(tf.raw_ops, "AllToAll", self.all_to_all)
    monkeypatch.setattr(tf.raw_ops, "CollectivePermute", self.collective_permute)
    return self

  def ops_used(self):
    """{(op name, dtype name)} of every call so far."""
    return {(c.op, c.dtype.name) for c in self.calls}

  # ---- checks shared by the ops ----
  def _groups(self, op_name, group_assignment):
    groups = _constant_int32(op_name, "group_assignment", group_assignment)
    flat = sorted(groups.reshape(-1).tolist())
    if flat != list(range(self.num_replicas)):
      raise ValueError("%s: group_assignment %s must hold each of the %d replicas exactly "
                       "once" % (op_name, groups.tolist(), self.num_replicas))
    return groups

  def _merge(self, op_name, x, per_replica_fn):
    """Runs per_replica_fn([values of all replicas]) -> [output of each replica]."""
    x = tf.convert_to_tensor(x)
    _check_dtype(op_name, x)
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync != self.num_replicas:
      raise RuntimeError("%s runs in the replica context of the strategy" % op_name)

    def merge_fn(strategy, value):
      self.calls.append(Call(op_name, x.dtype, x.shape.as_list()))  # once per collective
      inputs = list(strategy.experimental_local_results(value))
      outputs = per_replica_fn(inputs)
      placed = []
      for device, out in zip(strategy.extended.worker_devices, outputs):
        with tf.device(device):
          placed.append(tf.identity(out))
      return values_lib.PerReplica(placed)
    return context.merge_call(merge_fn, args=(x,))

  # ---- the ops ----
  def cross_replica_sum(self, *, input, group_assignment, name=None):  # pylint: disable=redefined-builtin
    """CrossReplicaSum: the sum of the inputs of the replica's group."""
    del name
    groups = self._groups("CrossReplicaSum", group_assignment)

    def run(inputs):
      outputs = [None] * len(inputs)
      for group in groups:
        total = tf.add_n([inputs[r] for r in group])
        for r in group:
          outputs[r] = total
      return outputs
    return self._merge("CrossReplicaSum", input, run)

  def all_to_all(self, *, input, group_assignment, concat_dimension, split_dimension,  # pylint: disable=redefined-builtin
                 split_count, name=None):
    """AllToAll: piece j of each member to member j, concatenated in group order."""
    del name
    groups = self._groups("AllToAll", group_assignment)
    x = tf.convert_to_tensor(input)
    rank = x.shape.rank
    for what, dim in (("split_dimension", split_dimension),
                      ("concat_dimension", concat_dimension)):
      if not isinstance(dim, int) or not 0 <= dim < rank:
        raise ValueError("AllToAll: %s %r is not a dimension of a rank-%d input"
                         % (what, dim, rank))
    if split_count != groups.shape[1]:
      raise ValueError("AllToAll: split_count %d differs from the group size %d"
                       % (split_count, groups.shape[1]))
    if x.shape[split_dimension] % split_count:
      raise ValueError("AllToAll: dimension %d (size %d) is not divisible by split_count "
                       "%d" % (split_dimension, x.shape[split_dimension], split_count))

    def run(inputs):
      outputs = [None] * len(inputs)
      for group in groups:
        pieces = {r: tf.split(inputs[r], split_count, axis=split_dimension) for r in group}
        for j, r in enumerate(group):
          outputs[r] = tf.concat([pieces[s][j] for s in group], axis=concat_dimension)
      return outputs
    return self._merge("AllToAll", x, run)

  def collective_permute(self, *, input, source_target_pairs, name=None):  # pylint: disable=redefined-builtin
    """CollectivePermute: each target gets its source's input; the others get zeros."""
    del name
    pairs = _constant_int32("CollectivePermute", "source_target_pairs",
                            source_target_pairs)
    if pairs.shape[1] != 2:
      raise ValueError("CollectivePermute: source_target_pairs must be [num_pairs, 2], got "
                       "%s" % list(pairs.shape))
    if pairs.size and (pairs.min() < 0 or pairs.max() >= self.num_replicas):
      raise ValueError("CollectivePermute: pairs %s name replicas outside 0..%d"
                       % (pairs.tolist(), self.num_replicas - 1))
    for column, what in ((0, "source"), (1, "target")):
      if len(set(pairs[:, column].tolist())) != len(pairs):
        raise ValueError("CollectivePermute: a %s appears twice in %s"
                         % (what, pairs.tolist()))

    def run(inputs):
      outputs = [tf.zeros_like(v) for v in inputs]
      for source, target in pairs.tolist():
        outputs[target] = inputs[source]
      return outputs
    return self._merge("CollectivePermute", input, run)


def fake_topology(mesh_shape):
  """A tf.tpu.experimental.Topology of the given [x, y, z, cores] shape (host-side)."""
  coords = np.array([list(c) for c in np.ndindex(*mesh_shape)], np.int32)
  return tf.tpu.experimental.Topology(mesh_shape=mesh_shape,
                                      device_coordinates=coords.reshape([1, -1, 4]))


def per_core(strategy, per_replica):
  """numpy values of a strategy.run result, indexed by replica id (= physical core)."""
  return [np.asarray(v) for v in strategy.experimental_local_results(per_replica)]
