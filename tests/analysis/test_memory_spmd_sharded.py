"""Adam's state split over the data-parallel mesh dims, per device of an SPMD process
(issue 31, item 3).

In multi-client SPMD every device is a replica (MultiClientMeshImpl) with its own slice
variables, so what a device holds is counted from its replica's variables. Here the
replicas of task 0 of a 2-process mesh are made in this process (no peers: making the
variables runs no collective), as benchmarks/memory.py's SPMD worker counts them; the
measured per-process peaks of the same setting come from
`python -m benchmarks.memory --backends= --processes=2 --sharded_state` (minutes, so
not run here).
"""
import pytest

from benchmarks import memory
from mesh_tf.backends.simd_multi_client import MultiClientMeshImpl

TOY = memory.MODELS["toy"]


class _Replicas:
  """What memory.spmd_variable_bytes reads of a multi_client.ReplicaSet."""

  def __init__(self, impls):
    self.impls = impls


def _task0_replicas(graph, layout, processes=2):
  mesh_shape, rules = memory.LAYOUTS[layout]
  k = memory.mtf_size(mesh_shape) // processes
  pnums = list(range(k))
  impls = [MultiClientMeshImpl(mesh_shape, rules, p, "/cpu:%d" % p, pnums)
           for p in pnums]
  for impl in impls:
    graph.lowering(impl)  # this replica's variables, eagerly
  return _Replicas(impls)


@pytest.mark.parametrize("layout,dp", [("dp", 8), ("dp+mp", 2)])
def test_sharded_adam_slots_per_spmd_device_are_the_full_ones_over_the_dp_degree(
    layout, dp):
  full, sharded = memory.build_lm(TOY), memory.build_lm(TOY, shard_optimizer_state=True)
  p_full, p = memory.predict(full, layout), memory.predict(sharded, layout)
  names = {v.name for v in sharded.graph.trainable_variables}
  (weights, slots), (held_w, held_s) = memory.spmd_variable_bytes(
      _task0_replicas(sharded, layout), names)
  # counted from the replicas' variables: what the model predicts per device ...
  assert (weights, slots) == (p.weight_bytes, p.slot_bytes)
  # ... and each process of 4 replicas holds 4 of them, nothing shared
  assert held_w + held_s == memory.spmd_process_prediction(p, 4)[0]
  # the weights stay replicated; the optimizer state is split dp ways (every slot of
  # the toy LM has a dim divisible by the dp degree)
  assert weights == p_full.weight_bytes
  assert slots * dp == p_full.slot_bytes
  # the per-device peak drops by at least the slots given up
  assert p_full.peak_bytes - p.peak_bytes >= p_full.slot_bytes - p.slot_bytes
