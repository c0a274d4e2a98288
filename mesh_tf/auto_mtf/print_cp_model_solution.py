"""Prints the variables of a solved layout model, for debugging a layout search.

Works with the layout program of a `layout_optimizer.LayoutOptimizer` (its `_model`)
and with an OR-tools CP-SAT `CpModel` solved by a `CpSolver` (read through their
protos), so code written for the original keeps working if it builds its own model.
"""


def _values(model, solver):
  """[(variable name, value)] of a solved model."""
  if hasattr(model, "variables"):
    return [(name, solver.Value(var)) for name, var in model.variables()]
  proto = model.Proto()
  solution = solver.ResponseProto().solution
  return [(v.name or "var_%d" % i, solution[i]) for i, v in enumerate(proto.variables)]


def print_solution(model, solver):
  """Prints the objective value, then each variable that is not zero as `name = value`.

  Args:
    model: a LayoutOptimizer's program (its `_model`) or an OR-tools CpModel.
    solver: the matching solution (what LayoutOptimizer.solve found, or an OR-tools
      CpSolver after Solve).
  """
  print("Objective value: %s" % solver.ObjectiveValue())
  values = _values(model, solver)
  shown = [(n, v) for n, v in values if v]
  print("Non-zero variables (%d of %d):" % (len(shown), len(values)))
  for name, value in shown:
    print("  %s = %s" % (name, value))
