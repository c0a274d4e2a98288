"""A read-only view of a graph for the layout search: names, shapes, sizes, liveness.

Operations and tensors are addressed by name. Sizes can be asked for under a partial
layout ({mtf dim name: mesh dim name}) to get the bytes of one device's slice.
"""
import math

import tensorflow as tf
from tensorflow.core.framework import cost_graph_pb2

from mesh_tf.errors import MtfError
from mesh_tf.graph.graph import Graph as _MtfGraph
from mesh_tf.graph.operation import Operation as _MtfOperation
from mesh_tf.graph.tensor import Tensor as _MtfTensor


class NotAGraphError(MtfError, TypeError):
  """GraphInterface was given something that is not a graph (a TypeError, as in the
  original)."""


class GraphInterface(object):
  """Names, dims, sizes and devices of the operations and tensors of a graph.

  Args:
    graph: an mtf Graph, a tf.Graph, or a list of mtf Operations in graph
      (topological) order.
    canonical_device: the device whose tensors count for memory; tensors with no device
      (every mtf tensor) count everywhere.

  Raises:
    NotAGraphError (a TypeError) for anything else.
  """

  def __init__(self, graph, canonical_device=None):
    self._graph = graph
    self.canonical_device = canonical_device
    if isinstance(graph, tf.Graph):
      operations = graph.get_operations()
    elif isinstance(graph, _MtfGraph):
      operations = graph.operations
    elif isinstance(graph, (list, tuple)) and all(
        isinstance(op, _MtfOperation) for op in graph):
      operations = graph
    else:
      raise NotAGraphError("GraphInterface needs an mtf Graph, a tf.Graph or a list of "
                           "mtf Operations, got %s" % type(graph).__name__)
    self._operations = list(operations)
    self._op_index = {op.name: i for i, op in enumerate(self._operations)}
    self._tensor_index = {t.name: (i, j)  # (op index, output index)
                          for i, op in enumerate(self._operations)
                          for j, t in enumerate(op.outputs)}
    self._final = set()

  # --- lookups -------------------------------------------------------------

  @property
  def operations(self):
    """The operations, in order."""
    return list(self._operations)

  def _op(self, name):
    if name not in self._op_index:
      raise MtfError("no operation named %r in the graph" % (name,), op=name)
    return self._operations[self._op_index[name]]

  def _tensor(self, name):
    if name not in self._tensor_index:
      raise MtfError("no tensor named %r in the graph" % (name,), tensor=name)
    i, j = self._tensor_index[name]
    return self._operations[i].outputs[j]

  def get_num_operations(self):
    """Number of operations."""
    return len(self._operations)

  def get_all_operation_names(self):
    """Operation names, in graph order."""
    return [op.name for op in self._operations]

  def get_operation_input_names(self, operation_name):
    """Names of an operation's input tensors, in order (repeats kept)."""
    return [x.name for x in self._op(operation_name).inputs]

  def get_operation_output_names(self, operation_name):
    """Names of an operation's output tensors, in order."""
    return [y.name for y in self._op(operation_name).outputs]

  def get_all_tensor_names(self):
    """Names of the tensors the operations produce, in graph order."""
    return list(self._tensor_index)

  # --- tensors -------------------------------------------------------------

  def get_tensor_dtype(self, tensor_name):
    """The tf.DType of a tensor."""
    return tf.as_dtype(self._tensor(tensor_name).dtype)

  def get_tensor_shape(self, tensor_name):
    """The full (unsplit) tf.TensorShape of a tensor."""
    t = self._tensor(tensor_name)
    if isinstance(t, _MtfTensor):
      return tf.TensorShape([d.size for d in t.shape.dims])
    return tf.TensorShape(t.shape)

  def get_tensor_num_entries(self, tensor_name, partial_layout=None,
                             mesh_dimension_to_size=None):
    """Entries of a tensor, or of one device's slice under a partial layout {mtf dim
    name: mesh dim name} (the count divided, rounding up, by the size in
    mesh_dimension_to_size of the mesh dim of each of the tensor's dims it names)."""
    entries = math.prod(self.get_tensor_shape(tensor_name).as_list())
    if not partial_layout:
      return entries
    for name in self.get_tensor_mtf_dimension_names(tensor_name):
      if name not in partial_layout:
        continue
      mesh_dim = partial_layout[name]
      if not mesh_dimension_to_size or mesh_dim not in mesh_dimension_to_size:
        raise MtfError("tensor %s: mesh dim %r of dim %s has no size in %r"
                       % (tensor_name, mesh_dim, name, mesh_dimension_to_size),
                       tensor=tensor_name, dim=name, mesh_dim=mesh_dim)
      entries = int(math.ceil(entries / mesh_dimension_to_size[mesh_dim]))
    return entries

  def get_tensor_size(self, tensor_name, partial_layout=None,
                      mesh_dimension_to_size=None):
    """Bytes of a tensor, or of one device's slice (arguments as get_tensor_num_entries)."""
    return (self.get_tensor_num_entries(tensor_name, partial_layout,
                                        mesh_dimension_to_size)
            * self.get_tensor_dtype(tensor_name).size)

  def get_tensor_device(self, tensor_name):
    """The device of a TF tensor; None for an mtf tensor (it lives on every device)."""
    t = self._tensor(tensor_name)
    return None if isinstance(t, _MtfTensor) else t.device

  def is_tensor_on_canonical_device(self, tensor_name):
    """True when the tensor has no device or lives on the canonical device."""
    device = self.get_tensor_device(tensor_name)
    return not device or device == self.canonical_device

  def get_operation_device(self, operation_name):
    """The device of a TF operation; None for an mtf operation."""
    op = self._op(operation_name)
    return None if isinstance(op, _MtfOperation) else op.device

  def get_tensor_mtf_dimension_names(self, tensor_name):
    """Names of an mtf tensor's dims, in order ([] for a TF tensor)."""
    t = self._tensor(tensor_name)
    return list(t.shape.dimension_names) if isinstance(t, _MtfTensor) else []

  def get_operation_mtf_dimension_names(self, operation_name):
    """Set of the mtf dim names of an operation's inputs and outputs."""
    names = set()
    for t in (self.get_operation_input_names(operation_name)
              + self.get_operation_output_names(operation_name)):
      if t in self._tensor_index:
        names.update(self.get_tensor_mtf_dimension_names(t))
      else:  # an input produced outside a list of operations
        x = [x for x in self._op(operation_name).inputs if x.name == t][0]
        if isinstance(x, _MtfTensor):
          names.update(x.shape.dimension_names)
    return names

  def set_tensor_final(self, tensor_name):
    """Marks a tensor as kept until the end of the computation (an output)."""
    self._tensor(tensor_name)
    self._final.add(tensor_name)

  def is_tensor_final(self, tensor_name):
    """True when set_tensor_final marked the tensor."""
    self._tensor(tensor_name)
    return tensor_name in self._final

  # --- whole-graph views ----------------------------------------------------

  def compute_cost_graph(self, devices=None):
    """A tf CostGraphDef with one node per operation, in order (node id = index).

    With `devices`, an output on a device not listed gets size 0 and no shape;
    device-less (mtf) outputs are never affected. A node is final when one of its
    outputs is.
    """
    cost_graph = cost_graph_pb2.CostGraphDef()
    for i, name in enumerate(self.get_all_operation_names()):
      node = cost_graph.node.add(name=name, id=i)
      device = self.get_operation_device(name)
      if device:
        node.device = device
      for x in self.get_operation_input_names(name):
        if x in self._tensor_index:
          producer, port = self._tensor_index[x]
          node.input_info.add(preceding_node=producer, preceding_port=port)
      for y in self.get_operation_output_names(name):
        device = self.get_tensor_device(y)
        dtype = self.get_tensor_dtype(y).as_datatype_enum
        if devices is None or device is None or device in devices:
          node.output_info.add(size=self.get_tensor_size(y), alias_input_port=-1,
                               dtype=dtype, shape=self.get_tensor_shape(y).as_proto())
        else:
          node.output_info.add(size=0, alias_input_port=-1, dtype=dtype)
        if self.is_tensor_final(y):
          node.is_final = True
    return cost_graph

  def _readers_left(self):
    """{tensor name: number of reads by the operations, plus one when final}."""
    left = {name: int(name in self._final) for name in self._tensor_index}
    for op in self._operations:
      for x in op.inputs:
        if x.name in left:
          left[x.name] += 1
    return left

  def compute_memory_contents_under_schedule(self, schedule):
    """For each step of schedule (operation indices), the frozenset of the names of the
    tensors held while that operation runs.

    An operation's outputs are allocated when it runs; after it, an output nobody reads
    and each input it was the last reader of are freed. Final tensors are never freed.
    """
    left = self._readers_left()
    held = set()
    contents = []
    for i in schedule:
      op = self._operations[i]
      outputs = [y.name for y in op.outputs]
      held.update(outputs)
      contents.append(frozenset(held))
      for y in outputs:
        if left[y] == 0:
          held.discard(y)
      for x in op.inputs:
        if x.name not in left:
          continue
        left[x.name] -= 1
        if left[x.name] == 0:
          held.discard(x.name)
    return contents

  def operation_predecessors(self):
    """For each operation index, the sorted indices of the operations it waits for."""
    preds = []
    for op in self._operations:
      p = {self._tensor_index[x.name][0] for x in op.inputs
           if x.name in self._tensor_index}
      p.update(self._op_index[c.name] for c in getattr(op, "control_inputs", ())
               if c.name in self._op_index)
      preds.append(sorted(p))
    return preds

  def tensor_lifetimes(self, schedule):
    """{tensor name: (first step, last step)} of the canonical-device tensors held under
    schedule (the same holding rule as compute_memory_contents_under_schedule)."""
    step_of = {i: step for step, i in enumerate(schedule)}
    last = len(schedule) - 1
    readers = {}
    for i, op in enumerate(self._operations):
      for x in op.inputs:
        readers.setdefault(x.name, []).append(i)
    lifetimes = {}
    for step, i in enumerate(schedule):
      for y in self._operations[i].outputs:
        if not self.is_tensor_on_canonical_device(y.name):
          continue
        end = last if y.name in self._final else max(
            [step] + [step_of[r] for r in readers.get(y.name, ()) if r in step_of])
        lifetimes[y.name] = (step, end)
    return lifetimes
