"""Joint search of mesh shape and layout rules for the least predicted step time.

`choose_layout(graph, outputs, 8 or "rows:2;cols:4", profile=..., memory_cap=...)`
enumerates the mesh shapes of a device count (1 to `max_mesh_dims` dims, named mesh_0,
mesh_1, ...) or takes the one given, and every legal layout of each; scores each by the
predicted step time of the hardware profile (step_time.StepTimeModel) and its scheduled
peak memory per device; and returns the fastest layout whose memory fits the cap, with
a report explaining the choice. The search is exhaustive, so its answer is the optimum
of the model; mesh dims of equal size (and, for profiles whose links are all alike,
mesh dim orders) are visited once, and a layout over the memory cap is not timed. A
pipeline's stages dim is split only over a mesh dim of its size, and always where the
mesh has one.
"""
import collections
import numbers
import time

import gin

from mesh_tf import analysis
from mesh_tf.auto_mtf import candidates
from mesh_tf.auto_mtf import hardware
from mesh_tf.auto_mtf import layout_optimizer
from mesh_tf.auto_mtf import memory_estimator as me
from mesh_tf.auto_mtf import report as report_lib
from mesh_tf.auto_mtf import step_time
from mesh_tf.auto_mtf import valid_layouts
from mesh_tf.errors import MtfError
from mesh_tf.shapes import (LayoutRules, MeshLayout, convert_to_layout_rules,
                            convert_to_shape)

OBJECTIVES = ("step_time", "memory")

Candidate = collections.namedtuple("Candidate", [
    "mesh_shape", "layout_rules", "prediction", "peak_memory", "fits"])
Candidate.__doc__ = ("One searched layout: mesh shape and rules strings, its "
                     "step_time.Prediction (None when its memory did not fit and it was "
                     "not timed), peak bytes per device, and whether they fit.")


class LayoutSearch(object):
  """Scores (mesh shape, layout rules) pairs of one graph; reused across searches.

  outputs: tensors/ops one step computes (loss and update ops for training); profile: a
  HardwareProfile or its name; scheduler_alg: scheduler for the peak-memory estimate.
  """

  def __init__(self, graph, outputs, profile="tpu_v2", scheduler_alg="LIST"):
    self.graph = graph
    self.outputs = list(outputs or ())
    self.profile = hardware.hardware_profile(profile)
    estimator = me.MemoryEstimator(graph, "", self.outputs)
    self.operations = estimator.get_graph_interface().operations
    self._peak = me.estimator_peak_model(estimator, scheduler_alg)
    self._conflicts = candidates.conflicting_pairs(self.operations)
    self._steps = step_time.StepTimeModel(graph, self.outputs, self.profile)

  def score(self, mesh_shape, layout_rules, memory_cap=None):
    """Candidate for a mesh shape and rules (legal ones; see step_time.evaluate)."""
    mesh_shape = convert_to_shape(mesh_shape)
    rules = convert_to_layout_rules(layout_rules)
    sizes = {m.name: m.size for m in mesh_shape.dims}
    assignment = {}
    for d, m in rules:
      if m in sizes and d not in assignment:
        assignment[d] = m
    pred = self._steps.evaluate(mesh_shape, rules)
    peak = self._peak.peak_bytes(sizes, assignment)
    cap = self.profile.memory_bytes if memory_cap is None else memory_cap
    return Candidate(mesh_shape.to_string, str(rules), pred, peak, peak <= cap)

  def layouts_of(self, mesh_shape, symmetric):
    """Legal layouts (tuples of dim-name tuples, one per mesh dim) of a mesh Shape."""
    validator = valid_layouts.LayoutValidator(self.operations, mesh_shape)
    names = mesh_shape.dimension_names

    def allowed(dim, axis):
      return validator.is_valid_assignment(dim, names[axis])
    found = candidates.layouts(sorted(validator.splittable_mtf_dimension_names),
                               mesh_shape.to_integer_list, allowed, self._conflicts,
                               symmetric)
    # A pipeline's stages stay split where the mesh has a dim of their size: whole,
    # every processor would run every stage, the bubble included.
    stages = [d for d, s in validator.pipeline_stage_dims.items()
              if s in mesh_shape.to_integer_list
              and d in validator.splittable_mtf_dimension_names]
    if not stages:
      return found
    return (layout for layout in found
            if all(any(d in dims for dims in layout) for d in stages))

  def search_mesh(self, mesh_shape, memory_cap, symmetric, prune=True):
    """Candidates of every legal layout of one mesh Shape.

    With prune, a layout whose peak memory exceeds memory_cap is not timed (its
    prediction is None): it cannot be chosen.
    """
    names = mesh_shape.dimension_names
    sizes = mesh_shape.to_integer_list
    size_of = dict(zip(names, sizes))
    out = []
    for layout in self.layouts_of(mesh_shape, symmetric):
      axis_of = {d: a for a, ds in enumerate(layout) for d in ds}
      rules = LayoutRules([(d, names[a]) for a, ds in enumerate(layout) for d in ds])
      peak = self._peak.peak_bytes(size_of, {d: names[a] for d, a in axis_of.items()})
      pred = None
      if peak <= memory_cap or not prune:
        pred = self._steps.evaluate_assignment(mesh_shape, axis_of, rules)
      out.append(Candidate(mesh_shape.to_string, candidates.rules_string(layout, names),
                           pred, peak, peak <= memory_cap))
    return out


