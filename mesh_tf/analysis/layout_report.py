"""Layout report: how the layout rules applied to every tensor of a graph.

It lists which rule split which dimension of each tensor; rules that never matched (or
name a mesh dimension the mesh lacks); rules that could not apply (an illegal layout:
lowering raises there); and warnings about einsums that repeat heavy compute on every
processor of an unused mesh dimension, or that force a large allconcat.
"""
import collections

from mesh_tf.analysis import communication
from mesh_tf.analysis import cost_model
from mesh_tf.errors import LayoutError
from mesh_tf.ops.einsum import EinsumOperation
from mesh_tf.shapes import MeshLayout

TensorEntry = collections.namedtuple("TensorEntry", ["name", "shape", "splits"])
TensorEntry.__doc__ = "A tensor and its splits: a list of (dim name, mesh dim, rule)."


class LayoutReport(collections.namedtuple("LayoutReport", [
    "tensors", "unused_rules", "conflicts", "warnings"])):
  """Result of layout_report(); str() gives the printable report."""

  def __str__(self):
    lines = ["Tensors (%d):" % len(self.tensors)]
    for t in self.tensors:
      splits = ", ".join("%s over %s (rule %s)" % s for s in t.splits) or "replicated"
      lines.append("  %s %s: %s" % (t.name, t.shape, splits))
    lines.append("Rules that split no tensor: %s" % (", ".join(self.unused_rules) or "none"))
    lines.append("Rules that could not apply (mesh dim taken, or size not divisible): %s"
                 % ("" if self.conflicts else "none"))
    lines += ["  " + c for c in self.conflicts]
    lines.append("Warnings: %s" % ("" if self.warnings else "none"))
    lines += ["  " + w for w in self.warnings]
    return "\n".join(lines)


def _tensor_splits(tensor, layout, conflicts):
  """The (dim, mesh dim, rule) splits of one tensor, first rule winning a mesh dim
  (unlike layout.tensor_layout, which raises at the first conflict)."""
  taken = {}
  splits = []
  pairs = set(layout.layout_rules)
  for d in tensor.shape.dims:
    split_over = None
    for m in layout.shape.dims:
      if (d.name, m.name) not in pairs:
        continue
      rule = "%s:%s" % (d.name, m.name)
      if split_over is not None:
        conflicts.append("%s: rule %s skipped, %s is already split over %s"
                         % (tensor.name, rule, d.name, split_over))
      elif m.name in taken:
        conflicts.append("%s: rule %s skipped, mesh dim %s already splits %s"
                         % (tensor.name, rule, m.name, taken[m.name]))
      elif d.size % m.size:
        conflicts.append("%s: rule %s cannot apply, %d does not divide %s=%d"
                         % (tensor.name, rule, m.size, d.name, d.size))
      else:
        taken[m.name] = d.name
        split_over = m.name
        splits.append((d.name, m.name, rule))
  return splits


def _einsum_warnings(layout, op, total_flops, heavy_fraction):
  """Replicated-compute warning for one einsum, or None."""
  union = set()
  for x in op.inputs:
    union.update(a for a in layout.tensor_layout(x.shape) if a is not None)
  idle = [layout.shape[a] for a in range(layout.ndims)
          if a not in union and layout.shape[a].size > 1]
  if not idle:
    return None
  flops = cost_model.plan_cost(layout, op)[2]
  if total_flops and flops >= heavy_fraction * total_flops:
    return ("einsum %s (%.1f%% of einsum FLOPs) is computed identically on every "
            "processor of mesh dims %s: no dim of its inputs is split over them"
            % (op.name, 100.0 * flops / total_flops, [m.name for m in idle]))
  return None


def layout_report(graph, mesh_shape, layout_rules=None, heavy_fraction=0.1,
                  large_allconcat_bytes=1 << 20):
  """Builds a LayoutReport (see module docstring). Never raises for a bad layout.

  Args:
    graph: the mtf Graph.
    mesh_shape: mesh shape (or a MeshLayout, with layout_rules None).
    layout_rules: layout rules.
    heavy_fraction: warn about an einsum replicated over a mesh dim when it has at least
      this fraction of all einsum FLOPs.
    large_allconcat_bytes: warn about an allconcat sending at least this many bytes per
      processor.
  """
  layout = (mesh_shape if isinstance(mesh_shape, MeshLayout)
            else MeshLayout(mesh_shape, layout_rules))
  mesh_names = set(layout.shape.dimension_names)
  conflicts, tensors, used = [], [], set()
  for op in graph.operations:
    for t in op.outputs:
      splits = _tensor_splits(t, layout, conflicts)
      used.update(rule for _, _, rule in splits)
      tensors.append(TensorEntry(t.name, t.shape, splits))
  unused = []
  for d, m in layout.layout_rules:
    rule = "%s:%s" % (d, m)
    if m not in mesh_names:
      unused.append("%s (mesh has no dim %s)" % (rule, m))
    elif rule not in used:
      unused.append(rule)
  warnings = []
  if not conflicts:
    warnings = _warnings(graph, layout, heavy_fraction, large_allconcat_bytes)
  return LayoutReport(tensors, unused, conflicts, warnings)


def _warnings(graph, layout, heavy_fraction, large_allconcat_bytes):
  try:
    cost = cost_model.estimate_cost(graph, layout.shape, layout.layout_rules)
  except LayoutError as e:
    return ["layout is illegal: %s" % e]
  einsums = [op for op in graph.operations if isinstance(op, EinsumOperation)]
  total = sum(cost_model.plan_cost(layout, op)[2] for op in einsums)
  warnings = [w for w in (_einsum_warnings(layout, op, total, heavy_fraction)
                          for op in einsums) if w]
  for r in cost.comm_records:
    b = communication.bytes_sent_per_processor(r)
    if r.kind == "allconcat" and b >= large_allconcat_bytes:
      warnings.append("%s forces an allconcat over mesh dim %s: %.0f bytes/processor"
                      % (r.op, ",".join(layout.shape[a].name for a in r.mesh_axes), b))
  return warnings

