"""`mtf.simd_mesh_impl`, the original module path of SimdMeshImpl and its TPU helpers."""
# pylint: disable=unused-import
from mesh_tf.backends import tpu_topology
from mesh_tf.backends.simd import LaidOutTensor, SimdMeshImpl
from mesh_tf.backends.simd_emulation import EmulatedLaidOutTensor, EmulatedLaidOutVariable
from mesh_tf.backends.tpu_topology import (HierarchicalTiling, _ring_2d,
                                           physical_shape_3d_from_topology_proto_4d)


def auto_logical_to_physical_tpu(logical_shape, physical_shape, return_coordinates=False,
                                 device_assignment=None):
  """A logical-to-physical core map keeping inner logical dims on compact physical rings.

  Returns, for each logical processor, its physical core number (row-major), or its
  coordinates with return_coordinates=True; given a TPU device_assignment, the replica
  ids whose device has those coordinates.
  """
  if device_assignment is None or return_coordinates:
    return tpu_topology.auto_logical_to_physical_tpu(logical_shape, physical_shape,
                                                     return_coordinates)
  coordinates = tpu_topology.auto_logical_to_physical_tpu(logical_shape, physical_shape,
                                                          return_coordinates=True)
  replica_of = {tuple(int(c) for c in device_assignment.coordinates(replica, 0)): replica
                for replica in range(device_assignment.num_replicas)}
  missing = [c for c in coordinates if tuple(c) not in replica_of]
  if missing:
    raise ValueError("auto_logical_to_physical_tpu: the device assignment has no replica "
                     "at physical coordinates %s" % missing[:4])
  return [replica_of[tuple(c)] for c in coordinates]
