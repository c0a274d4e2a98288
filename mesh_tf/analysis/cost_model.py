"""The paper's closed-form cost of an mtf graph under a mesh shape and layout rules.

Nothing is lowered: the cost is the sum of the ops' plans (mesh_tf/plans), the same plans
the lowering runs, so prediction and measurement cannot disagree; an op without a plan
sends nothing. A SUM allreduce a plan marks as owed is paid when the value is first
read, since add_n of partial sums owing the same allreduce adds them first and reduces
once (lowering/lazy_allreduce.py). Memory is an upper bound: every activation slice
counted as live at once.
"""
import collections

from mesh_tf.analysis import communication
from mesh_tf.ops import elementwise as elementwise_ops
from mesh_tf.ops import gather as gather_ops
from mesh_tf.ops.einsum import EinsumOperation
from mesh_tf.ops.reduce import ReduceOperation
from mesh_tf.ops.variables import Variable
from mesh_tf.shapes.mesh_layout import MeshLayout


class CostEstimate(collections.namedtuple("CostEstimate", [
    "flops_per_processor", "comm_records", "variable_bytes_per_processor",
    "optimizer_bytes_per_processor", "activation_bytes_per_processor",
    "unmodelled_ops"])):
  """Predicted per-processor cost of a graph on a mesh (see module docstring).

  unmodelled_ops is always empty (every op is costed by its plan); kept for callers."""

  @property
  def comm_bytes_per_processor(self):
    """Bytes each processor sends in one run of the graph."""
    return communication.total_bytes_per_processor(self.comm_records)


# Ops whose output may owe an allreduce, paid when first read (lazy_allreduce).
LAZY_ALLREDUCE_OPS = (EinsumOperation, gather_ops.GatherOperation,
                      gather_ops.GatherGradOperation, ReduceOperation)


def plan_cost(layout, op, owed_axes=None):
  """(CollectiveRecords an op's plan emits, [owed record or None per output], FLOPs).

  owed_axes: for add_n, the mesh axes of the SUM each input still owes (None: none).
  """
  if not hasattr(op, "plan"):
    return [], [None] * len(op.outputs), 0.0
  plan = op.plan(layout, owed_axes) if owed_axes is not None else op.plan(layout)
  records, owed = plan.records(
      layout, [x.shape for x in op.inputs], [y.shape for y in op.outputs],
      [x.dtype.size for x in op.inputs], [y.dtype.size for y in op.outputs], op.name)
  return records, owed, plan.flops


def operations_needed(graph, fetches):
  """The ops of graph (in graph order) that lowering `fetches` runs, as Lowering does."""
  needed = set()
  stack = [f.operation if hasattr(f, "operation") else f for f in fetches]
  while stack:
    o = stack.pop()
    if o in needed:
      continue
    needed.add(o)
    stack.extend(x.operation for x in o.inputs)
    stack.extend(getattr(o, "control_inputs", ()))
  return [o for o in graph.operations if o in needed]


def estimate_cost(graph, mesh_shape, layout_rules, fetches=None):
  """Predicts the per-processor cost of computing `fetches` (default: the whole graph).

  Args:
    graph: an mtf Graph (only its ops' shapes, dtypes and plans are read).
    mesh_shape: mesh shape (e.g. "rows:2;cols:4").
    layout_rules: layout rules (e.g. "batch:rows;d_ff:cols").
    fetches: optional mtf Tensors and Operations (e.g. the loss and the update ops of a
      train step); only the ops they need are counted, as a Lowering emits only those.

  Returns:
    a CostEstimate. Raises LayoutError (naming the tensor) for an illegal layout.
  """
  layout = MeshLayout(mesh_shape, layout_rules)
  records, flops = [], 0.0
  pending = {}  # tensor -> CollectiveRecord it still owes
  variable_bytes = optimizer_bytes = activation_bytes = 0
  ops = graph.operations if fetches is None else operations_needed(graph, fetches)
  for op in ops:
    for t in op.outputs:
      layout.tensor_layout(t.shape, tensor_name=t.name)
    if isinstance(op, Variable):
      nbytes = layout.slice_size(op.shape) * op.slice_dtype.size
      if op.trainable:
        variable_bytes += nbytes
      else:
        optimizer_bytes += nbytes
      continue
    activation_bytes += sum(layout.slice_size(t.shape) * t.dtype.size for t in op.outputs)
    owed_in = None
    if (isinstance(op, elementwise_ops.AddNOperation) or
        getattr(op, "reads_owed_sums", False)):
      owed_in = [pending[x].mesh_axes if x in pending else None for x in op.inputs]
    new, owed, f = plan_cost(layout, op, owed_in)
    flops += f
    # an op reading partial sums (add_n, a reduce-scattering reshape) leaves them owed
    reads_partial = owed_in is not None and op.plan(layout, owed_in).reads_partial_sums
    if not reads_partial:  # every input is read: owed ones are paid
      for x in op.inputs:
        if x in pending:
          records.append(pending.pop(x))
    records += new
    for y, r in zip(op.outputs, owed):
      if r is not None:
        pending[y] = r
  for f in fetches or ():
    if f in pending:  # exported: forced by export_to_tf_tensor
      records.append(pending.pop(f))
  return CostEstimate(flops, records, variable_bytes, optimizer_bytes, activation_bytes, [])
