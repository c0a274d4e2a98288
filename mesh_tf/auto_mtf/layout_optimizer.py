"""Layout rules of least peak memory per device, the original's objective and model.

The model is the original's integer program, kept as named variables so that it can be
inspected and printed like the original's (`optimizer._model.Proto().variables`): a
boolean "x_(dim:mesh_dim)" per splittable mtf dim and mesh dim; a boolean "y_(...)" per
set of splittable dims seen together in an operation or tensor and per assignment of
that set; "z", the peak bytes per device. The objective is (number of splittable dims +
1) * z - (number of split dims): least peak memory first, then most split dims.

The original handed this program to OR-tools' CP-SAT. Here it is solved exactly by
enumerating the global assignments that meet the constraints; the optimum is the same,
but of several optimal layouts this port returns the one whose rules string sorts first.
"""
import itertools

import numpy as np

from mesh_tf.auto_mtf import print_cp_model_solution
from mesh_tf.auto_mtf import scheduler
from mesh_tf.errors import MtfError
from mesh_tf.shapes import convert_to_layout_rules


class SolverError(MtfError):
  """The layout program has no solution."""


def _global_var_name(splittable_dimension, mesh_dimension):
  """Name of the boolean that splits an mtf dim over a mesh dim: "x_(dim:mesh_dim)"."""
  return "x_(%s:%s)" % (splittable_dimension, mesh_dimension)


def _local_var_name(splittable_dimensions, assignment):
  """Name of the boolean of one assignment of a set of mtf dims, e.g.
  "y_(channel:y,hidden)": the dims sorted, with the mesh dim of those assigned one."""
  parts = ["%s:%s" % (dim, assignment[dim]) if dim in assignment else dim
           for dim in sorted(splittable_dimensions)]
  return "y_(%s)" % ",".join(parts)


def _generate_assignments(splittable_dimensions, mesh_dimension_to_size):
  """Every way to split some of the dims over distinct mesh dims (of mesh_dimension_to_size's
  names): injective {mtf dim: mesh dim} dicts, by number of split dims, divisibility
  unchecked."""
  dims = list(splittable_dimensions)
  mesh_dims = list(mesh_dimension_to_size)
  return [dict(zip(chosen, targets))
          for k in range(min(len(dims), len(mesh_dims)) + 1)
          for chosen in itertools.combinations(dims, k)
          for targets in itertools.permutations(mesh_dims, k)]


class _Variable(object):
  """A named variable of the layout program (the `name` of a CP-SAT variable proto)."""

  def __init__(self, name, lower, upper):
    self.name = name
    self.domain = [lower, upper]

  def __repr__(self):
    return self.name


class _ModelProto(object):
  """What Proto() of the layout program exposes: its variables, in creation order."""

  def __init__(self, variables):
    self.variables = variables


class _LayoutModel(object):
  """The layout program: variables by name, and the constraints in words."""

  def __init__(self):
    self._variables = []
    self.constraints = []
    self.objective = None

  def NewBoolVar(self, name):  # pylint: disable=invalid-name
    return self._new(name, 0, 1)

  def NewIntVar(self, lower, upper, name):  # pylint: disable=invalid-name
    return self._new(name, lower, upper)

  def _new(self, name, lower, upper):
    var = _Variable(name, lower, upper)
    self._variables.append(var)
    return var

  def Proto(self):  # pylint: disable=invalid-name
    return _ModelProto(list(self._variables))

  def variables(self):
    """[(name, variable)], for print_cp_model_solution."""
    return [(v.name, v) for v in self._variables]


class _LayoutSolution(object):
  """The program's values in the chosen layout (a CpSolver's Value, ObjectiveValue)."""

  def __init__(self, values, objective):
    self._values = values
    self._objective = objective

  def Value(self, variable):  # pylint: disable=invalid-name
    return self._values.get(variable.name, 0)

  def ObjectiveValue(self):  # pylint: disable=invalid-name
    return self._objective


