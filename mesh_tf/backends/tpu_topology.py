"""Logical-to-physical core maps for SIMD meshes.

A SIMD mesh numbers its processors row-major over the logical mesh ("logical pnum"); the
hardware numbers its cores row-major over the physical torus ("physical pnum"), e.g.
[x, y, z, cores_per_chip]. A logical-to-physical map is a permutation l2p with
l2p[logical pnum] = physical pnum. Collectives over a logical mesh axis are fastest when
its groups sit on short physical rings; the helpers here choose such maps.

Pure Python (no TensorFlow).
"""
from mesh_tf.errors import LayoutError
from mesh_tf.shapes import (Dimension, Shape, list_product, pnum_to_processor_coordinates,
                            processor_coordinates_to_pnum)


def check_permutation(logical_to_physical, num_cores, mesh_description):
  """Returns logical_to_physical as a list of ints, or raises LayoutError if it is not a
  permutation of range(num_cores)."""
  l2p = [int(p) for p in logical_to_physical]
  if len(l2p) != num_cores:
    raise LayoutError(
        "logical_to_physical for mesh %s has %d entries, but the mesh has %d cores; give "
        "one physical core per logical processor" % (mesh_description, len(l2p),
                                                      num_cores))
  if sorted(l2p) != list(range(num_cores)):
    seen, repeated = set(), []
    for p in l2p:
      if p in seen:
        repeated.append(p)
      seen.add(p)
    missing = sorted(set(range(num_cores)) - seen)
    out_of_range = sorted(seen - set(range(num_cores)))
    raise LayoutError(
        "logical_to_physical for mesh %s is not a permutation of 0..%d: repeated %s, "
        "missing %s, out of range %s" % (mesh_description, num_cores - 1, repeated[:8],
                                         missing[:8], out_of_range[:8]))
  return l2p


def inverse_permutation(perm):
  """p2l from l2p (or the reverse)."""
  inverse = [0] * len(perm)
  for i, p in enumerate(perm):
    inverse[p] = i
  return inverse


class HierarchicalTiling:
  """Tiles the physical mesh with the logical mesh dims, outer dims strided the most.

  Args:
    spec: list of (name, projected_shape) pairs, one per logical mesh dim.
      projected_shape (a list with one int per physical axis) is the shape of the block
      that logical dim covers on the physical mesh; the last dim covers a compact tile,
      each earlier dim repeats the tiles of the dims after it. The first projected shape
      may be None: it is what the others leave of the physical shape.
    physical_shape: list of ints, e.g. [x, y, z, cores_per_chip].
  """

  def __init__(self, spec, physical_shape):
    physical_shape = [int(s) for s in physical_shape]
    self._names = [name for name, _ in spec]
    shapes = [None if s is None else [int(v) for v in s] for _, s in spec]
    for i, s in enumerate(shapes):
      if s is None and i > 0:
        raise LayoutError("HierarchicalTiling spec %s: only the first entry may be None, "
                          "not entry %d (%r)" % (spec, i, self._names[i]))
      if s is not None and len(s) != len(physical_shape):
        raise LayoutError("HierarchicalTiling spec %s: %r projects onto %d physical axes "
                          "but the physical shape %s has %d" % (
                              spec, self._names[i], len(s), physical_shape,
                              len(physical_shape)))
    if shapes and shapes[0] is None:
      shapes[0] = self._remaining(spec, shapes[1:], physical_shape)
    strides, current = [], [1] * len(physical_shape)
    for s in reversed(shapes):
      strides.insert(0, list(current))
      current = [c * v for c, v in zip(current, s)]
    if current != physical_shape:
      raise LayoutError(
          "HierarchicalTiling spec %s does not tile the physical shape %s: its blocks "
          "multiply to %s per physical axis" % (spec, physical_shape, current))
    self._projected = shapes
    self._l2p = []
    sizes = [list_product(s) for s in shapes]
    for logical in range(list_product(sizes)):
      physical = [0] * len(physical_shape)
      for index, s, stride in zip(pnum_to_processor_coordinates(sizes, logical), shapes, strides):
        for k, (c, st) in enumerate(zip(pnum_to_processor_coordinates(s, index), stride)):
          physical[k] += c * st
      self._l2p.append(processor_coordinates_to_pnum(physical_shape, physical))

  @staticmethod
  def _remaining(spec, shapes, physical_shape):
    rest = list(physical_shape)
    for s in shapes:
      for k, v in enumerate(s):
        if v <= 0 or rest[k] % v:
          raise LayoutError("HierarchicalTiling spec %s does not tile the physical shape "
                            "%s: physical axis %d (size %d) is not divisible by %d"
                            % (spec, physical_shape, k, physical_shape[k], v))
        rest[k] //= v
    return rest

  @property
  def logical_to_physical(self):
    """l2p: list with the physical pnum of each logical pnum (a permutation)."""
    return list(self._l2p)

  @property
  def mesh_shape(self):
    """The logical mesh shape, an mtf Shape."""
    return Shape([Dimension(n, list_product(s)) for n, s in zip(self._names,
                                                                self._projected)])

  @classmethod
  def spec_to_mesh_shape(cls, spec, num_processors):
    """The logical mesh shape of spec on num_processors cores (without the topology)."""
    sizes = [None if s is None else list_product(s) for _, s in spec]
    known = list_product([s for s in sizes if s is not None])
    if sizes and sizes[0] is None:
      if num_processors % known:
        raise LayoutError("HierarchicalTiling spec %s: %d processors are not divisible by "
                          "the %d the other dims use" % (spec, num_processors, known))
      sizes[0] = num_processors // known
    if list_product(sizes) != num_processors:
      raise LayoutError("HierarchicalTiling spec %s covers %d processors, not %d"
                        % (spec, list_product(sizes), num_processors))
    return Shape([Dimension(name, s) for (name, _), s in zip(spec, sizes)])


