"""The paper's closed-form cost of an mtf graph under a mesh shape and layout rules.

Nothing is lowered: shapes and layouts decide everything. For each op the model predicts
the collectives its lowering needs (as CollectiveRecords, so the per-collective byte
formulas of `communication` apply to prediction and measurement alike), the FLOPs each
processor computes, and the bytes each processor holds:

- einsum: a local einsum over the slices (2 x product of local dim sizes FLOPs), an
  allconcat per contracted dim that must be made whole (when one mesh dim would split two
  dims of the union), and an allreduce of the output slice over the mesh dims that split
  contracted dims -- owed until the output is read, since add_n of partial sums owing the
  same allreduce adds them first and reduces once (lowering/lazy_allreduce.py);
- reductions: the local reduction, then an allreduce of the result over the mesh dims of
  the reduced split dims;
- reshapes: an allconcat for each split dim whose split cannot be kept (reshape_plan);
- slicewise ops: an allconcat for each split dim the op cannot work on split;
- shifts along a split dim: one neighbour receive of the slice;
- gather: a local lookup, owing (deferred) an allreduce of the output slice over the mesh
  axis splitting the gathered dim; its gradient, a local segment sum owing one of the
  weights slice over the mesh axes splitting the indices;
- everything else (elementwise, broadcast, variables, assignment, import): no traffic.

Ops of any other class are listed in `unmodelled_ops` rather than guessed.
Memory is an upper bound: every activation slice counted as live at once.
"""
import collections

from mesh_tf.lowering.mesh_impl import CollectiveRecord, MeshImpl
from mesh_tf.analysis import communication
from mesh_tf.ops.einsum import EinsumOperation, contraction_plan
from mesh_tf.ops import gather as gather_ops
from mesh_tf.ops import elementwise as elementwise_ops
from mesh_tf.ops import reduce as reduce_ops
from mesh_tf.ops.reshape import ReshapeOperation, reshape_plan
from mesh_tf.ops.slicewise import SlicewiseOperation
from mesh_tf.ops import slicing as slicing_ops
from mesh_tf.shapes import list_product

_NO_TRAFFIC = ("BroadcastOperation", "Variable", "ReadVariable", "Assign", "Depend",
               "ImportOperation", "ImportLaidOutTensorOperation", "Constant",
               "RangeOperation", "OneHotOperation", "RandomOperation", "StopGradient",
               "PrintOperation")


class CostEstimate(collections.namedtuple("CostEstimate", [
    "flops_per_processor", "comm_records", "variable_bytes_per_processor",
    "optimizer_bytes_per_processor", "activation_bytes_per_processor",
    "unmodelled_ops"])):
  """Predicted per-processor cost of a graph on a mesh (see module docstring)."""

  @property
  def comm_bytes_per_processor(self):
    """Bytes each processor sends in one run of the graph."""
    return communication.total_bytes_per_processor(self.comm_records)


def _nbytes(impl, tensor):
  return impl.slice_size(tensor.shape) * tensor.dtype.size


def _gather_records(impl, shape, dtype, dim_names, op_name):
  """Records of gather_dims: one allconcat per split dim named, in shape order."""
  records = []
  sizes = impl.slice_shape(shape)
  for i, (d, a) in enumerate(zip(shape.dims, impl.tensor_layout(shape))):
    if d.name in dim_names and a is not None:
      records.append(CollectiveRecord("allconcat", (a,), impl.shape[a].size,
                                      list_product(sizes) * dtype.size, op_name))
      sizes[i] = d.size
  return records


def _einsum(impl, op):
  y = op.outputs[0]
  gather, reduced = contraction_plan(impl, [x.shape for x in op.inputs], y.shape)
  records = []
  for x in op.inputs:
    records += _gather_records(impl, x.shape, x.dtype, gather, op.name)
  local = {}
  for x in op.inputs:
    for d, a in zip(x.shape.dims, impl.tensor_layout(x.shape)):
      split = a is not None and d.name not in gather
      local[d.name] = d.size // impl.shape[a].size if split else d.size
  if reduced:  # deferred, as the lowering does (lazy_allreduce)
    axes = tuple(reduced)
    records.append(_Pending(y, CollectiveRecord(
        "allreduce", axes, list_product([impl.shape[a].size for a in axes]),
        _nbytes(impl, y), op.name)))
  return records, 2.0 * list_product(list(local.values()))


# An allreduce owed by tensor y, emitted when something other than add_n reads y.
_Pending = collections.namedtuple("_Pending", ["tensor", "record"])


def _add_n(impl, op, pending):
  """add_n of partial sums owing one allreduce stays owing one; else nothing new."""
  owed = [pending.get(x) for x in op.inputs]
  if all(owed) and len({r.mesh_axes for r in owed}) == 1:
    y = op.outputs[0]
    return [_Pending(y, owed[0]._replace(slice_bytes=_nbytes(impl, y), op=op.name))], 0.0
  return None, float(len(op.inputs) * impl.slice_size(op.outputs[0].shape))


