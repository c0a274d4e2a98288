"""Predicted step time of one graph under many layouts, fast enough to search with.

`StepTimeModel.evaluate` gives the totals of `mtf.analysis.estimate_cost`, by the same
rule functions, and turns them into seconds with a HardwareProfile. It is fast because
ops of one *signature* (class, input and output shapes and dtypes, and the attributes
the cost rules read) cost the same under the same layout of their dims, so each is
costed once; only the lazy allreduces need a pass in graph order.
"""
import collections

from mesh_tf.analysis import communication
from mesh_tf.analysis import cost_model
from mesh_tf.ops import elementwise as elementwise_ops
from mesh_tf.ops import slicewise as slicewise_ops
from mesh_tf.ops import slicing as slicing_ops
from mesh_tf.ops.variables import Variable
from mesh_tf.shapes import LayoutRules, convert_to_layout_rules, convert_to_shape
from mesh_tf.shapes.mesh_layout import MeshLayout

Prediction = collections.namedtuple("Prediction", [
    "step_time", "compute_time", "comm_time", "flops", "comm_bytes", "num_collectives",
    "variable_bytes", "optimizer_bytes", "activation_bytes"])
Prediction.__doc__ = "Per-device predicted costs of one step (seconds, FLOPs, bytes)."


def _shape_key(shape):
  return tuple((d.name, d.size) for d in shape.dims)


def _signature(op):
  """What the cost rules read of an op, apart from its name."""
  extra = ()
  if isinstance(op, slicewise_ops.SlicewiseOperation):
    extra = tuple(sorted(op._gathered_dim_names()))  # pylint: disable=protected-access
  elif isinstance(op, slicing_ops.ShiftOperation):
    extra = (op.dim_name, op.offset)
  elif isinstance(op, Variable):
    extra = (op.trainable, op.slice_dtype.name)
  return (type(op).__name__,
          tuple((_shape_key(x.shape), x.dtype.name) for x in op.inputs),
          tuple((_shape_key(y.shape), y.dtype.name) for y in op.outputs), extra)


def op_dim_names(op):
  """Sorted names of the dims of an op's inputs and outputs."""
  return tuple(sorted({n for t in list(op.inputs) + list(op.outputs)
                       for n in t.shape.dimension_names}))


