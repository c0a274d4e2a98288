"""Graph language: Graph, Mesh, Tensor, Operation (plain Python objects, no TF ops)."""
from mesh_tf.graph.graph import (Graph, current_scope_name, name_scope, reuse_variables,
                                 variable_scope)
from mesh_tf.graph.mesh import Mesh
from mesh_tf.graph.operation import Operation
from mesh_tf.graph.tensor import Tensor
