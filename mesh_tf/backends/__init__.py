"""Mesh backends: each implements only the mesh primitives of lowering.MeshImpl."""
from mesh_tf.backends.placement import PlacementMeshImpl
