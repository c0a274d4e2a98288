"""The original's entry points: layout rules (and a mesh shape) of least peak memory.

For the predicted-step-time objective, hardware profiles and an explained choice, use
`mtf.auto_mtf.choose_layout` (search.py).
"""
from mesh_tf.auto_mtf import candidates
from mesh_tf.auto_mtf import layout_optimizer
from mesh_tf.auto_mtf import memory_estimator
from mesh_tf.shapes import convert_to_layout_rules, convert_to_shape


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

  Mesh shapes are the factorizations of num_machines into 1..max_mesh_shape_dimensions
  non-increasing factors, named mesh_0, mesh_1, ...; ties go to fewer mesh dims, then to
  the earlier shape (larger first factor).
  """
  best = None
  for sizes in candidates.mesh_shapes(num_machines, max_mesh_shape_dimensions,
                                      ordered=False):
    shape = convert_to_shape(candidates.mesh_string(
        sizes, candidates.mesh_dim_names(len(sizes))))
    estimator = memory_estimator.MemoryEstimator(mtf_graph, shape, mtf_outputs)
    optimizer = layout_optimizer.LayoutOptimizer(estimator)
    rules = optimizer.solve()
    peak = optimizer.evaluate_layout(rules)
    if best is None or peak < best[0]:
      best = (peak, rules, shape)
  return convert_to_layout_rules(best[1]), best[2]
