"""Lowering: the graph-to-TF compiler and the MeshImpl contract backends implement."""
from mesh_tf.lowering.lowering import Lowering
from mesh_tf.lowering.mesh_impl import MeshImpl
from mesh_tf.lowering.reductions import binary_reduction_fn, reduction_fn
