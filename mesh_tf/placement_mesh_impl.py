"""`mtf.placement_mesh_impl`, the original module path of PlacementMeshImpl."""
from mesh_tf.backends.placement import LaidOutTensor, LaidOutVariable, PlacementMeshImpl
