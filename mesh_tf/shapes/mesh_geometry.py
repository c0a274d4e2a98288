"""Row-major processor numbering ("pnum") on a mesh, and processor groups.

A mesh shape may be a Shape, a list of Dimensions (or pairs), a list of ints, or a
shape string.
"""

import numbers

from mesh_tf.errors import LayoutError
from mesh_tf.errors import MtfError
from mesh_tf.shapes.dimension import convert_to_dimension
from mesh_tf.shapes.layout import convert_to_layout_rules
from mesh_tf.shapes.shape import Shape
from mesh_tf.shapes.shape import convert_to_shape
from mesh_tf.shapes.shape import list_product


def _is_int(x):
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _mesh_sizes(mesh_shape):
  """The sizes of the mesh axes, as a list of ints."""
  if isinstance(mesh_shape, (Shape, str)):
    return convert_to_shape(mesh_shape).to_integer_list
  sizes = []
  for d in mesh_shape:
    if _is_int(d):
      if d < 0:
        raise MtfError("mesh shape %r has a negative size %d" % (mesh_shape, d))
      sizes.append(int(d))
    else:
      sizes.append(convert_to_dimension(d).size)
  return sizes


def _check_pnum(sizes, pnum):
  n = list_product(sizes)
  if not _is_int(pnum) or not 0 <= pnum < n:
    raise MtfError(
        "processor number %r is out of range for a mesh of sizes %s "
        "(%d processors)" % (pnum, sizes, n))
  return int(pnum)


def _axes_outside(sizes, group_dims):
  """The mesh axes not in group_dims (checked), ascending."""
  group_dims = list(group_dims)
  for a in group_dims:
    if not _is_int(a) or not 0 <= a < len(sizes):
      raise MtfError(
          "group_dims %r: %r is not a mesh axis of a mesh of sizes %s"
          % (group_dims, a, sizes))
  return [i for i in range(len(sizes)) if i not in group_dims]


def _coordinates(sizes, pnum):
  coord = []
  for size in reversed(sizes):
    coord.append(pnum % size)
    pnum //= size
  return coord[::-1]


def _row_major_number(sizes, coord):
  n = 0
  for size, c in zip(sizes, coord):
    n = n * size + c
  return n


def pnum_to_processor_coordinates(mesh_shape, pnum):
  """The coordinates (a list of ints) of processor `pnum` on the mesh."""
  sizes = _mesh_sizes(mesh_shape)
  return _coordinates(sizes, _check_pnum(sizes, pnum))


def processor_coordinates_to_pnum(mesh_shape, coord):
  """The processor number at coordinates `coord` on the mesh."""
  sizes = _mesh_sizes(mesh_shape)
  coord = list(coord)
  if len(coord) != len(sizes) or not all(
      _is_int(c) and 0 <= c < s for c, s in zip(coord, sizes)):
    raise MtfError(
        "processor coordinates %r do not fit a mesh of sizes %s"
        % (coord, sizes))
  return _row_major_number(sizes, coord)


def pnum_to_group(mesh_shape, group_dims, pnum):
  """The index of the group holding `pnum`.

  A group is the processors whose coordinates agree on every mesh axis not in
  `group_dims`; groups are numbered row-major over those remaining axes.
  """
  sizes = _mesh_sizes(mesh_shape)
  rest = _axes_outside(sizes, group_dims)
  coord = _coordinates(sizes, _check_pnum(sizes, pnum))
  return _row_major_number([sizes[i] for i in rest], [coord[i] for i in rest])


def processor_groups(mesh_shape, group_dims):
  """All groups over `group_dims`: group i lists, ascending, its pnums."""
  sizes = _mesh_sizes(mesh_shape)
  rest = _axes_outside(sizes, group_dims)
  groups = [[] for _ in range(list_product(sizes[i] for i in rest))]
  for pnum in range(list_product(sizes)):
    coord = _coordinates(sizes, pnum)
    index = _row_major_number([sizes[i] for i in rest],
                              [coord[i] for i in rest])
    groups[index].append(pnum)
  return groups


def tensor_dim_to_mesh_dim_size(layout, mesh_shape, tensor_dim):
  """The size of the mesh dim splitting `tensor_dim` under layout rules `layout`, or 1."""
  layout_rules = convert_to_layout_rules(layout)
  mesh_shape = convert_to_shape(mesh_shape)
  axis = layout_rules.tensor_dimension_to_mesh_axis(tensor_dim, mesh_shape)
  return 1 if axis is None else mesh_shape[axis].size


def tensor_dim_to_size_per_split(layout, mesh_shape, tensor_dim):
  """The size of each slice of `tensor_dim` once split over the mesh by rules `layout`."""
  layout_rules = convert_to_layout_rules(layout)
  mesh_shape = convert_to_shape(mesh_shape)
  tensor_dim = convert_to_dimension(tensor_dim)
  axis = layout_rules.tensor_dimension_to_mesh_axis(tensor_dim, mesh_shape)
  if axis is None:
    return tensor_dim.size
  m = mesh_shape[axis]
  if m.size == 0 or tensor_dim.size % m.size:
    rule = "%s:%s" % (tensor_dim.name, m.name)
    raise LayoutError(
        "dim %s=%d is split over mesh dim \"%s\" (size %d) by rule \"%s\"; "
        "%d does not divide %d" % (tensor_dim.name, tensor_dim.size, m.name,
                                   m.size, rule, m.size, tensor_dim.size),
        dim=tensor_dim.name, mesh_dim=m.name, rule=rule,
        hint="change the mesh shape, pad %s, or drop the rule"
        % tensor_dim.name)
  return tensor_dim.size // m.size
