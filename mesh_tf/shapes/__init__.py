"""Dimensions, shapes, layout rules and mesh geometry (pure Python)."""

from mesh_tf.shapes.dimension import Dimension, convert_to_dimension
from mesh_tf.shapes.layout import LayoutRules, TensorLayout, convert_to_layout_rules
from mesh_tf.shapes.mesh_geometry import (pnum_to_group, pnum_to_processor_coordinates,
                                          processor_coordinates_to_pnum, processor_groups,
                                          tensor_dim_to_mesh_dim_size,
                                          tensor_dim_to_size_per_split)
from mesh_tf.shapes.mesh_layout import MeshLayout
from mesh_tf.shapes.shape import (Shape, anonymous_shape, combined_dimension, convert_to_shape,
                                  is_subsequence, list_product, shape_union,
                                  transpose_list_of_lists)

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
