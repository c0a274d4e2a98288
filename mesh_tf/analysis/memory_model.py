"""Peak memory of one step of an mtf program (a train step: loss, gradients, updates).

`cost_model.estimate_cost` counts every activation as live at once, an upper bound.
This model follows lifetimes instead, as TensorFlow's dataflow executor runs a traced
step: an op runs as soon as its inputs exist (its level is one more than its latest
input's), and a tensor is held from its op's level to the level of its last reader.
While a contraction or fused op runs, its kernels also hold temporaries: SCRATCH_FACTOR
times its outputs' bytes, at its level only (calibrated against TensorFlow's allocator
in benchmarks/memory.py). TF's CPU kernels compute a bfloat16 (or float16) contraction
in float32, so such an op also holds 4 bytes per element of its inputs and outputs at
its level (`kernel_upcast`; False for hardware with native bfloat16, e.g. TPUs).

The peak is weights + optimizer slots (held throughout) + the largest sum of held
tensors, each costing its slice bytes: per device, and per process (summed over one
process's devices, each distinct slice once, as the CPU backends keep one buffer for
all replicas; partial sums owing an allreduce are distinct on every processor of the
reduced mesh axes). The per-process figure has every device at its peak at once; see
`MemoryPrediction.process_peak_bounds` where the devices do not run in lockstep.
"""
import collections

import numpy as np

from mesh_tf.analysis import cost_model
from mesh_tf.ops import elementwise as elementwise_ops
from mesh_tf.ops import fused_attention
from mesh_tf.ops import fused_cross_entropy
from mesh_tf.ops import fused_softmax
from mesh_tf.ops.einsum import EinsumOperation
from mesh_tf.ops.variables import Variable
from mesh_tf.shapes import convert_to_shape
from mesh_tf.shapes.mesh_layout import MeshLayout

# Kernel temporaries of a running op, in units of its outputs' bytes (see above).
SCRATCH_FACTOR = 2
SCRATCH_OPS = (EinsumOperation, fused_attention.DotProductAttentionOperation,
               fused_attention.AttentionGradOperation,
               fused_cross_entropy.OneHotCrossEntropyOperation,
               fused_softmax.FusedSoftmaxOperation)
# Bytes per element of the float32 copies a CPU kernel makes of a narrower float.
UPCAST_BYTES = 4


class MemoryPrediction(collections.namedtuple("MemoryPrediction", [
    "weight_bytes", "slot_bytes", "activation_bytes", "peak_bytes",
    "process_weight_bytes", "process_slot_bytes", "process_activation_bytes",
    "process_peak_bytes"])):
  """Predicted bytes of one step (see the module docstring).

  weight_bytes, slot_bytes: trainable and other variables (optimizer slots, step
  counters) on each device; activation_bytes: the largest sum of a step's tensors held
  at once on each device; peak_bytes: their sum. The process_* fields are the same
  summed over the devices of one process where each distinct slice is held once.
  """

  def process_peak_bounds(self, replicas=None):
    """(lower, upper) bytes of one process's peak where its devices' step computations
    are not run in lockstep, so their activation peaks need not coincide.

    upper: process_peak_bytes, or with `replicas` (multi-client SPMD replicas sharing
    nothing) replicas x peak_bytes: every device at its peak at once. lower: the
    process's variables (replicas x per-device ones for SPMD) + activation_bytes, as
    some device reaches its own activation peak however the host interleaves them.
    """
    if replicas is None:
      variables = self.process_weight_bytes + self.process_slot_bytes
      upper = self.process_peak_bytes
    else:
      variables = replicas * (self.weight_bytes + self.slot_bytes)
      upper = replicas * self.peak_bytes
    return variables + self.activation_bytes, upper


