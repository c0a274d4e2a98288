"""`mtf.simd_mesh_impl`, the original module path of SimdMeshImpl and its TPU helpers."""
# pylint: disable=unused-import
from mesh_tf.backends.simd import LaidOutTensor, SimdMeshImpl
from mesh_tf.backends.simd_emulation import EmulatedLaidOutTensor, EmulatedLaidOutVariable
from mesh_tf.backends.tpu_topology import (HierarchicalTiling, _ring_2d,
                                           auto_logical_to_physical_tpu,
                                           physical_shape_3d_from_topology_proto_4d)
