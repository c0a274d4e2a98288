"""The steps of a communication plan, and the plan of one op.

A step acts on one laid-out value of a known mtf shape whose split dims are a map
{dim name: mesh axis} (the *split state*). Each step knows how it changes the split state
and which CollectiveRecord it costs, so bytes follow from shapes alone.
"""
import collections

from mesh_tf.shapes.shape import list_product

CollectiveRecord = collections.namedtuple(
    "CollectiveRecord", ["kind", "mesh_axes", "group_size", "slice_bytes", "op"],
    defaults=[None])
CollectiveRecord.__doc__ = """One collective: kind, mesh axes, processors per group, bytes
of each processor's input slice, and the name of the mtf op whose lowering emitted it."""


def local_shape(layout, shape, split):
  """Per-processor shape (list of ints) of `shape` in split state `split`."""
  return [d.size if split.get(d.name) is None else d.size // layout.axis_size(
      split[d.name]) for d in shape.dims]


class _Step(object):
  """What the steps share: kind, mesh axes, the split state after, the record."""
  kind = None

  @property
  def axes(self):
    return [self.mesh_axis]

  def after(self, split):
    """The split state after this step (default: unchanged)."""
    return split

  def record(self, layout, shape, split, itemsize, op=None):
    """The CollectiveRecord of this step on a value in split state `split`."""
    n = itemsize * list_product(local_shape(layout, shape, split))
    return CollectiveRecord(self.kind, tuple(self.axes), layout.axes_size(self.axes), n, op)


class Allconcat(_Step, collections.namedtuple("Allconcat", ["dim", "mesh_axis"])):
  """Makes split dim `dim` whole by concatenating the slices of its mesh_axis group."""
  kind = "allconcat"

  def after(self, split):
    return {d: a for d, a in split.items() if d != self.dim}


class Allsplit(_Step, collections.namedtuple("Allsplit", ["dim", "mesh_axis"])):
  """Cuts whole dim `dim` down to this processor's piece along mesh_axis (no traffic)."""
  kind = "allsplit"

  def after(self, split):
    return dict(split, **{self.dim: self.mesh_axis})

  def record(self, layout, shape, split, itemsize, op=None):
    return None


class Alltoall(_Step, collections.namedtuple("Alltoall", ["mesh_axis", "split_dim",
                                                          "concat_dim"])):
  """Moves mesh_axis from concat_dim (made whole) to split_dim (cut): one all-to-all."""
  kind = "alltoall"

  def after(self, split):
    out = {d: a for d, a in split.items() if d != self.concat_dim}
    out[self.split_dim] = self.mesh_axis
    return out


class Allreduce(_Step, collections.namedtuple("Allreduce", ["mesh_axes", "reduction",
                                                            "owed"], defaults=[False])):
  """Reduces ("SUM", "MAX", "MIN") over mesh_axes. When `owed`, the value keeps owing
  the SUM until first read (partial sums added by add_n first are reduced once)."""
  kind = "allreduce"

  @property
  def axes(self):
    return list(self.mesh_axes)


class ReduceScatter(_Step, collections.namedtuple("ReduceScatter", ["dim",
                                                                    "mesh_axis"])):
  """SUMs partial sums over mesh_axis, leaving each processor its piece of whole dim
  `dim` (the first half of an allreduce)."""
  kind = "reducescatter"

  def after(self, split):
    return dict(split, **{self.dim: self.mesh_axis})


class Receive(_Step, collections.namedtuple("Receive", ["mesh_axis", "sources"])):
  """Each processor takes the slice of processor sources[own coordinate] on mesh_axis
  (None: zeros), as a new value."""
  kind = "receive"


Operand = collections.namedtuple("Operand", ["input", "steps"])
Operand.__doc__ = """What the local computation reads: op.inputs[input] after `steps`."""

Middle = collections.namedtuple("Middle", ["shape", "split", "steps", "itemsize"])
Middle.__doc__ = """Steps on a value between two local stages of an op (e.g. top_k's
candidates): its mtf shape, its split state {dim name: mesh axis}, and bytes per element."""


def output_start(layout, shape, out_steps):
  """Split state of a local result before its output steps: the layout's, less the dims
  its Allsplit and ReduceScatter steps cut."""
  cut = {s.dim for s in out_steps if isinstance(s, (Allsplit, ReduceScatter))}
  return {d: a for d, a in layout.split_axes(shape).items() if d not in cut}


def run_records(layout, shape, steps, itemsize, op=None, split=None):
  """(records of the steps other than an owed allreduce, the owed record or None), for a
  value starting in split state `split` (default: its layout)."""
  split = layout.split_axes(shape) if split is None else split
  records, owed = [], None
  for step in steps:
    r = step.record(layout, shape, split, itemsize, op)
    if r is not None and getattr(step, "owed", False):
      owed = r
    elif r is not None:
      records.append(r)
    split = step.after(split)
  return records, owed


class OpPlan(collections.namedtuple("OpPlan", ["operands", "outputs", "flops",
                                               "reads_partial_sums", "middle"],
                                    defaults=[0.0, False, ()])):
  """The plan of one op.

  Attributes:
    operands: Operands, in the order the local computation takes them.
    outputs: per output, the steps run on the local result (Allsplit, Allreduce).
    flops: FLOPs each processor's local computation does (cost model estimate).
    reads_partial_sums: the operands are the inputs' partial sums still owing their
      allreduce (add_n of such sums), not the reduced values.
    middle: Middles, run (in order) between the local stages of the op.
  """

  def records(self, layout, input_shapes, output_shapes, input_itemsizes,
              output_itemsizes, op=None):
    """(CollectiveRecords this plan emits, [owed record or None per output])."""
    records = []
    for o in self.operands:
      records += run_records(layout, input_shapes[o.input], o.steps,
                             input_itemsizes[o.input], op)[0]
    for m in self.middle:
      records += run_records(layout, m.shape, m.steps, m.itemsize, op, split=m.split)[0]
    owed = []
    for shape, itemsize, out_steps in zip(output_shapes, output_itemsizes, self.outputs):
      done, pending = run_records(layout, shape, out_steps, itemsize, op,
                                  split=output_start(layout, shape, out_steps))
      records += done
      owed.append(pending)
    return records, owed
