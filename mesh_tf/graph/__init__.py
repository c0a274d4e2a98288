"""Graph language: Graph, Mesh, Tensor, Operation (plain Python objects, no TF ops)."""
from mesh_tf.graph.graph import Graph, variable_scope, name_scope, current_scope_name
from mesh_tf.graph.mesh import Mesh
from mesh_tf.graph.operation import Operation
from mesh_tf.graph.tensor import Tensor
