"""The original's entry points: layout rules (and a mesh shape) of least peak memory.

For the predicted-step-time objective, hardware profiles and an explained choice, use
`mtf.auto_mtf.choose_layout` (search.py).
"""
from mesh_tf.auto_mtf import layout_optimizer
from mesh_tf.auto_mtf import memory_estimator
from mesh_tf.shapes import Dimension, Shape, convert_to_layout_rules


def layout(mtf_graph, mesh_shape, mtf_outputs=()):
  """LayoutRules of least scheduled peak memory per device for the graph on mesh_shape.

  Args:
    mtf_graph: the mtf Graph.
    mesh_shape: the mesh shape (string, list of Dimensions or Shape).
    mtf_outputs: tensors (or ops) the step computes; only the ops they need count.
  """
  estimator = memory_estimator.MemoryEstimator(mtf_graph, mesh_shape, mtf_outputs)
  return convert_to_layout_rules(layout_optimizer.LayoutOptimizer(estimator).solve())


def layout_and_mesh_shape(mtf_graph, num_machines, mtf_outputs=(),
                          max_mesh_shape_dimensions=2):
  """(LayoutRules, mesh Shape) of least peak memory over the mesh shapes of num_machines.

  The mesh shapes tried are those of _mesh_shape_iterator, with dims named mesh_0,
  mesh_1, ...; the first shape reaching the least peak memory wins.

  Args:
    mtf_graph: the mtf Graph.
    num_machines: the number of processors (a power of two, as in the original).
    mtf_outputs: tensors (or ops) the step computes.
    max_mesh_shape_dimensions: the most mesh dims a shape may have (None: no limit).
  """
  best = None
  for sizes in _mesh_shape_iterator(num_machines, max_mesh_shape_dimensions):
    shape = Shape([Dimension("mesh_%d" % i, size) for i, size in enumerate(sizes)])
    estimator = memory_estimator.MemoryEstimator(mtf_graph, shape, mtf_outputs)
    optimizer = layout_optimizer.LayoutOptimizer(estimator)
    rules = optimizer.solve()
    peak = optimizer.evaluate_layout(rules)
    if best is None or peak < best[0]:
      best = (peak, rules, shape)
  return convert_to_layout_rules(best[1]), best[2]


def _mesh_shape_iterator(num_machines, max_mesh_shape_dimensions=None):
  """Yields the mesh shapes (lists of sizes) with num_machines processors.

  Every non-increasing list of factors of at least 2 (powers of two if num_machines is a
  power of two) whose product is num_machines, from the largest first size down ([8],
  [4, 2], [2, 2, 2] for 8); [1] for one machine. Shapes with more than
  max_mesh_shape_dimensions sizes are left out (None: no limit).
  """
  if num_machines == 1:
    yield [1]
    return
  power_of_two = num_machines & (num_machines - 1) == 0

  def factors_of(n, largest):
    if n == 1:
      yield []
      return
    for f in range(min(n, largest), 1, -1):
      if n % f or (power_of_two and f & (f - 1)):
        continue
      for rest in factors_of(n // f, f):
        yield [f] + rest

  for sizes in factors_of(num_machines, num_machines):
    if max_mesh_shape_dimensions is None or len(sizes) <= max_mesh_shape_dimensions:
      yield sizes
