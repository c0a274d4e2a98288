"""The original's objective: layout rules that minimize peak memory per device.

The original built an OR-tools CP-SAT model for this. Here the legal layouts of the
mesh (candidates.layouts, with the original's per-operation rule: no two dims of one
operation on one mesh dim) are searched exhaustively and each is scored by the
scheduled peak memory (memory_estimator.PeakMemoryModel). Ties go to the layout that
splits more dims, then to the first rules string in sorted order, so the answer is
deterministic. For the handful of dims of a Transformer this is milliseconds to seconds.
"""
from mesh_tf.auto_mtf import candidates
from mesh_tf.auto_mtf import memory_estimator as me
from mesh_tf.auto_mtf import print_cp_model_solution
from mesh_tf.errors import MtfError
from mesh_tf.shapes import convert_to_layout_rules


class SolverError(MtfError):
  """The layout search found no legal layout."""


class SearchModel(object):
  """The solved search in the shape print_cp_model_solution reads: a boolean per valid
  (mtf dim, mesh dim) pair, named "x[dim:mesh_dim]"."""

  def __init__(self, pairs):
    self._pairs = list(pairs)

  def variables(self):
    """[(name, variable)] of every valid (mtf dim, mesh dim) pair."""
    return [("x[%s:%s]" % p, p) for p in self._pairs]


class SearchSolver(object):
  """Values of a SearchModel's variables in the chosen layout, and its objective."""

  def __init__(self, chosen_pairs, objective):
    self._chosen = set(chosen_pairs)
    self._objective = objective

  def Value(self, variable):  # pylint: disable=invalid-name
    """1 when the pair is in the chosen layout, else 0."""
    return int(variable in self._chosen)

  def ObjectiveValue(self):  # pylint: disable=invalid-name
    """Peak bytes per device of the chosen layout."""
    return self._objective


class LayoutOptimizer(object):
  """Searches layout rules of minimum peak memory for a MemoryEstimator's graph and mesh.

  Args:
    memory_estimator: a MemoryEstimator.
    scheduler_alg: "LIST" or "NAIVE" (see scheduler.minimize_peak_memory).
  """

  def __init__(self, memory_estimator, scheduler_alg="LIST"):
    self._estimator = memory_estimator
    self._peak = me.estimator_peak_model(memory_estimator, scheduler_alg)
    validator = memory_estimator.get_layout_validator()
    self._mesh_sizes = validator.mesh_dimension_name_to_size
    self._mesh_names = [d.name for d in memory_estimator.mesh_shape.dims]
    self._validator = validator

  def evaluate_layout(self, layout):
    """Peak bytes per device under layout (rules string or LayoutRules)."""
    rules = convert_to_layout_rules(layout)
    assignment = {}
    for d, m in rules:
      if m in self._mesh_sizes and d not in assignment:
        assignment[d] = m
    return self._peak.peak_bytes(self._mesh_sizes, assignment)

  def solve(self, print_solution=False):
    """The layout rules string of least peak memory (see module docstring).

    Raises:
      SolverError when the mesh admits no legal layout.
    """
    graph = self._estimator.get_graph_interface()
    dims = sorted(self._validator.splittable_mtf_dimension_names)
    conflicts = candidates.conflicting_pairs(graph.operations, per_operation=True)
    sizes = [self._mesh_sizes[n] for n in self._mesh_names]

    def allowed(dim, axis):
      return self._validator.is_valid_assignment(dim, self._mesh_names[axis])
    best = None
    for layout in candidates.layouts(dims, sizes, allowed, conflicts):
      assignment = {d: self._mesh_names[a] for a, ds in enumerate(layout) for d in ds}
      rules = candidates.rules_string(layout, self._mesh_names)
      key = (self._peak.peak_bytes(self._mesh_sizes, assignment), -len(assignment),
             rules)
      if best is None or key < best[0]:
        best = (key, assignment)
    if best is None:
      raise SolverError("no legal layout of the graph on mesh %s"
                        % self._estimator.mesh_shape)
    (peak, _, rules), assignment = best
    if print_solution:
      pairs = [(d, m) for d in dims for m in self._mesh_names
               if self._validator.is_valid_assignment(d, m)]
      print_cp_model_solution.print_solution(
          SearchModel(pairs), SearchSolver(assignment.items(), peak))
    return rules
