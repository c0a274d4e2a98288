"""Reporting: `scalar_summary` (a TF 2 summary of an mtf scalar), `log_variable_sizes`
and `pretty_print_counters`."""
import collections
import logging

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from mesh_tf.errors import MtfError, ShapeError
from mesh_tf.graph import Operation

_LOG = logging.getLogger("mesh_tf")

# The TF 2 stand-in for the TF1 summaries collection: {id(TF graph): [(tag, tf value)]}
# of the scalar_summary ops lowered there (read by mtf.utils.create_host_call).
_LOWERED_SUMMARIES = collections.defaultdict(list)


def write_scalar(tag, value, step=None):
  """Writes value as scalar summary `tag` under the default writer (what
  tf.summary.scalar writes, without needing TensorBoard installed)."""
  return tf.summary.write(tag, tf.cast(value, tf.float32), step=step,
                          metadata=_SCALAR_METADATA)


def lowered_summaries(graph=None):
  """The [(tag, tf value)] of scalar summaries lowered in graph (default: current)."""
  graph = graph or tf.compat.v1.get_default_graph()
  return _LOWERED_SUMMARIES[id(graph)]


def clear_lowered_summaries(graph=None):
  """Forgets the scalar summaries lowered in graph (default: the current one)."""
  graph = graph or tf.compat.v1.get_default_graph()
  _LOWERED_SUMMARIES.pop(id(graph), None)
# Marks the summary as a scalar for TensorBoard (what tf.summary.scalar would write).
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


class ScalarSummaryOperation(Operation):
  """Writes an mtf scalar as a scalar summary under the default summary writer, if any
  (at step tf.summary.experimental.get_step(), which must then be set); lowering records
  the scalar's tf.Tensor value in `lowering.operations[op]`."""

  def __init__(self, name, x):
    if x.shape.ndims:
      raise ShapeError("scalar_summary %r: %s has shape %s; summarize a scalar (reduce "
                       "it first)" % (name, x.name, x.shape), tensor=x.name)
    super().__init__([x], name=name)
    self._tag = name

  @property
  def has_gradient(self):
    return False

  def gradient(self, grad_ys):
    del grad_ys
    return [None]

  def lower(self, lowering):
    x = self.inputs[0]
    value = lowering.mesh_impl(self).export_to_tf_tensor(x, lowering.tensors[x])
    try:
      write_scalar(self._tag, value)
    except ValueError as e:  # a writer is active but no step is set
      raise MtfError("scalar_summary %r: %s; set one with "
                     "tf.summary.experimental.set_step(step)" % (self._tag, e),
                     op=self.name) from e
    lowering.operations[self] = value
    lowered_summaries().append((self._tag, value))


def scalar_summary(name, x):
  """An op that writes scalar x as summary `name` each time it is lowered/run."""
  return ScalarSummaryOperation(name, x)


def log_variable_sizes(var_list=None, tag=None, verbose=True, mesh_to_impl=None,
                       log_file=None):
  """Logs each variable's name, shape and size (and slice size given mesh_to_impl), then
  the totals, to the "mesh_tf" logger and to log_file (anything with .write) if given;
  returns the total number of elements (0 without var_list)."""
  if not var_list:
    return 0
  tag = tag or "Trainable Variables"
  by_name = {v.name: v for v in var_list}
  total = total_slice = 0

  def emit(line):
    _LOG.info(line)
    if log_file is not None:
      log_file.write(line + "\n")
  for name in sorted(by_name):
    v = by_name[name]
    size = v.shape.size
    slice_size = mesh_to_impl[v.mesh].slice_size(v.shape) if mesh_to_impl else 0
    total += size
    total_slice += slice_size
    if verbose:
      emit("Weight    %s\tshape    %s\tsize    %d\tslice_size %d" % (
          name.ljust(60), v.shape.to_string.ljust(30), size, slice_size))
  emit("%s count: %d  Total size: %d  Total slice_size: %d" % (
      tag, len(by_name), total, total_slice))
  return total


def pretty_print_counters(counters):
  """Counters (a dict such as Lowering.counters, or (name, number) pairs) as an indented
  text tree; a "a/b" counter also counts towards "a"."""
  items = counters.items() if hasattr(counters, "items") else counters
  totals = collections.defaultdict(int)
  for name, value in items:
    parts = name.split("/")
    for i in range(1, len(parts) + 1):
      totals["/".join(parts[:i])] += value
  return "\n".join(" " * name.count("/") + "%s: %.3g" % (name, value)
                   for name, value in sorted(totals.items()))
