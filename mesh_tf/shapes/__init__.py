"""Dimensions, shapes, layout rules and mesh geometry (pure Python)."""

from mesh_tf.shapes.dimension import Dimension
from mesh_tf.shapes.dimension import convert_to_dimension
from mesh_tf.shapes.layout import LayoutRules
from mesh_tf.shapes.layout import TensorLayout
from mesh_tf.shapes.layout import convert_to_layout_rules
from mesh_tf.shapes.mesh_geometry import pnum_to_group
from mesh_tf.shapes.mesh_layout import MeshLayout
from mesh_tf.shapes.mesh_geometry import pnum_to_processor_coordinates
from mesh_tf.shapes.mesh_geometry import processor_coordinates_to_pnum
from mesh_tf.shapes.mesh_geometry import processor_groups
from mesh_tf.shapes.mesh_geometry import tensor_dim_to_mesh_dim_size
from mesh_tf.shapes.mesh_geometry import tensor_dim_to_size_per_split
from mesh_tf.shapes.shape import Shape
from mesh_tf.shapes.shape import anonymous_shape
from mesh_tf.shapes.shape import combined_dimension
from mesh_tf.shapes.shape import convert_to_shape
from mesh_tf.shapes.shape import is_subsequence
from mesh_tf.shapes.shape import list_product
from mesh_tf.shapes.shape import shape_union
from mesh_tf.shapes.shape import transpose_list_of_lists

__all__ = [
    "Dimension", "convert_to_dimension",
    "Shape", "convert_to_shape", "list_product", "is_subsequence",
    "transpose_list_of_lists", "combined_dimension", "anonymous_shape",
    "shape_union",
    "LayoutRules", "TensorLayout", "convert_to_layout_rules", "MeshLayout",
    "pnum_to_processor_coordinates", "processor_coordinates_to_pnum",
    "pnum_to_group", "processor_groups", "tensor_dim_to_mesh_dim_size",
    "tensor_dim_to_size_per_split",
]
