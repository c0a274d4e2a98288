"""Scalars (learning rates, decay rates) whose value is computed at lowering time.

An mtf graph is built once and lowered inside a `tf.function`, so a rate that follows the
global step must be read by the lowered program: an eager tf.Tensor made while the graph
is built would freeze it. `to_mtf_scalar` accepts:

  * a Python number (it stays a number);
  * an mtf Tensor with an empty shape (used as is);
  * a zero-argument callable or a tf.Variable: a `TfScalarOperation` calls it / reads it
    in each lowering, inside the tf.function;
  * a tf.Tensor, imported as is: an eager one is a constant; a symbolic one only works
    when the graph is lowered in the same TF graph that made it.
"""
import numbers

import numpy as np
import tensorflow as tf

from mesh_tf.errors import MtfError, ShapeError
from mesh_tf.graph import Operation, Tensor
from mesh_tf.ops import elementwise as ew


class TfScalarOperation(Operation):
  """An mtf scalar whose TF value comes from `value_fn()`, called when it is lowered."""

  def __init__(self, mesh, value_fn, dtype=tf.float32, name=None):
    super().__init__([], mesh=mesh, name=name or "tf_scalar")
    self._value_fn = value_fn
    self._add_output([], tf.as_dtype(dtype))

  @property
  def has_gradient(self):
    return False

  def lower(self, lowering):
    y = self.outputs[0]
    value = tf.convert_to_tensor(self._value_fn())
    if value.shape.num_elements() not in (None, 1):
      raise ShapeError("%s: the value for scalar %r has shape %s; a rate must be a scalar"
                       % (self.name, y.name, value.shape), op=self.name, tensor=y.name)
    value = tf.reshape(tf.cast(value, y.dtype), [])
    impl = lowering.mesh_impl(self)
    lowering.set_tensor_lowering(y, impl.import_tf_tensor(y, value))


def lowering_time_scalar(mesh, value_fn, dtype=tf.float32, name=None):
  """An mtf scalar Tensor computed by value_fn() each time the graph is lowered."""
  return TfScalarOperation(mesh, value_fn, dtype=dtype, name=name).outputs[0]


def check_rate(value, what):
  """Raises MtfError unless value is something to_mtf_scalar accepts."""
  accepted = isinstance(value, (numbers.Number, np.number, Tensor, tf.Variable, tf.Tensor))
  if isinstance(value, (bool, str, bytes)) or not (accepted or callable(value)):
    raise MtfError("%s must be a number, a scalar tensor, a tf.Variable or a callable "
                 "returning a scalar; got %r" % (what, value))


def to_mtf_scalar(mesh, value, dtype, what):
  """value as a Python number or an mtf scalar Tensor of `dtype` on `mesh` (see module)."""
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value.item()
  check_rate(value, what)
  if isinstance(value, (numbers.Number, np.number)):
    return float(value)
  if isinstance(value, Tensor):
    if value.mesh is not mesh:
      raise ShapeError("%s %s is on mesh %r, but the variable is on %r"
                       % (what, value.name, value.mesh, mesh), tensor=value.name)
    if value.shape.ndims != 0:
      raise ShapeError("%s %s must be a scalar; it has shape %s"
                       % (what, value.name, value.shape), tensor=value.name)
    return value if value.dtype == dtype else ew.cast(value, dtype)
  if isinstance(value, tf.Variable):
    return lowering_time_scalar(mesh, value.read_value, dtype, name=what)
  if isinstance(value, tf.Tensor):
    return lowering_time_scalar(mesh, lambda: value, dtype, name=what)
  return lowering_time_scalar(mesh, value, dtype, name=what)


class ScalarCache:
  """One mtf scalar per (rate, mesh, dtype), so a rate shared by many variables is
  imported once per graph rather than once per variable."""

  def __init__(self):
    self._entries = {}

  def get(self, mesh, value, dtype, what):
    key = (id(value), id(mesh), tf.as_dtype(dtype).name)
    entry = self._entries.get(key)
    # Keep value and mesh alive in the entry so their ids cannot be reused.
    if entry is None or entry[0] is not value or entry[1] is not mesh:
      entry = (value, mesh, to_mtf_scalar(mesh, value, tf.as_dtype(dtype), what))
      self._entries[key] = entry
    return entry[2]