def _reduce(impl, op):
  x, y = op.inputs[0], op.outputs[0]
  axes = tuple(a for d, a in zip(x.shape.dims, impl.tensor_layout(x.shape))
               if a is not None and d not in y.shape.dims)
  records = []
  if axes:
    records.append(CollectiveRecord(
        "allreduce", axes, list_product([impl.shape[a].size for a in axes]),
        _nbytes(impl, y), op.name))
  return records, float(impl.slice_size(x.shape))


def _reshape(impl, op):
  x, y = op.inputs[0], op.outputs[0]
  gather, _, _ = reshape_plan(impl, x.shape, y.shape)
  return _gather_records(impl, x.shape, x.dtype, gather, op.name), 0.0


def _slicewise(impl, op):
  whole = op.unsplittable_dims
  records = []
  for x in op.inputs:
    records += _gather_records(impl, x.shape, x.dtype, whole, op.name)
  return records, float(sum(impl.slice_size(y.shape) for y in op.outputs))


def _owed_allreduce(impl, op, axes):
  y = op.outputs[0]
  if not axes:
    return []
  axes = tuple(axes)
  return [_Pending(y, CollectiveRecord(
      "allreduce", axes, list_product([impl.shape[a].size for a in axes]),
      _nbytes(impl, y), op.name))]


def _gather(impl, op):
  w = op.inputs[0]
  mesh_axis = impl.tensor_layout(w.shape)[w.shape.dims.index(op.dim)]
  axes = [] if mesh_axis is None else [mesh_axis]
  return _owed_allreduce(impl, op, axes), float(impl.slice_size(op.outputs[0].shape))


def _gather_grad(impl, op):
  return (_owed_allreduce(impl, op, op.summed_mesh_axes(impl)),
          float(impl.slice_size(op.inputs[0].shape)))


def _shift(impl, op):
  x = op.inputs[0]
  axis = x.shape.dimension_names.index(op.dim_name)
  mesh_axis = impl.tensor_layout(x.shape)[axis]
  local = impl.slice_shape(x.shape)[axis]
  offset = op.offset
  if mesh_axis is None:
    return [], 0.0
  if abs(offset) > local or offset == 0:
    return _gather_records(impl, x.shape, x.dtype, [op.dim_name], op.name), 0.0
  return [CollectiveRecord("receive", (mesh_axis,), impl.shape[mesh_axis].size,
                           _nbytes(impl, x), op.name)], 0.0


# Ops whose output may owe an allreduce, paid when first read (lazy_allreduce).
LAZY_ALLREDUCE_OPS = (EinsumOperation, gather_ops.GatherOperation,
                      gather_ops.GatherGradOperation)

_RULES = [
    (EinsumOperation, _einsum),
    (gather_ops.GatherOperation, _gather),
    (gather_ops.GatherGradOperation, _gather_grad),
    (reduce_ops.ReduceOperation, _reduce),
    (ReshapeOperation, _reshape),
    (slicing_ops.ShiftOperation, _shift),
    (SlicewiseOperation, _slicewise),
]


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
    graph: an mtf Graph (only its ops' shapes, dtypes and classes are read).
    mesh_shape: mesh shape (e.g. "rows:2;cols:4").
    layout_rules: layout rules (e.g. "batch:rows;d_ff:cols").
    fetches: optional mtf Tensors and Operations (e.g. the loss and the update ops of a
      train step); only the ops they need are counted, as a Lowering emits only those.

  Returns:
    a CostEstimate. Raises LayoutError (naming the tensor) for an illegal layout.
  """
  impl = MeshImpl(mesh_shape, layout_rules)
  records, flops, unmodelled = [], 0.0, []
  pending = {}  # tensor -> CollectiveRecord it still owes
  variable_bytes = optimizer_bytes = activation_bytes = 0
  ops = graph.operations if fetches is None else operations_needed(graph, fetches)
  for op in ops:
    for t in op.outputs:
      impl.tensor_layout(t.shape, tensor_name=t.name)
    kind = type(op).__name__
    if kind == "Variable":
      nbytes = impl.slice_size(op.shape) * op.slice_dtype.size
      if op.trainable:
        variable_bytes += nbytes
      else:
        optimizer_bytes += nbytes
      continue
    activation_bytes += sum(_nbytes(impl, t) for t in op.outputs)
    new = None
    if isinstance(op, elementwise_ops.AddNOperation):
      new, f = _add_n(impl, op, pending)
      flops += f
    if new is None:  # every input is read: owed allreduces are emitted now
      for x in op.inputs:
        if x in pending:
          records.append(pending.pop(x))
      new = []
    for cls, rule in _RULES:
      if isinstance(op, cls):
        r, f = rule(impl, op)
        new += r
        flops += f
        break
    else:
      if kind not in _NO_TRAFFIC and kind != "AddNOperation":
        unmodelled.append(op.name)
    for r in new:
      if isinstance(r, _Pending):
        pending[r.tensor] = r.record
      else:
        records.append(r)
  for f in fetches or ():
    if f in pending:  # exported: forced by export_to_tf_tensor
      records.append(pending.pop(f))
  return CostEstimate(flops, records, variable_bytes, optimizer_bytes, activation_bytes,
                      unmodelled)