def _ring_2d(m, n):
  """A cycle through every cell of an m x n grid in which consecutive cells (and the last
  and first) are neighbours when m or n is even; a snake otherwise. List of (i, j)."""
  if m == 1 or n == 1:
    return [(i, j) for i in range(m) for j in range(n)]
  if m % 2 and not n % 2:
    return [(i, j) for j, i in _ring_2d(n, m)]
  if m % 2:  # odd x odd: no Hamiltonian cycle exists; a boustrophedon path
    return [(i, j if i % 2 == 0 else n - 1 - j) for i in range(m) for j in range(n)]
  ring = [(i, 0) for i in range(m)]
  for i in reversed(range(m)):
    cols = range(1, n) if (m - 1 - i) % 2 == 0 else reversed(range(1, n))
    ring.extend((i, j) for j in cols)
  return ring


def physical_shape_3d_from_topology_proto_4d(mesh_shape):
  """A 3-D physical shape from a TPU topology's [x, y, z, cores_per_chip]: the cores of a
  chip are folded into y (2-D tori, z == 1) or into x (3-D tori)."""
  x, y, z, cores = [int(v) for v in mesh_shape]
  if cores == 1:
    return [x, y, z]
  return [x, y * cores, z] if z == 1 else [x * cores, y, z]


def auto_logical_to_physical_tpu(logical_shape, physical_shape, return_coordinates=False):
  """A logical-to-physical map keeping the inner logical dims on compact physical rings.

  The cores of a chip come first, then the chips along a 2-D ring over the (x, y) plane,
  then z (the ring running backwards on odd layers); logical pnums are laid along this
  order, so every group of an inner logical dim is a short physical ring.

  Args:
    logical_shape: list of ints (or an mtf Shape / Dimensions).
    physical_shape: list of ints, [x, y, z, cores] (or [x, y, z] / [x, y]).
    return_coordinates: return each logical pnum's physical coordinates instead of pnums.
  Returns:
    list l2p (a permutation), or a list of coordinate lists.
  """
  sizes = [getattr(d, "size", d) for d in (
      logical_shape.dims if isinstance(logical_shape, Shape) else logical_shape)]
  physical_shape = [int(s) for s in physical_shape]
  num_cores = list_product(physical_shape)
  if list_product(sizes) != num_cores:
    raise LayoutError("auto_logical_to_physical_tpu: logical mesh %s has %d processors but "
                      "the physical mesh %s has %d cores" % (sizes, list_product(sizes),
                                                             physical_shape, num_cores))
  x, y, z, cores = (physical_shape + [1] * (4 - len(physical_shape)))[:4]
  order = []
  ring = _ring_2d(x, y)
  for k in range(z):
    # odd layers run the ring backwards, so each layer starts above where the last ended
    for i, j in (ring if k % 2 == 0 else ring[::-1]):
      for c in range(cores):
        order.append([i, j, k, c][:len(physical_shape)])
  if return_coordinates:
    return order
  return [processor_coordinates_to_pnum(physical_shape, coord) for coord in order]
