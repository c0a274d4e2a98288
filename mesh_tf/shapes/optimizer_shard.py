"""Optimizer-shard dims: how a slot can be split over the data-parallel mesh axes.

An optimizer that shards its state (ZeRO-style) views a variable through a copy of its
shape whose dims are renamed to *optimizer-shard dims*, whose names carry the variable's
whole shape ("d_model#opt_shard#d_model=64&d_ff=256"), so their layout follows from the
name alone, under any layout:

  * a dim the layout rules split in the variable keeps that mesh axis;
  * each data-parallel mesh axis (one a rule gives the tensor dim "batch") of size > 1
    that splits no dim of the variable goes to the variable's first dim, in shape order,
    still unsplit and divisible by the axis size;
  * any other dim is whole.
"""
import functools

from mesh_tf.errors import LayoutError
from mesh_tf.shapes.dimension import Dimension
from mesh_tf.shapes.shape import Shape, convert_to_shape

TAG = "#opt_shard#"

# Tensor dims whose mesh axes count as data-parallel (they split the batch).
DATA_PARALLEL_DIM_NAMES = ("batch",)


def is_shard_dim(name):
  """Whether the dim name is an optimizer-shard dim."""
  return TAG in name


def shard_shape(shape):
  """The optimizer-shard twin of shape: each dim renamed, sizes and order kept."""
  shape = convert_to_shape(shape)
  for d in shape.dims:
    if is_shard_dim(d.name):
      raise LayoutError("shape %s already has optimizer-shard dim %r; a slot shape is "
                        "made from the variable's own shape" % (shape, d.name), dim=d.name)
  spec = "&".join("%s=%d" % (d.name, d.size) for d in shape.dims)
  return Shape([Dimension(d.name + TAG + spec, d.size) for d in shape.dims])


def parse(name):
  """(base dim name, the variable shape it came from) of an optimizer-shard dim name."""
  base, _, spec = name.partition(TAG)
  dims = []
  for item in spec.split("&"):
    dim_name, _, size = item.rpartition("=")
    dims.append(Dimension(dim_name, int(size)))
  return base, Shape(dims)


def data_parallel_axes(rules, mesh_shape):
  """Mesh axes (ints, ascending) of size > 1 that a rule gives a data-parallel dim."""
  names = {m for t, m in rules if t in DATA_PARALLEL_DIM_NAMES}
  return [i for i, m in enumerate(mesh_shape.dims) if m.name in names and m.size > 1]


@functools.lru_cache(maxsize=4096)
def mesh_axis(rules, mesh_shape, name):
  """The mesh axis splitting optimizer-shard dim `name` under rules, or None."""
  base, var_shape = parse(name)
  var_layout = rules.tensor_layout(var_shape, mesh_shape)
  index = var_shape.dimension_names.index(base)
  if var_layout[index] is not None:
    return var_layout[index]
  used = set(var_layout.mesh_axes)
  taken = set()
  for axis in data_parallel_axes(rules, mesh_shape):
    if axis in used:
      continue
    n = mesh_shape.dims[axis].size
    for j, d in enumerate(var_shape.dims):
      if var_layout[j] is None and j not in taken and d.size % n == 0:
        taken.add(j)
        if j == index:
          return axis
        break
  return None


def tensor_layout_axes(rules, mesh_shape, shape, tensor_name=None):
  """Per dim of shape (which has optimizer-shard dims), the mesh axis splitting it.

  Ordinary dims follow the rules; raises LayoutError if two dims land on one mesh axis.
  """
  plain = Shape([d for d in shape.dims if not is_shard_dim(d.name)])
  plain_axes = iter(rules.tensor_layout(plain, mesh_shape, tensor_name=tensor_name))
  axes = [mesh_axis(rules, mesh_shape, d.name) if is_shard_dim(d.name)
          else next(plain_axes) for d in shape.dims]
  owner = {}
  for d, a in zip(shape.dims, axes):
    if a is not None and owner.setdefault(a, d.name) != d.name:
      raise LayoutError(
          "tensor %s%s: dims %s and %s are both split over mesh dim \"%s\"; an "
          "optimizer-shard dim cannot share a tensor with a dim split over the "
          "data-parallel mesh dim" % (tensor_name + " " if tensor_name else "", shape,
                                      owner[a], d.name, mesh_shape.dims[a].name),
          tensor=tensor_name, dim=d.name, mesh_dim=mesh_shape.dims[a].name)
  return axes
