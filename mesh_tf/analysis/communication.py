"""Bytes each processor sends for a collective, and summaries of a step's collectives.

The formulas are those of bandwidth-optimal ring algorithms, as in the paper's cost
analysis. For a group of n processors, each holding a slice of B bytes:

  allreduce   2 (n-1)/n B   (reduce-scatter, then all-gather, each (n-1)/n B)
  allconcat   (n-1) B       (every slice reaches the n-1 others)
  alltoall    (n-1)/n B     (keeps 1/n of its slice, sends the rest)
  receive     B             (one neighbour's slice; upper bound at unwrapped edges)
  reducescatter (n-1)/n B   (sums partial sums, keeping 1/n of the result)

Each processor receives as many bytes as it sends in all five, so one number is reported.
"""
import collections

_FACTORS = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "allconcat": lambda n: float(n - 1),
    "alltoall": lambda n: float(n - 1) / n,
    "receive": lambda n: 1.0,
    "reducescatter": lambda n: float(n - 1) / n,
}


def bytes_sent_per_processor(record):
  """Bytes each processor of the group sends for one CollectiveRecord."""
  if record.group_size <= 1:
    return 0.0
  return _FACTORS[record.kind](record.group_size) * record.slice_bytes


def total_bytes_per_processor(records):
  """Sum of bytes_sent_per_processor over records."""
  return sum(bytes_sent_per_processor(r) for r in records)


def _axes_names(record, mesh_shape):
  return ",".join(mesh_shape[a].name for a in record.mesh_axes)


def summarize(records, mesh_shape):
  """OrderedDict {(kind, "mesh,dims"): bytes sent per processor}, in first-seen order."""
  out = collections.OrderedDict()
  for r in records:
    key = (r.kind, _axes_names(r, mesh_shape))
    out[key] = out.get(key, 0.0) + bytes_sent_per_processor(r)
  return out


def format_report(records, mesh_shape):
  """Printable table of records: op, collective, mesh dims, bytes/processor; and totals."""
  rows = [("op", "collective", "mesh dims", "bytes/processor")]
  for r in records:
    rows.append((r.op or "?", r.kind, _axes_names(r, mesh_shape),
                 "%.0f" % bytes_sent_per_processor(r)))
  for (kind, axes), b in summarize(records, mesh_shape).items():
    rows.append(("TOTAL", kind, axes, "%.0f" % b))
  rows.append(("TOTAL", "all", "", "%.0f" % total_bytes_per_processor(records)))
  widths = [max(len(row[i]) for row in rows) for i in range(4)]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                   for row in rows)


def bytes_crossing_processes(records, mesh_shape, process_of_pnum):
  """{process: bytes its processors send to processors of other processes} for records.

  Each group is a ring in processor-coordinate order: allreduce, allconcat and receive
  send each processor's share to its successor, which may sit in another process;
  alltoall sends 1/n of the slice straight to each other member. process_of_pnum[p] is
  the process (task) holding processor p.
  """
  from mesh_tf.shapes import processor_groups  # pylint: disable=g-import-not-at-top
  from mesh_tf.shapes import convert_to_shape  # pylint: disable=g-import-not-at-top
  mesh_shape = convert_to_shape(mesh_shape)
  process_of_pnum = list(process_of_pnum)
  out = {p: 0.0 for p in sorted(set(process_of_pnum))}
  groups = {}
  for r in records:
    if r.group_size <= 1:
      continue
    if r.mesh_axes not in groups:
      groups[r.mesh_axes] = processor_groups(mesh_shape, list(r.mesh_axes))
    n = r.group_size
    for group in groups[r.mesh_axes]:
      for i, pnum in enumerate(group):
        here = process_of_pnum[pnum]
        if r.kind == "alltoall":
          away = sum(1 for q in group if process_of_pnum[q] != here)
          out[here] += away * r.slice_bytes / n
        elif process_of_pnum[group[(i + 1) % n]] != here:
          out[here] += bytes_sent_per_processor(r)
  return out