class StepTimeModel:
  """Predicts per-device step time of a graph under (mesh shape, layout) pairs.

  fetches: the tensors/ops one step computes (e.g. loss and update ops; empty: the
  whole graph, as in estimate_cost); profile: a HardwareProfile.
  """

  def __init__(self, graph, fetches, profile):
    self.profile = profile
    self._fetches = list(fetches or ())
    ops = self.operations = (cost_model.operations_needed(graph, self._fetches)
                             if self._fetches else list(graph.operations))
    # tensors that may owe an allreduce: einsum, gather, reduce and add_n outputs
    lazy = {y for op in ops
            if isinstance(op, cost_model.LAZY_ALLREDUCE_OPS + (elementwise_ops.AddNOperation,))
            for y in op.outputs}
    groups = collections.OrderedDict()  # signature -> [representative op, count, dims]
    self._events = []
    for op in ops:
      sig = _signature(op)
      if sig not in groups:
        groups[sig] = [op, 0, op_dim_names(op)]
      groups[sig][1] += 1
      if isinstance(op, elementwise_ops.AddNOperation):
        y = op.outputs[0]
        # Inputs and output of add_n share one shape, so the op's dims are y's.
        self._events.append(("add_n", op, _shape_key(y.shape), op_dim_names(op)))
      elif not isinstance(op, Variable):
        read = [x for x in op.inputs if x in lazy]
        if read:
          self._events.append(("read", read, None, None))
        if isinstance(op, cost_model.LAZY_ALLREDUCE_OPS):
          self._events.append(("owing", op, sig, groups[sig][2]))
    self._groups = list(groups.items())
    by_dims = collections.OrderedDict()  # dims -> [(signature, op, count)]
    for sig, (op, count, dims) in self._groups:
      by_dims.setdefault(dims, []).append((sig, op, count))
    self._by_dims = list(by_dims.items())
    self._memo = {}
    self._memo_mesh = None
    self._paid = {}  # CollectiveRecord -> (bytes, seconds)
    self._layout = None

  def _record_cost(self, mesh_sizes, record):
    """(bytes, seconds) of one CollectiveRecord."""
    b = communication.bytes_sent_per_processor(record)
    if record.group_size <= 1:
      return 0.0, 0.0
    bw = self.profile.axis_bandwidth(mesh_sizes, record.mesh_axes)
    return b, self.profile.collective_latency_s + b / bw

  def _op_cost(self, mesh_sizes, op):
    """The layout-local cost of one op: everything but lazy allreduces and add_n sums."""
    impl = self._layout
    if isinstance(op, Variable):
      nbytes = impl.slice_size(op.shape) * op.slice_dtype.size
      if op.trainable:
        return (0.0, 0, nbytes, 0, 0.0, 0.0, 0), None
      return (0.0, 0, 0, nbytes, 0.0, 0.0, 0), None
    act = sum(impl.slice_size(t.shape) * t.dtype.size for t in op.outputs)
    comm_bytes = comm_time = 0.0
    count = 0
    pending = None
    if isinstance(op, elementwise_ops.AddNOperation):
      flops = 0.0  # add_n's traffic depends on what its inputs owe: paid in graph order
    else:
      records, owed, flops = cost_model.plan_cost(impl, op)
      pending = next((r for r in owed if r is not None), None)
      for r in records:
        b, t = self._record_cost(mesh_sizes, r)
        comm_bytes += b
        comm_time += t
        count += r.group_size > 1
    return (flops, act, 0, 0, comm_bytes, comm_time, count), pending

  def _lookup(self, mesh_sizes, axis_of, op, sig, dims, make_layout):
    key = (sig, tuple(axis_of.get(d) for d in dims))
    hit = self._memo.get(key)
    if hit is None:
      if self._layout is None:
        self._layout = make_layout()
      hit = self._memo[key] = self._op_cost(mesh_sizes, op)
    return hit

  def evaluate(self, mesh_shape, layout_rules):
    """Prediction for a mesh shape and layout rules (assumed legal for the graph).

    Raises LayoutError (from the lowering's layout logic) when a rule is illegal for a
    tensor whose cost was not seen before under the same layout of its dims.
    """
    mesh_shape = convert_to_shape(mesh_shape)
    layout_rules = convert_to_layout_rules(layout_rules)
    axis_index = {m.name: i for i, m in enumerate(mesh_shape.dims)}
    axis_of = {}
    for d, m in layout_rules:
      if m in axis_index and d not in axis_of:
        axis_of[d] = axis_index[m]
    return self.evaluate_assignment(mesh_shape, axis_of, layout_rules)

  def evaluate_assignment(self, mesh_shape, axis_of, layout_rules=None):
    """Prediction for an mtf mesh Shape and axis_of {mtf dim name: mesh axis index};
    layout_rules: the matching LayoutRules (built from axis_of when None)."""
    mesh_sizes = tuple(mesh_shape.to_integer_list)
    # The memo key holds mesh axes, not sizes: a new mesh shape starts a new memo.
    if self._memo_mesh != mesh_sizes:
      self._memo, self._paid, self._memo_mesh = {}, {}, mesh_sizes
    self._layout = None

    def make_layout():
      rules = layout_rules
      if rules is None:
        rules = LayoutRules([(d, mesh_shape.dims[a].name)
                             for d, a in sorted(axis_of.items())])
      return MeshLayout(mesh_shape, rules)

    flops = comm_bytes = comm_time = 0.0
    act = var = opt = ncoll = 0
    memo = self._memo
    where_of = {}  # dims -> the mesh axis of each (None: whole)
    for dims, members in self._by_dims:
      where = where_of[dims] = tuple(axis_of.get(d) for d in dims)
      for sig, op, count in members:
        hit = memo.get((sig, where))
        if hit is None:
          hit = self._lookup(mesh_sizes, axis_of, op, sig, dims, make_layout)
        c = hit[0]
        flops += count * c[0]
        act += count * c[1]
        var += count * c[2]
        opt += count * c[3]
        comm_bytes += count * c[4]
        comm_time += count * c[5]
        ncoll += count * c[6]
    pending = {}

    paid = self._paid

    def pay(record):
      nonlocal comm_bytes, comm_time, ncoll
      cost = paid.get(record)
      if cost is None:
        cost = paid[record] = self._record_cost(mesh_sizes, record)
      comm_bytes += cost[0]
      comm_time += cost[1]
      ncoll += record.group_size > 1

    for kind, what, sig, dims in self._events:
      if kind == "read":
        for x in what:
          if x in pending:
            pay(pending.pop(x))
      elif kind == "owing":
        hit = memo.get((sig, where_of[dims]))
        if hit is None:
          hit = self._lookup(mesh_sizes, axis_of, what, sig, dims, make_layout)
        owed = hit[1]
        if owed is not None:
          pending[what.outputs[0]] = owed
      else:  # add_n: sums of partial sums owing one allreduce stay owing one
        op = what
        owed = [pending.get(x) for x in op.inputs]
        size = memo.get(("slice_size", sig, where_of[dims]))
        if size is None:
          size = self._slice_size(axis_of, op.outputs[0], sig, dims, make_layout)
        if all(owed) and len({r.mesh_axes for r in owed}) == 1:
          y = op.outputs[0]
          pending[y] = owed[0]._replace(slice_bytes=size * y.dtype.size)
        else:
          flops += float(len(op.inputs) * size)
          for x in op.inputs:
            if x in pending:
              pay(pending.pop(x))
    for f in self._fetches:
      if f in pending:
        pay(pending.pop(f))
    compute_time = flops / self.profile.flops_per_second
    return Prediction(compute_time + comm_time, compute_time, comm_time, flops,
                      comm_bytes, ncoll, var, opt, act)

  def _slice_size(self, axis_of, y, shape_key, dims, make_layout):
    """Elements of each device's slice of tensor y (of shape_key, dim names dims)."""
    key = ("slice_size", shape_key, tuple(axis_of.get(d) for d in dims))
    hit = self._memo.get(key)
    if hit is None:
      if self._layout is None:
        self._layout = make_layout()
      hit = self._memo[key] = self._layout.slice_size(y.shape)
    return hit
