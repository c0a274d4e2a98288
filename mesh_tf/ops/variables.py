"""Variables: `VariableDType`, the `Variable` op and `get_variable`.

A variable's state is created by the MeshImpl the first time a Lowering sees it and lives
in `mesh_impl.variable_store` under the variable's full name, the original's master
variable name and checkpoint key.
"""
import zlib

import numpy as np
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation, current_scope_name, reuse_variables
from mesh_tf.shapes import Dimension, Shape, convert_to_shape, list_product


class VariableDType:
  """The three precisions of a variable: master_dtype (stored in checkpoints),
  slice_dtype (kept on each processor), activation_dtype (what reading it gives)."""

  def __init__(self, master_dtype=tf.float32, slice_dtype=None, activation_dtype=None):
    self._master_dtype = tf.as_dtype(master_dtype)
    self._slice_dtype = tf.as_dtype(slice_dtype or self._master_dtype)
    self._activation_dtype = tf.as_dtype(activation_dtype or self._slice_dtype)

  @property
  def master_dtype(self):
    return self._master_dtype

  @property
  def slice_dtype(self):
    return self._slice_dtype

  @property
  def activation_dtype(self):
    return self._activation_dtype

  def __repr__(self):
    return "VariableDType(master=%s, slice=%s, activation=%s)" % (
        self.master_dtype.name, self.slice_dtype.name, self.activation_dtype.name)


def glorot_uniform_value(shape, dtype, seed):
  """Glorot-uniform values, seeded so one variable name always gets the same values."""
  dims = list(shape)
  if len(dims) < 2:
    fan_in = fan_out = dims[0] if dims else 1
  else:
    receptive = list_product(dims[:-2])
    fan_in, fan_out = dims[-2] * receptive, dims[-1] * receptive
  limit = np.sqrt(6.0 / max(1.0, (fan_in + fan_out) / 1.0))
  values = tf.random.stateless_uniform(dims, seed=[seed, 0], minval=-limit, maxval=limit)
  return tf.cast(values, dtype)


def _initial_value(initializer, shape, dtype, name):
  dims = shape.to_integer_list
  if initializer is None:
    return glorot_uniform_value(dims, dtype, zlib.crc32(name.encode()) & 0x7FFFFFFF)
  if callable(initializer):
    try:
      value = initializer(dims, dtype=dtype)
    except (TypeError, ValueError):
      value = initializer(dims, dtype=tf.float32)
  else:
    value = initializer
  value = tf.cast(tf.convert_to_tensor(value), dtype)
  if value.shape.rank == 0:
    value = tf.fill(dims, value)
  if value.shape.as_list() != dims:
    raise ShapeError("initializer of variable %r gave shape %s, expected %s"
                     % (name, value.shape.as_list(), dims), tensor=name)
  return value


class Variable(Operation):
  """A trainable (or not) tensor whose value persists across steps."""

  def __init__(self, mesh, name, shape, dtype, initializer, trainable, **kwargs):
    del kwargs  # TF1 get_variable options (collections, ...) have no meaning here.
    scope = current_scope_name()
    super().__init__([], mesh=mesh, name=name)
    self._name = scope + "/" + name if scope else name
    if not isinstance(dtype, VariableDType):
      dtype = VariableDType(dtype)
    self._dtype = dtype
    self._initializer = initializer
    self._trainable = trainable
    self._add_output(convert_to_shape(shape), dtype.activation_dtype)
    mesh.graph.add_variable(self)
    # Where the full value is assembled (e.g. by mtf.utils.BalancedVariablePlacer).
    placer = mesh.variable_placer_fn
    self._master_device = placer(self) if callable(placer) else placer

  @property
  def shape(self):
    return self.outputs[0].shape

  @property
  def size(self):
    return self.shape.size

  @property
  def dtype(self):
    """The dtype of the variable's value (its activation dtype)."""
    return self.outputs[0].dtype

  @property
  def value(self):
    return self.outputs[0]

  @property
  def master_device(self):
    """The device where the full (master) value is assembled by get_master and
    checkpoints: chosen by the mesh's variable placer ("cpu:0" without one)."""
    return self._master_device

  def _laid_out_variable(self):
    laid_out = getattr(self, "laid_out_variable", None)
    if laid_out is None:
      raise ShapeError("variable %r has no state yet: lower its graph with mtf.Lowering "
                       "first (its state is created then)" % self.name, tensor=self.name)
    return laid_out

  def get_master(self):
    """The full value (a tf.Tensor in the master dtype), read from the slices of the
    MeshImpl that last lowered this variable."""
    with tf.device(self._master_device):
      return tf.identity(self._laid_out_variable().read_full())

  def assign_to_master(self, val):
    """Sets the full value: every slice of the MeshImpl that last lowered it."""
    value = tf.cast(tf.convert_to_tensor(val), self.master_dtype)
    return self._laid_out_variable().assign_full(value)

  @property
  def master_dtype(self):
    return self._dtype.master_dtype

  @property
  def slice_dtype(self):
    return self._dtype.slice_dtype

  @property
  def activation_dtype(self):
    return self._dtype.activation_dtype

  @property
  def trainable(self):
    return self._trainable

  @property
  def has_gradient(self):
    return False

  def initial_value(self):
    """The full-shape initial value, in the master dtype."""
    return _initial_value(self._initializer, self.shape, self.master_dtype, self.name)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    laid = lowering.variables[self].laid_out_tensor
    if self.activation_dtype != self.slice_dtype:
      laid = impl.slicewise(lambda t: tf.cast(t, self.activation_dtype), laid)
    lowering.set_tensor_lowering(self.outputs[0], laid)