def _key(objective, c):
  splits = len(c.layout_rules.split(";")) if c.layout_rules else 0
  if objective == "memory":
    return (c.peak_memory, -splits, c.mesh_shape, c.layout_rules)
  time_ = c.prediction.step_time if c.prediction else float("inf")
  return (not c.fits, time_, c.peak_memory, -splits, c.mesh_shape, c.layout_rules)


def _mesh_shapes(num_devices_or_mesh_shape, max_mesh_dims, profile):
  """mtf Shapes to search, and whether equal-size mesh dims are interchangeable."""
  if isinstance(num_devices_or_mesh_shape, numbers.Integral):
    sized = candidates.mesh_shapes(int(num_devices_or_mesh_shape), max_mesh_dims,
                                   ordered=not profile.is_axis_uniform)
    return ([convert_to_shape(candidates.mesh_string(
        s, candidates.mesh_dim_names(len(s)))) for s in sized], profile.is_axis_uniform)
  return [convert_to_shape(num_devices_or_mesh_shape)], profile.is_axis_uniform


@gin.configurable(module="auto_mtf", denylist=["graph", "outputs"])
def choose_layout(graph, outputs, num_devices_or_mesh_shape, profile="tpu_v2",
                  memory_cap=None, objective="step_time", max_mesh_dims=3,
                  num_runner_ups=5, scheduler_alg="LIST"):
  """Chooses a mesh shape and layout rules for a graph (see module docstring).

  Args:
    graph: the mtf Graph.
    outputs: the tensors/ops one step computes, e.g. [loss] + update_ops.
    num_devices_or_mesh_shape: a device count (mesh shapes are searched) or a mesh
      shape (only rules are searched).
    profile: a HardwareProfile or the name of one (hardware.PROFILES).
    memory_cap: bytes per device a layout may hold at its peak (default: the
      profile's memory).
    objective: "step_time" (fastest layout that fits) or "memory" (least peak memory,
      the original auto_mtf's objective; returned even over the cap, see
      report.chosen.fits).
    max_mesh_dims: most mesh dims of a searched mesh shape.
    num_runner_ups: how many runner-up layouts the report explains.
    scheduler_alg: scheduler for the peak-memory estimate ("LIST" or "NAIVE").

  Returns:
    (mesh Shape, LayoutRules, report.AutoLayoutReport).

  Raises:
    layout_optimizer.SolverError when no layout fits memory_cap (naming the least
    memory found), MtfError for an unknown objective or profile.
  """
  if objective not in OBJECTIVES:
    raise MtfError("unknown objective %r; use one of %s" % (objective, OBJECTIVES))
  start = time.perf_counter()
  search = LayoutSearch(graph, outputs, profile, scheduler_alg)
  cap = search.profile.memory_bytes if memory_cap is None else memory_cap
  shapes, symmetric = _mesh_shapes(num_devices_or_mesh_shape, max_mesh_dims,
                                   search.profile)
  found = []
  for shape in shapes:
    found += search.search_mesh(shape, cap, symmetric, prune=objective == "step_time")
  found.sort(key=lambda c: _key(objective, c))
  if not found or (objective == "step_time" and not found[0].fits):
    least = min(found, key=lambda c: c.peak_memory) if found else None
    raise layout_optimizer.SolverError(
        "no layout of the graph fits %d bytes per device on %s; the least memory is "
        "%s bytes (mesh %s, rules %s) -- raise memory_cap or use more devices"
        % (cap, num_devices_or_mesh_shape, least and least.peak_memory,
           least and least.mesh_shape, least and least.layout_rules))
  chosen = found[0]
  seconds = time.perf_counter() - start
  layout = MeshLayout(chosen.mesh_shape, chosen.layout_rules)
  cost = analysis.estimate_cost(graph, layout.shape, layout.layout_rules,
                                fetches=search.outputs or None)
  report = report_lib.AutoLayoutReport(
      mesh_shape=chosen.mesh_shape, layout_rules=chosen.layout_rules,
      profile=search.profile, memory_cap=cap, objective=objective, chosen=chosen,
      runner_ups=[(c, report_lib.why_lost(chosen, c, objective))
                  for c in found[1:1 + num_runner_ups]],
      candidates=found, num_mesh_shapes=len(shapes), search_seconds=seconds,
      cost=cost, layout_report=analysis.layout_report(graph, layout))
  return layout.shape, layout.layout_rules, report
