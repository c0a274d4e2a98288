"""Logical-to-physical maps, group assignments and the TPU device assignment (no TPU)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.backends import simd_tpu
from mesh_tf.simd_mesh_impl import (HierarchicalTiling, _ring_2d,
                                    auto_logical_to_physical_tpu,
                                    physical_shape_3d_from_topology_proto_4d)


def _coords(physical_shape, pnum):
  return list(np.unravel_index(pnum, physical_shape))


def _neighbours(a, b, physical_shape):
  """Same chip, or adjacent chips on the torus (wraparound)."""
  diff = [min(abs(x - y), s - abs(x - y)) for x, y, s in
          zip(a[:3], b[:3], physical_shape[:3])]
  return sum(diff) <= 1


def test_hierarchical_tiling_tiles_the_physical_mesh():
  tiling = HierarchicalTiling([("outer", None), ("inner", [2, 2])], [4, 4])
  assert tiling.mesh_shape == mtf.Shape([mtf.Dimension("outer", 4),
                                         mtf.Dimension("inner", 4)])
  l2p = tiling.logical_to_physical
  assert sorted(l2p) == list(range(16))
  for outer in range(4):  # each inner group fills one compact 2x2 tile
    cells = [_coords([4, 4], l2p[outer * 4 + i]) for i in range(4)]
    xs, ys = {c[0] for c in cells}, {c[1] for c in cells}
    assert len(xs) == 2 and len(ys) == 2 and max(xs) - min(xs) == 1, cells
  assert HierarchicalTiling.spec_to_mesh_shape(
      [("outer", None), ("inner", [2, 2])], 16).to_integer_list == [4, 4]


def test_hierarchical_tiling_outer_dims_are_strided():
  l2p = HierarchicalTiling([("a", [2, 1]), ("b", [1, 2]), ("c", [2, 1])],
                           [4, 2]).logical_to_physical
  # c covers x in {0, 1}; b covers y; a strides x by 2
  assert [_coords([4, 2], p) for p in l2p[:4]] == [[0, 0], [1, 0], [0, 1], [1, 1]]
  assert _coords([4, 2], l2p[4]) == [2, 0]


@pytest.mark.parametrize("m,n", [(4, 4), (2, 3), (3, 2), (1, 5), (2, 2), (4, 6)])
def test_ring_2d_is_a_cycle_of_neighbours(m, n):
  ring = _ring_2d(m, n)
  assert sorted(ring) == [(i, j) for i in range(m) for j in range(n)]
  closed = ring + [ring[0]] if (m * n) > 2 and min(m, n) > 1 else ring
  for a, b in zip(closed, closed[1:]):
    assert abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1, (a, b)


@pytest.mark.parametrize("logical,physical", [([4, 8], [4, 4, 1, 2]), ([2, 16], [4, 4, 1, 2]),
                                              ([8, 8], [4, 4, 4]), ([512], [8, 8, 4, 2])])
def test_auto_map_puts_inner_groups_on_physical_rings(logical, physical):
  l2p = auto_logical_to_physical_tpu(logical, physical)
  assert sorted(l2p) == list(range(int(np.prod(physical))))
  coords = auto_logical_to_physical_tpu(logical, physical, return_coordinates=True)
  assert [int(np.ravel_multi_index(c, physical)) for c in coords] == l2p
  inner = logical[-1]
  for start in range(0, len(l2p), inner):
    group = [coords[p] for p in range(start, start + inner)]
    for a, b in zip(group, group[1:]):
      assert _neighbours(a, b, physical), (a, b)


def test_physical_shape_3d_from_topology():
  assert physical_shape_3d_from_topology_proto_4d([4, 4, 1, 2]) == [4, 8, 1]
  assert physical_shape_3d_from_topology_proto_4d([4, 4, 4, 2]) == [8, 4, 4]
  assert physical_shape_3d_from_topology_proto_4d([2, 2, 2, 1]) == [2, 2, 2]


def test_group_assignments_are_physical_ids_in_coordinate_order():
  l2p = [5, 2, 7, 0, 3, 6, 1, 4]
  impl = mtf.SimdMeshImpl("a:2;b:4", "", logical_to_physical=l2p)
  assert impl._create_group_assignment([1]) == [[5, 2, 7, 0], [3, 6, 1, 4]]
  assert impl._create_group_assignment([0]) == [[5, 3], [2, 6], [7, 1], [0, 4]]
  assert impl._create_group_assignment([0, 1]) == [l2p]
  assert [impl.p2l(impl.l2p(p)) for p in range(8)] == list(range(8))


def _fake_topology(mesh_shape):
  coords = np.array([list(c) for c in np.ndindex(*mesh_shape)], np.int32)
  return tf.tpu.experimental.Topology(mesh_shape=mesh_shape,
                                      device_coordinates=coords.reshape([1, -1, 4]))


def test_device_assignment_puts_replica_r_on_physical_core_r():
  topology = _fake_topology([2, 2, 1, 2])
  assignment = simd_tpu.device_assignment_for_mesh(topology, 8)
  assert assignment.num_replicas == 8
  for r in range(8):
    assert [int(c) for c in assignment.coordinates(r, 0)] == _coords([2, 2, 1, 2], r)
  l2p = auto_logical_to_physical_tpu([2, 4], topology.mesh_shape)
  impl = mtf.SimdMeshImpl("a:2;b:4", "batch:a", device_assignment=assignment,
                          logical_to_physical=l2p)
  assert not impl.is_emulated and impl.device_assignment is assignment
  with pytest.raises(mtf.LayoutError, match="mesh has 16 cores but the TPU topology"):
    simd_tpu.device_assignment_for_mesh(topology, 16)


def test_tpu_receive_pairs_follow_the_core_map():
  l2p = [5, 2, 7, 0, 3, 6, 1, 4]
  topology = _fake_topology([2, 2, 1, 2])
  impl = mtf.SimdMeshImpl("a:2;b:4", "", logical_to_physical=l2p,
                          device_assignment=simd_tpu.device_assignment_for_mesh(topology))
  pairs = impl._runtime.source_target_pairs(1, [3, 0, 1, 2])  # shift by one, wrapping
  assert sorted(pairs) == sorted([[l2p[a * 4 + (b - 1) % 4], l2p[a * 4 + b]]
                                  for a in range(2) for b in range(4)])
  no_wrap = impl._runtime.source_target_pairs(1, [None, 0, 1, 2])
  assert len(no_wrap) == 6 and all(t not in (l2p[0], l2p[4]) for _, t in no_wrap)