def get_variable(mesh, name, shape, dtype=tf.float32, master_dtype=None, slice_dtype=None,
                 activation_dtype=None, initializer=None, trainable=True, **kwargs):
  """Creates a Variable op and returns its value (an mtf Tensor).

  dtype may be a tf.DType (overridden per role by master/slice/activation_dtype) or a
  VariableDType. The full name (with enclosing mtf.variable_scope()s) is the checkpoint
  key; under reuse=True (or AUTO_REUSE) an existing variable of that name is returned.
  Getters of Graph.custom_getter may change the arguments first."""
  getters = getattr(mesh.graph, "custom_getters", None)
  if getters:
    def next_getter(i, *args, **kw):
      if i < 0:
        return _get_variable(*args, **kw)
      return getters[i](lambda *a, **k: next_getter(i - 1, *a, **k), *args, **kw)
    return next_getter(len(getters) - 1, mesh, name, shape, dtype=dtype,
                       master_dtype=master_dtype, slice_dtype=slice_dtype,
                       activation_dtype=activation_dtype, initializer=initializer,
                       trainable=trainable, **kwargs)
  return _get_variable(mesh, name, shape, dtype, master_dtype, slice_dtype,
                       activation_dtype, initializer, trainable, **kwargs)


def _get_variable(mesh, name, shape, dtype=tf.float32, master_dtype=None,
                  slice_dtype=None, activation_dtype=None, initializer=None,
                  trainable=True, **kwargs):
  """get_variable without the custom getters."""
  if isinstance(dtype, VariableDType):
    vdtype = dtype
  else:
    dtype = tf.as_dtype(dtype) if dtype is not None else tf.float32
    vdtype = VariableDType(master_dtype or dtype, slice_dtype or dtype,
                           activation_dtype or dtype)
  if reuse_variables():
    scope = current_scope_name()
    existing = mesh.graph.variable_by_name(scope + "/" + name if scope else name)
    if existing is not None:
      if existing.shape != convert_to_shape(shape):
        raise ShapeError("variable %r is reused with shape %s but exists with shape %s"
                         % (existing.name, convert_to_shape(shape), existing.shape),
                         tensor=existing.name)
      return existing.outputs[0]
  return Variable(mesh, name, shape, vdtype, initializer, trainable, **kwargs).outputs[0]


def read_variable(var):
  """The value of a variable (a Variable op, or the tensor it produced), read through a
  ReadVariable op."""
  return ReadVariable(var).outputs[0]


def as_variable(var):
  """The Variable op behind var (a Variable, or its value tensor), else a clear error."""
  if isinstance(var, Variable):
    return var
  op = getattr(var, "operation", None)
  if isinstance(op, Variable):
    return op
  raise ShapeError("%r is not a variable (nor the value of one); assign needs the result "
                   "of mtf.get_variable" % (var,), tensor=getattr(var, "name", None))


class StackedVariable(Variable):
  """One variable holding several same-shaped variables, stacked on a new first dim
  "stacked" (the original made these when it stacked variables; see
  `Graph.rewrite_stack_variables`). Its initial value stacks theirs."""

  def __init__(self, vs):
    vs = list(vs)
    if not vs:
      raise ShapeError("StackedVariable needs at least one variable")
    for v in vs[1:]:
      if v.shape != vs[0].shape or v.master_dtype != vs[0].master_dtype:
        raise ShapeError("StackedVariable: %r %s (%s) differs from %r %s (%s)" % (
            v.name, v.shape, v.master_dtype.name, vs[0].name, vs[0].shape,
            vs[0].master_dtype.name), tensor=v.name)
    self._original_names = [v.name for v in vs]
    shape = Shape([Dimension("stacked", len(vs))] + vs[0].shape.dims)
    initial = lambda dims, dtype=None: tf.stack([v.initial_value() for v in vs])
    super().__init__(vs[0].mesh, "stacked/" + vs[0].name, shape,
                     VariableDType(vs[0].master_dtype, vs[0].slice_dtype,
                                   vs[0].activation_dtype),
                     initial, vs[0].trainable)

  @property
  def original_names(self):
    """Names of the stacked variables, in stacking order."""
    return list(self._original_names)


class ReadVariable(Operation):
  """A read of a variable: its value as a new tensor; the gradient passes through."""

  def __init__(self, var, name=None):
    var = as_variable(var)
    super().__init__([var.outputs[0]], name=name or "read_variable")
    self._var = var
    self._add_output(var.shape, var.dtype)

  def gradient(self, grad_ys):
    return grad_ys

  def lower(self, lowering):
    lowering.set_tensor_lowering(self.outputs[0], lowering.tensors[self.inputs[0]])
