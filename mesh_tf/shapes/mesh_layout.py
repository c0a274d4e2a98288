"""`MeshLayout`: the one owner of layout -- a mesh shape, layout rules, and the tensor
layouts and slice shapes they imply. Pure Python (no TensorFlow), immutable, hashable.
"""

from mesh_tf.shapes import optimizer_shard
from mesh_tf.shapes.layout import TensorLayout, convert_to_layout_rules
from mesh_tf.shapes.mesh_geometry import (pnum_to_processor_coordinates,
                                          processor_groups)
from mesh_tf.shapes.shape import convert_to_shape, list_product


class MeshLayout(object):
  """A mesh shape plus layout rules; answers every layout question about a tensor shape."""

  __slots__ = ("_shape", "_rules", "_cache")

  def __init__(self, mesh_shape, layout_rules=None):
    object.__setattr__(self, "_shape", convert_to_shape(mesh_shape))
    object.__setattr__(self, "_rules", convert_to_layout_rules(layout_rules))
    object.__setattr__(self, "_cache", {})

  def __setattr__(self, name, value):
    raise AttributeError("MeshLayout is immutable")

  def __reduce__(self):
    return (MeshLayout, (self._shape, self._rules))

  def __eq__(self, other):
    if isinstance(other, MeshLayout):
      return self._shape == other._shape and self._rules == other._rules
    return NotImplemented

  def __hash__(self):
    return hash((self._shape, self._rules))

  def __repr__(self):
    return "MeshLayout(%r, %r)" % (self._shape.to_string, str(self._rules))

  @classmethod
  def of(cls, x):
    """x if it is a MeshLayout, else the MeshLayout of x (anything with .mesh_layout)."""
    if isinstance(x, MeshLayout):
      return x
    if hasattr(x, "mesh_layout"):
      return x.mesh_layout
    raise TypeError("expected a MeshLayout or a MeshImpl, got %r" % (x,))

  # ---- the mesh ----
  @property
  def shape(self):
    """The mesh shape (a Shape of named mesh dims)."""
    return self._shape

  @property
  def layout_rules(self):
    """The LayoutRules."""
    return self._rules

  @property
  def ndims(self):
    return self._shape.ndims

  @property
  def size(self):
    """Number of processors."""
    return self._shape.size

  def axis_size(self, mesh_axis):
    """Number of processors along one mesh axis (an int index)."""
    return self._shape[mesh_axis].size

  def axes_size(self, mesh_axes):
    """Number of processors in a group spanning the given mesh axes."""
    return list_product([self._shape[a].size for a in mesh_axes])

  def processor_groups(self, mesh_axes):
    """Lists of pnums that differ only in their coordinates on mesh_axes."""
    return processor_groups(self._shape, list(mesh_axes))

  def rules_naming_absent_mesh_dims(self):
    """[(tensor dim, mesh dim)] of the layout rules whose mesh dim this mesh lacks, in
    rule order (they split nothing; a misspelt mesh dim lands here too)."""
    names = set(self._shape.dimension_names)
    return [(t, m) for t, m in self._rules if m not in names]

  # ---- tensors ----
  def tensor_dimension_to_mesh_axis(self, tensor_dimension):
    """The mesh axis that splits a tensor dim (Dimension or name), or None."""
    name = getattr(tensor_dimension, "name", tensor_dimension)
    if isinstance(name, str) and optimizer_shard.is_shard_dim(name):
      return optimizer_shard.mesh_axis(self._rules, self._shape, name)
    return self._rules.tensor_dimension_to_mesh_axis(tensor_dimension, self._shape)

  def tensor_layout(self, arg, tensor_name=None):
    """TensorLayout of an mtf Tensor or Shape; raises LayoutError naming the tensor."""
    if hasattr(arg, "operation"):
      tensor_name = tensor_name or arg.name
      arg = arg.shape
    shape = convert_to_shape(arg)
    # Keyed by shape alone: the name only words the error, and illegal layouts raise.
    layout = self._cache.get(shape)
    if layout is None:
      if any(optimizer_shard.is_shard_dim(d.name) for d in shape.dims):
        # Slots of a sharded optimizer: see shapes/optimizer_shard.py.
        layout = TensorLayout(optimizer_shard.tensor_layout_axes(
            self._rules, self._shape, shape, tensor_name=tensor_name))
      else:
        layout = self._rules.tensor_layout(shape, self._shape, tensor_name=tensor_name)
      self._cache[shape] = layout
    return layout

  def split_axes(self, tensor_shape):
    """{dim name: mesh axis} for the dims of tensor_shape this layout splits."""
    shape = convert_to_shape(tensor_shape)
    return {d.name: a for d, a in zip(shape.dims, self.tensor_layout(shape))
            if a is not None}

  def slice_shape(self, tensor_shape):
    """Per-processor slice shape (a list of ints)."""
    shape = convert_to_shape(tensor_shape)
    return [d.size if a is None else d.size // self._shape[a].size
            for d, a in zip(shape.dims, self.tensor_layout(shape))]

  def slice_size(self, tensor_shape):
    """Number of elements in each processor's slice."""
    return list_product(self.slice_shape(tensor_shape))

  def laid_out_size(self, tensor_shape):
    """Number of elements stored across all processors (counting replicas)."""
    return self.slice_size(tensor_shape) * self.size

  def slice_begin(self, tensor_shape, pnum):
    """Offset of processor pnum's slice within the full tensor."""
    shape = convert_to_shape(tensor_shape)
    coord = pnum_to_processor_coordinates(self._shape, pnum)
    sizes = self.slice_shape(shape)
    return [0 if a is None else coord[a] * s
            for s, a in zip(sizes, self.tensor_layout(shape))]

  def mesh_axis_to_cumprod(self, tensor_shape):
    """For each mesh axis, the row-major stride of its tensor dim (None if unused)."""
    shape = convert_to_shape(tensor_shape)
    ta = self.tensor_layout(shape).mesh_axis_to_tensor_axis(self.ndims)
    return [None if a is None else shape.cumprod[a] for a in ta]