class LayoutOptimizer(object):
  """Finds the layout rules of least peak memory for a MemoryEstimator's graph and mesh.

  Args:
    memory_estimator: a MemoryEstimator.
    scheduler_alg: "LIST" or "NAIVE" (see scheduler.minimize_peak_memory); the order of
      the operations that the memory at each step is measured under.
  """

  def __init__(self, memory_estimator, scheduler_alg="LIST"):
    self._estimator = memory_estimator
    self._scheduler_alg = scheduler_alg
    self._layout_validator = memory_estimator.get_layout_validator()
    self._graph = memory_estimator.get_graph_interface()
    self._memory_contents = None
    self._model = _LayoutModel()
    self._solution = None
    self._preprocess_input()
    self._initialize_variables()
    self._add_constraints()
    self._build_objective_function()

  # --- building the program -------------------------------------------------

  def _preprocess_input(self):
    """Splittable dim sets of operations and tensors, and their assignments."""
    splittable = self._layout_validator.splittable_mtf_dimension_names
    self._operation_name_to_mtf_dimension_set = {
        name: frozenset(self._graph.get_operation_mtf_dimension_names(name)) & splittable
        for name in self._graph.get_all_operation_names()}
    self._tensor_name_to_mtf_dimension_set = {
        name: frozenset(self._graph.get_tensor_mtf_dimension_names(name)) & splittable
        for name in self._graph.get_all_tensor_names()}
    self._operation_mtf_dimension_sets = set(
        self._operation_name_to_mtf_dimension_set.values())
    self._mtf_dimension_sets = self._operation_mtf_dimension_sets | set(
        self._tensor_name_to_mtf_dimension_set.values())
    mesh_sizes = self._layout_validator.mesh_dimension_name_to_size
    self._assignments = {s: _generate_assignments(s, mesh_sizes)
                         for s in self._mtf_dimension_sets}

  def _initialize_variables(self):
    """The global, local and memory variables."""
    mesh_sizes = self._layout_validator.mesh_dimension_name_to_size
    self._global_vars = {
        (dim, mesh_dim): self._model.NewBoolVar(_global_var_name(dim, mesh_dim))
        for dim in self._layout_validator.splittable_mtf_dimension_names
        for mesh_dim in mesh_sizes}
    self._local_vars = {}
    for dim_set in self._mtf_dimension_sets:
      self._local_vars[dim_set] = {}
      for assignment in self._assignments[dim_set]:
        name = _local_var_name(dim_set, assignment)
        self._local_vars[dim_set][name] = self._model.NewBoolVar(name)
    upper = sum(int(self._graph.get_tensor_size(t))
                for t in self._graph.get_all_tensor_names()
                if self._graph.is_tensor_on_canonical_device(t))
    self._memory_var = self._model.NewIntVar(0, upper, "z")

  def _add_constraints(self):
    """Records the constraints (the solver below enforces them)."""
    c = self._model.constraints
    c.append("each splittable dim is split over at most one mesh dim")
    c.append("a dim is split only over a mesh dim the layout validator allows")
    c.append("the dims of one operation are split over distinct mesh dims")
    c.append("exactly one local assignment per dim set, the one the global "
             "variables agree with")
    c.append("z >= the bytes per device held at each step of the schedule")
    # Pairs of dims that meet in some operation, for the solver.
    self._conflicts = {pair for dim_set in self._operation_mtf_dimension_sets
                       for pair in itertools.combinations(sorted(dim_set), 2)}

  def _build_objective_function(self):
    """Minimize (number of splittable dims + 1) * z - (number of split dims)."""
    self._objective_scale = (
        len(self._layout_validator.splittable_mtf_dimension_names) + 1)
    self._model.objective = "minimize %d * z - sum(x)" % self._objective_scale

  def _get_memory_contents(self):
    """For each step of the schedule, the frozenset of the tensor names held."""
    if self._memory_contents is None:
      schedule = scheduler.minimize_peak_memory(self._graph, self._scheduler_alg)
      self._memory_contents = self._graph.compute_memory_contents_under_schedule(
          schedule)
    return self._memory_contents

  # --- memory under a layout ------------------------------------------------

  def _memory_table(self):
    """(held[step, column] tensor counts, a tensor name per column standing for its shape)."""
    if getattr(self, "_table", None) is None:
      contents = self._get_memory_contents()
      columns = {}
      key_of = {}
      for name in self._graph.get_all_tensor_names():
        if not self._graph.is_tensor_on_canonical_device(name):
          continue
        key = (tuple(self._graph.get_tensor_shape(name).as_list()),
               tuple(self._graph.get_tensor_mtf_dimension_names(name)),
               self._graph.get_tensor_dtype(name).size)
        key_of[name] = columns.setdefault(key, len(columns))
      representative = {}
      for name, col in key_of.items():
        representative.setdefault(col, name)
      held = np.zeros((max(len(contents), 1), max(len(columns), 1)), dtype=np.int64)
      for step, names in enumerate(contents):
        for name in names:
          if name in key_of:
            held[step, key_of[name]] += 1
      self._table = (held, [representative[i] for i in range(len(columns))])
    return self._table

  def _peak_bytes(self, layout_dict):
    """Peak bytes per device with the dims of layout_dict split as it says."""
    held, names = self._memory_table()
    if not names:
      return 0
    mesh_sizes = self._layout_validator.mesh_dimension_name_to_size
    sizes = np.array([self._graph.get_tensor_size(n, layout_dict, mesh_sizes)
                      for n in names], dtype=np.int64)
    return int(np.max(held @ sizes))

  # --- solving ----------------------------------------------------------------

  def _feasible_layouts(self):
    """Every global assignment meeting the constraints, as {dim: mesh dim} dicts."""
    dims = sorted(self._layout_validator.splittable_mtf_dimension_names)
    mesh_dims = list(self._layout_validator.mesh_dimension_name_to_size)
    options = [[m for m in mesh_dims
                if self._layout_validator.is_valid_assignment(d, m)] for d in dims]
    partners = {d: set() for d in dims}
    for a, b in self._conflicts:
      partners[a].add(b)
      partners[b].add(a)
    current = {}

    def extend(i):
      if i == len(dims):
        yield dict(current)
        return
      dim = dims[i]
      yield from extend(i + 1)
      for mesh_dim in options[i]:
        if any(current.get(p) == mesh_dim for p in partners[dim]):
          continue
        current[dim] = mesh_dim
        yield from extend(i + 1)
        del current[dim]
    return extend(0)

  def solve(self, print_solution=False):
    """The layout rules string ("dim:mesh_dim;...", sorted) of the optimum; with
    print_solution, prints the program's variables and objective. Raises SolverError
    when no layout meets the constraints."""
    best = None
    for layout in self._feasible_layouts():
      rules = ";".join(sorted("%s:%s" % p for p in layout.items()))
      peak = self._peak_bytes(layout)
      key = (self._objective_scale * peak - len(layout), rules)
      if best is None or key < best[0]:
        best = (key, layout, peak)
    if best is None:
      raise SolverError("no layout of the graph meets the constraints on mesh %s"
                        % self._estimator.mesh_shape)
    (objective, rules), layout, peak = best
    self._solution = _LayoutSolution(self._values_of(layout, peak), objective)
    if print_solution:
      print_cp_model_solution.print_solution(self._model, self._solution)
    return rules

  def _values_of(self, layout, peak):
    """{variable name: value} of the program's variables for a global layout."""
    values = {"z": peak}
    for (dim, mesh_dim), var in self._global_vars.items():
      values[var.name] = int(layout.get(dim) == mesh_dim)
    for dim_set in self._mtf_dimension_sets:
      chosen = {d: layout[d] for d in dim_set if d in layout}
      values[_local_var_name(dim_set, chosen)] = 1
    return values

  def evaluate_layout(self, layout):
    """Peak bytes per device under a layout (rules string or LayoutRules).

    Rules for dims that are not splittable are skipped, as are rules naming a mesh dim
    the mesh does not have. The layout is not otherwise checked.
    """
    splittable = self._layout_validator.splittable_mtf_dimension_names
    mesh_sizes = self._layout_validator.mesh_dimension_name_to_size
    layout_dict = {}
    for dim, mesh_dim in convert_to_layout_rules(layout or ""):
      if dim in splittable and mesh_dim in mesh_sizes:
        layout_dict.setdefault(dim, mesh_dim)
    return float(self._peak_bytes(layout_dict))