def slice_elements(shape_keys, mesh_dimension_to_size, assignment):
  """Elements of one device's slice for each shape key ((dim name, size), ...) under
  {tensor dim name: mesh dim name} (sizes rounded up); at least one entry."""
  elements = np.zeros(max(len(shape_keys), 1))
  for i, dims in enumerate(shape_keys):
    n = 1
    for name, size in dims:
      m = assignment.get(name)
      n *= -(-size // mesh_dimension_to_size[m]) if m is not None else size
    elements[i] = n
  return elements


def _distinct_slices(layout, shape):
  """Number of processors holding different parts of a tensor of `shape`."""
  n = 1
  for axis in layout.tensor_layout(shape):
    if axis is not None:
      n *= layout.axis_size(axis)
  return n


class TrainStepMemory:
  """Lifetimes of the tensors of one step, priced under any layout.

  fetches: the tensors and ops one step computes (e.g. [loss] + update_ops; None: the
  whole graph); kernel_upcast: whether contractions in a float narrower than float32
  hold float32 copies of their operands and results while they run (TF's CPU kernels do).
  """

  def __init__(self, graph, fetches=None, kernel_upcast=True):
    self.graph = graph
    self.fetches = list(fetches or ())
    self.operations = (cost_model.operations_needed(graph, self.fetches)
                       if self.fetches else list(graph.operations))
    self.variables = [op for op in self.operations if isinstance(op, Variable)]
    level = {}
    for op in self.operations:
      if isinstance(op, Variable):
        level[op] = 0
        continue
      deps = [level[x.operation] for x in op.inputs]
      deps += [level[c] for c in getattr(op, "control_inputs", ()) if c in level]
      level[op] = 1 + max(deps, default=0)
    last_read = {}
    for op in self.operations:
      for x in op.inputs:
        last_read[x] = max(last_read.get(x, 0), level[op])
    fetched = {f for f in self.fetches if hasattr(f, "operation")}
    end = max(level.values(), default=0) + 1
    # (tensor, first level, last level, bytes per element held from first to last,
    # bytes per element of kernel scratch at the first level only)
    self.lifetimes = []
    for op in self.operations:
      if isinstance(op, Variable):
        continue
      upcast = (kernel_upcast and isinstance(op, EinsumOperation) and  # a narrow float
                any(t.dtype.is_floating and t.dtype.size < UPCAST_BYTES for t in op.outputs))
      for t in op.outputs:
        last = end if t in fetched else last_read.get(t, level[op])
        size = t.dtype.size
        scratch = SCRATCH_FACTOR * size if isinstance(op, SCRATCH_OPS) else 0
        self.lifetimes.append((t, level[op], last, size,
                               scratch + (UPCAST_BYTES if upcast else 0)))
      if upcast:  # the float32 copies of its operands
        self.lifetimes.extend((x, level[op], level[op], 0, UPCAST_BYTES)
                              for x in op.inputs)
    self.num_levels = end + 1
    self._columns = None

  # ---- per device, for searches over many layouts ----
  def _shape_columns(self):
    """(held bytes per element [levels x shape keys], shape keys, variables' row)."""
    if self._columns is None:
      keys = {}
      held = []
      for t, start, last, size, scratch in self.lifetimes:
        key = tuple((d.name, d.size) for d in t.shape.dims)
        col = keys.setdefault(key, len(keys))
        held.append((start, last, col, size, scratch))
      var_cols = {}
      for op in self.variables:
        key = tuple((d.name, d.size) for d in op.shape.dims)
        col = keys.setdefault(key, len(keys))
        var_cols[col] = var_cols.get(col, 0) + op.slice_dtype.size
      m = np.zeros((self.num_levels + 1, max(len(keys), 1)))
      for start, last, col, size, scratch in held:
        m[start, col] += size + scratch
        m[start + 1, col] -= scratch
        m[last + 1, col] -= size
      var_row = np.zeros(max(len(keys), 1))
      for col, size in var_cols.items():
        var_row[col] = size
      self._columns = (np.cumsum(m, axis=0)[:-1], list(keys), var_row)
    return self._columns

  def peak_bytes(self, mesh_dimension_to_size, assignment):
    """Peak bytes per device (weights + slots + held tensors) of a layout given as
    {tensor dim name: mesh dim name} over mesh dims {name: size} (the interface of
    auto_mtf's memory_estimator.PeakMemoryModel)."""
    held, keys, var_row = self._shape_columns()
    elements = slice_elements(keys, mesh_dimension_to_size, assignment)
    transient = float(np.max(held @ elements)) if len(held) else 0.0
    return int(transient + var_row @ elements)

  # ---- one layout, per device and per process ----
  def predict(self, mesh_shape, layout_rules):
    """MemoryPrediction of the step under mesh_shape and layout_rules."""
    layout = MeshLayout(convert_to_shape(mesh_shape), layout_rules)
    weights = slots = p_weights = p_slots = 0
    for op in self.variables:
      nbytes = layout.slice_size(op.shape) * op.slice_dtype.size
      distinct = nbytes * _distinct_slices(layout, op.shape)
      if op.trainable:
        weights, p_weights = weights + nbytes, p_weights + distinct
      else:
        slots, p_slots = slots + nbytes, p_slots + distinct
    partials = self._partial_sum_copies(layout)
    device = np.zeros(self.num_levels + 1)
    process = np.zeros(self.num_levels + 1)
    for t, start, last, size, scratch in self.lifetimes:
      elements = layout.slice_size(t.shape)
      device[start] += (size + scratch) * elements
      device[start + 1] -= scratch * elements
      device[last + 1] -= size * elements
      elements *= _distinct_slices(layout, t.shape)
      copies = partials.get(t, 1) if size else 1
      if copies > 1:  # every processor's partial sum, until the allreduce just after
        process[start] += size * elements * copies
        process[start + 1] -= size * elements * copies
        start = min(start + 1, last)
      process[start] += (size + scratch) * elements
      process[start + 1] -= scratch * elements
      process[last + 1] -= size * elements
    act = int(np.max(np.cumsum(device))) if self.lifetimes else 0
    p_act = int(np.max(np.cumsum(process))) if self.lifetimes else 0
    return MemoryPrediction(weights, slots, act, weights + slots + act,
                            p_weights, p_slots, p_act, p_weights + p_slots + p_act)

  def _partial_sum_copies(self, layout):
    """{output owing an allreduce: processors holding distinct partial sums of it}."""
    copies, owed = {}, {}
    for op in self.operations:
      if isinstance(op, Variable):
        continue
      owed_in = None
      if isinstance(op, elementwise_ops.AddNOperation):
        owed_in = [owed[x].mesh_axes if x in owed else None for x in op.inputs]
      _, out_owed, _ = cost_model.plan_cost(layout, op, owed_in)
      for y, r in zip(op.outputs, out_owed):
        if r is not None:
          owed[y] = r
          copies[y] = layout.axes_size(r.mesh_axes)
    return copies


def predict_memory(graph, mesh_shape, layout_rules, fetches=None, kernel_upcast=True):
  """Predicts the peak memory of computing `fetches` (see the module docstring).

  fetches: the step's tensors and ops, e.g. [loss] + update_ops (None: every op);
  kernel_upcast: as for TrainStepMemory. Returns a MemoryPrediction.
  """
  return TrainStepMemory(graph, fetches, kernel_upcast).predict(mesh_shape, layout_rules)
