"""Per-device peak memory of a graph under a layout.

The operations are ordered once by the scheduler (layout-independent); a tensor is held
from the step that computes it to the step of its last reader, and outputs of the step
and variables are held throughout. The peak is the largest sum of slice bytes held at
one step; tensors of one shape share a column, so one layout costs one matrix-vector
product.
"""
import numpy as np

from mesh_tf.analysis import cost_model
from mesh_tf.analysis import memory_model
from mesh_tf.auto_mtf import graph_interface as gi
from mesh_tf.auto_mtf import scheduler
from mesh_tf.auto_mtf import valid_layouts
from mesh_tf.shapes import convert_to_shape


def needed_operations(mtf_graph, mtf_outputs):
  """The ops computing mtf_outputs (tensors or ops), or every op when there are none."""
  if mtf_outputs:
    return cost_model.operations_needed(mtf_graph, list(mtf_outputs))
  return list(mtf_graph.operations)


class MemoryEstimator(object):
  """The graph view and layout validator the layout optimizer works from.

  Args:
    mtf_graph: the mtf Graph.
    mesh_shape: the mesh shape.
    mtf_outputs: tensors (or ops) one step computes; only the ops they need are
      considered (all ops when empty), and output tensors are held to the end.
  """

  def __init__(self, mtf_graph, mesh_shape, mtf_outputs=()):
    self.mtf_graph = mtf_graph
    self.mesh_shape = convert_to_shape(mesh_shape)
    self.mtf_outputs = list(mtf_outputs)
    ops = needed_operations(mtf_graph, self.mtf_outputs)
    self._graph_interface = gi.GraphInterface(ops)
    for out in self.mtf_outputs:
      for t in (out.outputs if hasattr(out, "outputs") else [out]):
        self._graph_interface.set_tensor_final(t.name)
    for op in ops:  # weights and optimizer slots outlive the step
      if type(op).__name__ == "Variable":
        for t in op.outputs:
          self._graph_interface.set_tensor_final(t.name)
    self._layout_validator = valid_layouts.LayoutValidator(ops, self.mesh_shape)

  def get_graph_interface(self):
    """The GraphInterface of the considered operations."""
    return self._graph_interface

  def get_layout_validator(self):
    """The LayoutValidator of the graph on the mesh shape."""
    return self._layout_validator


class PeakMemoryModel(object):
  """Peak per-device bytes of a scheduled graph under any layout.

  Args:
    graph_interface: a GraphInterface (final tensors marked).
    schedule: a list of operation indices, e.g. from scheduler.minimize_peak_memory.
  """

  def __init__(self, graph_interface, schedule):
    lifetimes = graph_interface.tensor_lifetimes(schedule)
    by_name = {t.name: t for op in graph_interface.operations for t in op.outputs}
    columns = {}
    for name in lifetimes:
      key = tuple((d.name, d.size) for d in by_name[name].shape.dims)
      columns.setdefault(key, len(columns))
    held = np.zeros((len(schedule) + 1, max(len(columns), 1)))
    for name, (start, end) in lifetimes.items():
      t = by_name[name]
      col = columns[tuple((d.name, d.size) for d in t.shape.dims)]
      held[start, col] += t.dtype.size
      held[end + 1, col] -= t.dtype.size
    self._held = np.cumsum(held, axis=0)[:-1]
    self._shapes = list(columns)

  def peak_bytes(self, mesh_dimension_to_size, layout):
    """Peak bytes per device; layout is {mtf dim name: mesh dim name}."""
    elements = memory_model.slice_elements(self._shapes, mesh_dimension_to_size, layout)
    if not len(self._held):  # pylint: disable=g-explicit-length-test
      return 0
    return int(np.max(self._held @ elements))


# scheduler_alg of mtf.analysis's calibrated model (dataflow lifetimes, kernel scratch).
DATAFLOW = "DATAFLOW"


def estimator_peak_model(memory_estimator, scheduler_alg="LIST"):
  """The PeakMemoryModel of a MemoryEstimator's graph under the given scheduler; with
  scheduler_alg DATAFLOW, mtf.analysis's TrainStepMemory (same peak_bytes interface),
  the model calibrated against TensorFlow's allocator."""
  if scheduler_alg == DATAFLOW:
    return memory_model.TrainStepMemory(memory_estimator.mtf_graph,
                                        memory_estimator.mtf_outputs or None)
  graph = memory_estimator.get_graph_interface()
  return PeakMemoryModel(graph, scheduler.minimize_peak_memory(graph, scheduler_alg))
