"""The explanation of an automatic layout choice: `AutoLayoutReport`; str() prints it."""
import collections

from mesh_tf.analysis import communication
from mesh_tf.shapes import convert_to_shape


def _ms(seconds):
  return "%.3f ms" % (1e3 * seconds)


def _mib(nbytes):
  """Bytes in the largest binary unit that keeps the number >= 1 (e.g. 6.2 GiB)."""
  for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
    if nbytes >= 1 << shift:
      return "%.1f %s" % (nbytes / float(1 << shift), unit)
  return "%d B" % nbytes


def why_lost(chosen, other, objective):
  """One line saying why `other` lost to `chosen`."""
  if objective == "memory":
    return "peak memory %s vs %s" % (_mib(other.peak_memory), _mib(chosen.peak_memory))
  if not other.fits:
    return "peak memory %s exceeds the cap" % _mib(other.peak_memory)
  a, b = chosen.prediction, other.prediction
  if b.step_time == a.step_time:
    return "same predicted step time; ranked after it by peak memory, then rules"
  parts = []
  if b.comm_time != a.comm_time:
    parts.append("communication %+.3f ms (%+.0f bytes sent, %+d collectives)"
                 % (1e3 * (b.comm_time - a.comm_time), b.comm_bytes - a.comm_bytes,
                    b.num_collectives - a.num_collectives))
  if b.compute_time != a.compute_time:
    parts.append("compute %+.3f ms" % (1e3 * (b.compute_time - a.compute_time)))
  return "%+.1f%% step time: %s" % (100.0 * (b.step_time / a.step_time - 1),
                                     ", ".join(parts))


class AutoLayoutReport(collections.namedtuple("AutoLayoutReport", [
    "mesh_shape", "layout_rules", "profile", "memory_cap", "objective", "chosen",
    "runner_ups", "candidates", "num_mesh_shapes", "search_seconds", "cost",
    "layout_report"])):
  """What choose_layout chose and why; str() prints it.

  Fields: mesh_shape and layout_rules (strings); profile (HardwareProfile); memory_cap
  (bytes); objective; chosen (search.Candidate); runner_ups [(Candidate, reason)];
  candidates (every Candidate, best first); num_mesh_shapes; search_seconds; cost (the
  cost model's CostEstimate of the choice); layout_report (analysis.LayoutReport).
  """

  def summary_lines(self):
    """The choice, its predicted costs, and its bytes per collective."""
    p = self.chosen.prediction
    lines = [
        "Chosen: mesh %s, rules %s" % (self.mesh_shape or "[]", self.layout_rules or
                                       "(none)"),
        "  objective %s, profile %s, memory cap %s per device" % (
            self.objective, self.profile.name, _mib(self.memory_cap)),
        "  predicted step %s = compute %s + communication %s (%d collectives)" % (
            _ms(p.step_time), _ms(p.compute_time), _ms(p.comm_time),
            p.num_collectives),
        "  bytes sent per device %.0f; peak memory %s (weights %s, optimizer %s)" % (
            p.comm_bytes, _mib(self.chosen.peak_memory), _mib(p.variable_bytes),
            _mib(p.optimizer_bytes)),
        "  searched %d layouts of %d mesh shapes in %.2f s" % (
            len(self.candidates), self.num_mesh_shapes, self.search_seconds)]
    summary = communication.summarize(self.cost.comm_records,
                                      convert_to_shape(self.mesh_shape))
    if summary:
      lines.append("Bytes sent per device, by collective and mesh dims:")
      for (kind, axes), b in summary.items():
        lines.append("  %s over %s: %.0f" % (kind, axes, b))
    return lines

  def __str__(self):
    lines = self.summary_lines()
    lines.append("Runner-ups:")
    for c, reason in self.runner_ups:
      timed = "not timed"
      if c.prediction:
        timed = "step %s, %.0f bytes" % (_ms(c.prediction.step_time),
                                         c.prediction.comm_bytes)
      lines.append("  mesh %s, rules %s: %s, peak %s -- %s" % (
          c.mesh_shape or "[]", c.layout_rules or "(none)", timed, _mib(c.peak_memory),
          reason))
    if not self.runner_ups:
      lines.append("  none")
    lines.append("Layout report of the choice (str(report.layout_report) lists every "
                 "tensor):")
    lines += ["  " + l for l in self.rule_lines()]
    return "\n".join(lines)

  def rule_lines(self):
    """Which rule split how many tensors; unused rules, conflicts and warnings."""
    fired = collections.OrderedDict()
    for t in self.layout_report.tensors:
      for _, _, rule in t.splits:
        fired.setdefault(rule, []).append(t.name)
    lines = ["rule %s split %d tensors (e.g. %s)" % (r, len(ts), ", ".join(ts[:3]))
             for r, ts in fired.items()]
    lr = self.layout_report
    lines.append("rules that split no tensor: %s" % (", ".join(lr.unused_rules) or "none"))
    lines += ["conflict: %s" % c for c in lr.conflicts]
    lines += ["warning: %s" % w for w in lr.warnings]
    return lines
