"""A read-only view of an mtf graph for the layout search: names, shapes, sizes, liveness.

Operations and tensors are addressed by name. Sizes can be asked for under a partial
layout ({mtf dim name: mesh dim name}) to get the bytes of one device's slice.
"""
import math

import tensorflow as tf
from tensorflow.core.framework import cost_graph_pb2

from mesh_tf.errors import MtfError


class GraphInterface(object):
  """Names, dims, sizes and devices of the operations and tensors of an mtf graph.

  Args:
    graph: an mtf Graph, or a list of its Operations (e.g. only those a step needs),
      in graph (topological) order.
    canonical_device: the device whose tensors count for memory (mtf tensors have none,
      so None keeps them all).
  """

  def __init__(self, graph, canonical_device=None):
    operations = graph if isinstance(graph, (list, tuple)) else getattr(
        graph, "operations", None)
    if operations is None:
      raise MtfError("GraphInterface needs an mtf Graph or a list of its Operations, "
                     "got %r" % (graph,))
    self._operations = list(operations)
    self._canonical_device = canonical_device
    self._op_by_name = {op.name: op for op in self._operations}
    self._tensor_by_name = {}
    self._consumers = {}
    for op in self._operations:
      for t in op.outputs:
        self._tensor_by_name[t.name] = t
    for op in self._operations:
      for x in op.inputs:
        self._consumers.setdefault(x.name, []).append(op.name)
    self._final = set()

  @property
  def operations(self):
    """The mtf Operations, in order."""
    return list(self._operations)

  def _op(self, name):
    if name not in self._op_by_name:
      raise MtfError("no operation named %r in the graph" % (name,), op=name)
    return self._op_by_name[name]

  def _tensor(self, name):
    if name not in self._tensor_by_name:
      raise MtfError("no tensor named %r in the graph" % (name,), tensor=name)
    return self._tensor_by_name[name]

  def get_num_operations(self):
    """Number of operations."""
    return len(self._operations)

  def get_all_operation_names(self):
    """Operation names, in graph order."""
    return [op.name for op in self._operations]

  def get_operation_input_names(self, operation_name):
    """Names of an operation's input tensors."""
    return [x.name for x in self._op(operation_name).inputs]

  def get_operation_output_names(self, operation_name):
    """Names of an operation's output tensors."""
    return [y.name for y in self._op(operation_name).outputs]

  def get_all_tensor_names(self):
    """Names of the tensors the operations produce, in graph order."""
    return list(self._tensor_by_name)

  def get_tensor_dtype(self, tensor_name):
    """The tf.DType of a tensor."""
    return tf.as_dtype(self._tensor(tensor_name).dtype)

  def get_tensor_shape(self, tensor_name):
    """The full (unsplit) tf.TensorShape of a tensor."""
    return tf.TensorShape(self._tensor(tensor_name).shape.to_integer_list)

  def get_tensor_num_entries(self, tensor_name, partial_layout=None,
                             mesh_dimension_to_size=None):
    """Entries of one device's slice of a tensor.

    Args:
      tensor_name: the tensor.
      partial_layout: optional {mtf dim name: mesh dim name}; unnamed dims are whole.
      mesh_dimension_to_size: {mesh dim name: size}, needed with partial_layout.
    """
    n = 1
    for d in self._tensor(tensor_name).shape.dims:
      size = d.size
      if partial_layout and d.name in partial_layout:
        mesh_dim = partial_layout[d.name]
        if not mesh_dimension_to_size or mesh_dim not in mesh_dimension_to_size:
          raise MtfError("tensor %s: mesh dim %r of dim %s has no size in %r"
                         % (tensor_name, mesh_dim, d.name, mesh_dimension_to_size),
                         tensor=tensor_name, dim=d.name, mesh_dim=mesh_dim)
        size = int(math.ceil(size / mesh_dimension_to_size[mesh_dim]))
      n *= size
    return n

  def get_tensor_size(self, tensor_name, partial_layout=None,
                      mesh_dimension_to_size=None):
    """Bytes of one device's slice of a tensor (arguments as get_tensor_num_entries)."""
    return (self.get_tensor_num_entries(tensor_name, partial_layout,
                                        mesh_dimension_to_size)
            * self.get_tensor_dtype(tensor_name).size)

  def get_tensor_device(self, tensor_name):
    """The device of a tensor: None for mtf tensors (they live on every device)."""
    self._tensor(tensor_name)
    return None

  def is_tensor_on_canonical_device(self, tensor_name):
    """True when the tensor lives on the canonical device; mtf tensors live on every
    device, so always."""
    device = self.get_tensor_device(tensor_name)
    return device is None or device == self._canonical_device

  def get_operation_device(self, operation_name):
    """The device of an operation: None for mtf operations."""
    self._op(operation_name)
    return None

  def get_tensor_mtf_dimension_names(self, tensor_name):
    """Names of a tensor's dims, in order."""
    return list(self._tensor(tensor_name).shape.dimension_names)

  def get_operation_mtf_dimension_names(self, operation_name):
    """Set of the names of the dims of an operation's inputs and outputs."""
    op = self._op(operation_name)
    names = set()
    for t in list(op.inputs) + list(op.outputs):
      names.update(t.shape.dimension_names)
    return names

  def set_tensor_final(self, tensor_name):
    """Marks a tensor as kept until the end of the step (an output, or a variable)."""
    self._tensor(tensor_name)
    self._final.add(tensor_name)

  def is_tensor_final(self, tensor_name):
    """True when set_tensor_final marked the tensor."""
    return tensor_name in self._final

  def operation_predecessors(self):
    """For each operation index, the indices of the operations it waits for."""
    index = {op.name: i for i, op in enumerate(self._operations)}
    preds = []
    for op in self._operations:
      p = {index[x.operation.name] for x in op.inputs if x.operation.name in index}
      p.update(index[c.name] for c in getattr(op, "control_inputs", ())
               if c.name in index)
      preds.append(sorted(p))
    return preds

  def compute_cost_graph(self, devices=None):
    """A tf CostGraphDef of the operations (on `devices`, all when None).

    Each node lists its inputs (producer node id and output port) and its outputs'
    full sizes in bytes, shapes and dtypes.
    """
    cost_graph = cost_graph_pb2.CostGraphDef()
    ids = {}
    for op in self._operations:
      device = self.get_operation_device(op.name)
      if devices is not None and device not in devices:
        continue
      node = cost_graph.node.add()
      node.name = op.name
      node.device = device or ""
      node.id = ids[op.name] = len(ids)
      for x in op.inputs:
        if x.operation.name in ids:
          info = node.input_info.add()
          info.preceding_node = ids[x.operation.name]
          info.preceding_port = x.operation.outputs.index(x)
      for y in op.outputs:
        info = node.output_info.add()
        info.size = self.get_tensor_size(y.name)
        info.alias_input_port = -1
        info.dtype = self.get_tensor_dtype(y.name).as_datatype_enum
        info.shape.CopyFrom(self.get_tensor_shape(y.name).as_proto())
      node.is_final = any(self.is_tensor_final(y.name) for y in op.outputs)
    return cost_graph

  def tensor_lifetimes(self, schedule):
    """{tensor name: (first step, last step)} of the steps it is held under schedule."""
    position = {self._operations[i].name: step for step, i in enumerate(schedule)}
    last = len(schedule) - 1
    lifetimes = {}
    for step, i in enumerate(schedule):
      op = self._operations[i]
      for y in op.outputs:
        if not self.is_tensor_on_canonical_device(y.name):
          continue
        ends = [position[c] for c in self._consumers.get(y.name, ())
                if c in position]
        end = last if self.is_tensor_final(y.name) else max(ends + [step])
        lifetimes[y.name] = (step, end)
    return lifetimes

  def compute_memory_contents_under_schedule(self, schedule):
    """For each step of schedule (a list of operation indices), the frozenset of
    tensor names held while that operation runs: its inputs and outputs and every
    earlier output still needed later (final tensors until the end)."""
    lifetimes = self.tensor_lifetimes(schedule)
    contents = [set() for _ in schedule]
    for name, (start, end) in lifetimes.items():
      for step in range(start, end + 1):
        contents[step].add(name)
    return [frozenset(c) for c in contents]
