"""`mtf.placement_mesh_impl`, the original module path of PlacementMeshImpl."""
from mesh_tf.backends.placement import LaidOutTensor, LaidOutVariable, PlacementMeshImpl
from mesh_tf.backends.placement_collectives import (allconcat_ring, allreduce_ring,
                                                    allreduce_ring_single_shard,
                                                    alltoall_pointtwise, alltoall_ring)
