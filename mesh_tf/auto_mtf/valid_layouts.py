"""Which mtf dims may be split over which mesh dims.

An mtf dim may be split when it is named (not one of anonymous_shape's "_anonymous_N"
dims), no operation needs it whole (an op's `unsplittable_dims`), and the mesh dim's size
divides every size the dim has in the graph (a name can carry several sizes; the test is
against their gcd). Dims are read from the operations' outputs.

A pipeline's stages dim (see `pipeline_stage_dims`) may only be split over a mesh dim
of its own size: over a smaller one each processor would run several stages one after
another, each paying the bubble, which a pipeline of fewer stages does with less work.
"""
import math
import re

from mesh_tf.ops.slicing import ShiftOperation
from mesh_tf.ops.variables import Variable
from mesh_tf.shapes import convert_to_shape

_ANONYMOUS = re.compile(r"_anonymous_\d*")


class LayoutValidator(object):
  """Valid (mtf dim, mesh dim) assignments of a graph on a mesh shape.

  Args:
    mtf_graph: an mtf Graph, or a list of its Operations.
    mesh_shape: the mesh shape (string, list of Dimensions or Shape).
  """

  def __init__(self, mtf_graph, mesh_shape):
    operations = (list(mtf_graph) if isinstance(mtf_graph, (list, tuple))
                  else mtf_graph.operations)
    self._mesh_shape = convert_to_shape(mesh_shape)
    sizes = {}
    named = set()
    unsplittable = set()
    for op in operations:
      for t in op.outputs:
        for d in t.shape.dims:
          sizes[d.name] = math.gcd(sizes.get(d.name, 0), d.size)
          if not _ANONYMOUS.match(d.name):
            named.add(d.name)
      unsplittable.update(op.unsplittable_dims)
    self._gcd_sizes = sizes
    self._splittable = frozenset(named - unsplittable)
    self._stage_dims = pipeline_stage_dims(operations)

  @property
  def pipeline_stage_dims(self):
    """{name: size} of the graph's pipeline stages dims (see pipeline_stage_dims)."""
    return dict(self._stage_dims)

  @property
  def splittable_mtf_dimension_names(self):
    """Names of the mtf dims no operation needs whole."""
    return self._splittable

  @property
  def mesh_dimension_name_to_size(self):
    """{mesh dim name: size}."""
    return {d.name: d.size for d in self._mesh_shape.dims}

  def is_valid_assignment(self, mtf_dimension_name, mesh_dimension_name):
    """True when the mtf dim may be split over the mesh dim (see module docstring)."""
    mesh_sizes = self.mesh_dimension_name_to_size
    if (mtf_dimension_name not in self._splittable
        or mesh_dimension_name not in mesh_sizes):
      return False
    if mtf_dimension_name in self._stage_dims:
      return self._stage_dims[mtf_dimension_name] == mesh_sizes[mesh_dimension_name]
    return self._gcd_sizes[mtf_dimension_name] % mesh_sizes[mesh_dimension_name] == 0


def pipeline_stage_dims(operations):
  """{name: size} of the pipeline stages dims among operations (an mtf Graph or a list
  of its Operations): the dims that trainable variables carry and along which a tensor
  is `shift`ed (mtf.layers.pipeline moves its buffer one stage on per iteration)."""
  operations = (list(operations) if isinstance(operations, (list, tuple))
                else operations.operations)
  weight_dims = {}
  for op in operations:
    if isinstance(op, Variable) and op.trainable:
      weight_dims.update((d.name, d.size) for d in op.shape.dims)
  out = {}
  for op in operations:
    if isinstance(op, ShiftOperation):
      x = op.inputs[0]
      size = x.shape.dims[x.shape.dimension_names.index(op.dim_name)].size
      if weight_dims.get(op.dim_name) == size:
        out[op.dim_name] = size
  return out
