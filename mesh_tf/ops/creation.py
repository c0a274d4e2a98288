"""Creating mtf tensors: from TF values (import), constants, zeros/ones/fill."""
import numpy as np
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation
from mesh_tf.shapes import convert_to_shape


def _python_value_dtype(value):
  """The dtype tf.convert_to_tensor gives a Python value: int32, bool or float32."""
  kind = np.asarray(value).dtype.kind
  return {"i": tf.int32, "u": tf.int32, "b": tf.bool}.get(kind, tf.float32)


class ImportOperation(Operation):
  """Brings a TF value onto the mesh, laid out by the layout rules.

  The value is read when the op is lowered (a tf.Variable afresh by every lowering). A
  `tf.TensorSpec` makes a placeholder, whose value each Lowering takes from its `feeds`."""

  def __init__(self, mesh, tf_tensor, shape, name=None):
    super().__init__([], mesh=mesh, name=name or "import")
    shape = convert_to_shape(shape)
    static = getattr(tf_tensor, "shape", None)
    if static is None:
      static = np.shape(tf_tensor)
    static = tf.TensorShape(static)
    if static.rank is not None and not static.is_compatible_with(shape.to_integer_list):
      raise ShapeError("import %r: TF value of shape %s does not match mtf shape %s"
                       % (self.name, static, shape), op=self.name)
    self._tf_value = tf_tensor
    dtype = getattr(tf_tensor, "dtype", None)
    self._add_output(shape, tf.as_dtype(dtype) if dtype is not None else
                     _python_value_dtype(tf_tensor))

  @property
  def has_gradient(self):
    return False

  def lower(self, lowering):
    y = self.outputs[0]
    value = lowering.feeds.get(y, self._tf_value)
    if isinstance(value, tf.TensorSpec):
      raise ShapeError("import %r is a placeholder (%s) and was not fed: pass "
                       "Lowering(..., feeds={tensor: value})" % (self.name, value),
                       op=self.name, tensor=y.name)
    impl = lowering.mesh_impl(self)
    static = _static_value(value, y)
    if static is not None:
      lowering.set_tensor_lowering(y, impl.import_constant(y, static))
      return
    value = tf.convert_to_tensor(value, dtype=y.dtype)
    # A backend fed each process's share of an input checks the shape itself.
    if (not getattr(impl, "imports_process_share", False)
        and value.shape.as_list() != y.shape.to_integer_list):
      value = tf.reshape(value, y.shape.to_integer_list)
    lowering.set_tensor_lowering(y, impl.import_tf_tensor(y, value))


# Larger known values go through import_tf_tensor as one tensor (no per-slice constants).
_MAX_STATIC_ELEMENTS = 4096


def _static_value(value, y):
  """The value as a numpy array of y's shape when it is small and known now, else None."""
  if y.shape.size > _MAX_STATIC_ELEMENTS:
    return None
  if isinstance(value, tf.Tensor) and not tf.is_symbolic_tensor(value):
    array = value.numpy() if value.dtype == y.dtype else None
  elif isinstance(value, (np.ndarray, np.generic)):
    array = value if value.dtype == y.dtype.as_numpy_dtype else None
  elif isinstance(value, (int, float)) and not isinstance(value, bool) and (
      y.dtype.is_floating):
    array = np.asarray(value, y.dtype.as_numpy_dtype)
  else:
    array = None
  if array is None or array.size != y.shape.size:  # e.g. a process's share of an input
    return None
  return np.reshape(array, y.shape.to_integer_list)


def import_tf_tensor(mesh, tf_tensor, shape=None, name=None):
  """An mtf Tensor of `shape` holding tf_tensor (a tf.Tensor, tf.Variable or array)."""
  if shape is None:
    if tf.TensorShape(getattr(tf_tensor, "shape", np.shape(tf_tensor))).rank != 0:
      raise ShapeError("import_tf_tensor needs a shape for a non-scalar value")
    shape = []
  return ImportOperation(mesh, tf_tensor, shape, name=name).outputs[0]


def import_fully_replicated(mesh, tf_tensor, shape, name=None):
  """Like import_tf_tensor; the value is available whole, so each processor slices it."""
  return ImportOperation(mesh, tf_tensor, shape, name=name).outputs[0]


def _slices_of(laid_out_tensor):
  """The tf.Tensors of a laid-out value: its `tensor_list`, else its `all_slices`."""
  slices = getattr(laid_out_tensor, "tensor_list", None)
  if slices is None:
    slices = getattr(laid_out_tensor, "all_slices", None)
  if not slices:
    raise ShapeError("import_laid_out_tensor: %r has no tensor_list / all_slices of "
                     "tf.Tensors" % (laid_out_tensor,))
  return list(slices)


class ImportLaidOutTensorOperation(Operation):
  """Wraps a value already laid out for the mesh's MeshImpl: a backend LaidOutTensor or,
  as in the original, any object holding the backend's slices as `tensor_list` (or
  `all_slices`), rebuilt as the backend's own LaidOutTensor when lowered."""

  def __init__(self, mesh, laid_out_tensor, shape, name=None):
    super().__init__([], mesh=mesh, name=name or "import_laid_out")
    self._laid_out = laid_out_tensor
    dtype = _slices_of(laid_out_tensor)[0].dtype
    self._add_output(shape, dtype)

  @property
  def unsplittable_dims(self):
    """All dims: the value is laid out already, for one particular layout."""
    return frozenset(self.outputs[0].shape.dimension_names)

  def lower(self, lowering):
    value = self._laid_out
    if hasattr(value, "to_laid_out_tensor"):
      value = value.to_laid_out_tensor()
    else:
      value = lowering.mesh_impl(self).LaidOutTensor(_slices_of(value))
    lowering.set_tensor_lowering(self.outputs[0], value)


def import_laid_out_tensor(mesh, laid_out_tensor, shape, name=None):
  """An mtf Tensor from a backend LaidOutTensor."""
  return ImportLaidOutTensorOperation(mesh, laid_out_tensor, convert_to_shape(shape),
                                      name=name).outputs[0]


class Constant(Operation):
  """A tensor filled with a scalar, built per slice (nothing is transferred)."""

  def __init__(self, mesh, value, shape, dtype, name=None):
    super().__init__([], mesh=mesh, name=name or "constant")
    self._value = value
    self._add_output(convert_to_shape(shape), dtype)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    y = self.outputs[0]
    sizes = impl.slice_shape(y.shape)
    value = self._value
    lowering.set_tensor_lowering(y, impl.slicewise(
        lambda: tf.fill(sizes, tf.constant(value, dtype=y.dtype))))


def constant(mesh, value, shape=None, dtype=tf.float32, name=None):
  """A tensor of `shape` from a scalar (filled) or an array of the full shape."""
  dtype = tf.as_dtype(dtype)
  shape = convert_to_shape(shape if shape is not None else [])
  if np.ndim(value) == 0:
    return Constant(mesh, value, shape, dtype, name=name).outputs[0]
  return import_tf_tensor(mesh, tf.constant(value, dtype=dtype), shape, name=name)


def fill(mesh, shape, value, dtype=tf.float32, name=None):
  """A tensor of `shape` with every element equal to value."""
  return Constant(mesh, value, shape, tf.as_dtype(dtype), name=name).outputs[0]


def zeros(mesh, shape, dtype=tf.float32):
  """All zeros."""
  return fill(mesh, shape, 0, dtype, name="zeros")


def ones(mesh, shape, dtype=tf.float32):
  """All ones."""
  return fill(mesh, shape, 1, dtype, name="ones")
