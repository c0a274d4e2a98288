"""The search space: mesh shapes for a device count, and layouts for a mesh shape.

A layout gives each mesh dim a set of mtf dims to split. It is legal when every mtf dim
is on at most one mesh dim, the mesh dim's size divides the mtf dim, and no two mtf dims
sharing a mesh dim appear together in one tensor (or, for the original's memory
objective, in one operation). Legal layouts are enumerated mesh dim by mesh dim, each
taking an independent set of the conflict graph among the dims not yet taken.
"""
import itertools


def mesh_dim_names(ndims):
  """Names of the mesh dims of a searched mesh: mesh_0, mesh_1, ..."""
  return ["mesh_%d" % i for i in range(ndims)]


def mesh_shapes(num_devices, max_dims, ordered=True):
  """Factorizations of num_devices into 1..max_dims factors > 1 (tuples of sizes).

  With ordered=False only non-increasing tuples are returned (enough when mesh dims of
  any order behave alike). One device gives [()].
  """
  if num_devices < 1 or max_dims < 1:
    raise ValueError("need num_devices >= 1 and max_dims >= 1, got %d and %d"
                     % (num_devices, max_dims))
  if num_devices == 1:
    return [()]
  out = []

  def extend(prefix, rest):
    if rest == 1:
      out.append(tuple(prefix))
      return
    if len(prefix) == max_dims:
      return
    for f in range(2, rest + 1):
      if rest % f == 0 and (ordered or not prefix or f <= prefix[-1]):
        extend(prefix + [f], rest // f)
  extend([], num_devices)
  return sorted(out, key=lambda s: (len(s), [-x for x in s]))


def conflicting_pairs(operations, per_operation=False):
  """Set of frozenset({a, b}) of dim names found together in one tensor (or op)."""
  pairs = set()
  for op in operations:
    groups = [t.shape.dimension_names for t in op.outputs]
    groups += [t.shape.dimension_names for t in op.inputs]
    if per_operation:
      groups = [sorted({n for g in groups for n in g})]
    for g in groups:
      for a, b in itertools.combinations(g, 2):
        if a != b:
          pairs.add(frozenset((a, b)))
  return pairs


def _independent_sets(names, conflicts):
  """All subsets of names with no conflicting pair, smallest first."""
  sets = [()]
  for r in range(1, len(names) + 1):
    for combo in itertools.combinations(names, r):
      if all(frozenset(p) not in conflicts for p in itertools.combinations(combo, 2)):
        sets.append(combo)
  return sets


def layouts(dim_names, mesh_sizes, allowed, conflicts, symmetric=False):
  """Yields legal layouts as tuples (one tuple of mtf dim names per mesh dim).

  Args:
    dim_names: the mtf dims that may be split.
    mesh_sizes: sizes of the mesh dims.
    allowed: fn(dim name, mesh axis) -> bool (divisibility, splittability).
    conflicts: set of frozenset pairs that may not share a mesh dim.
    symmetric: when mesh dims of equal size are interchangeable, yield one layout of
      each class (the sets of equal-size mesh dims in sorted order).
  """
  names = sorted(dim_names)
  options = [_independent_sets([n for n in names if allowed(n, a)], conflicts)
             for a in range(len(mesh_sizes))]

  def extend(axis, used, prefix):
    if axis == len(mesh_sizes):
      yield tuple(prefix)
      return
    for s in options[axis]:
      if used.intersection(s):
        continue
      if (symmetric and axis and mesh_sizes[axis] == mesh_sizes[axis - 1]
          and s < prefix[-1]):
        continue
      yield from extend(axis + 1, used.union(s), prefix + [s])
  yield from extend(0, frozenset(), [])


def rules_string(layout, mesh_names):
  """The layout rules string ("d_ff:mesh_1;batch:mesh_0") of a layout tuple."""
  return ";".join("%s:%s" % (d, mesh_names[a])
                  for a, dims in enumerate(layout) for d in dims)


def mesh_string(mesh_sizes, mesh_names):
  """The mesh shape string ("mesh_0:2;mesh_1:4")."""
  return ";".join("%s:%d" % (n, s) for n, s in zip(mesh_names, mesh_sizes))
