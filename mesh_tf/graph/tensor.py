"""`Tensor`: a symbolic distributed tensor with named dimensions."""
import tensorflow as tf

from mesh_tf.shapes import convert_to_shape


def _elementwise(fn_name, reflected=False):
  """A binary Tensor operator: elementwise.<fn_name>(self, other), or (other, self)."""

  def operator(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    fn = getattr(elementwise, fn_name)
    return fn(other, self) if reflected else fn(self, other)
  return operator


class Tensor:
  """The output of an mtf Operation: a shape of named dims, a dtype, and a mesh.

  Python arithmetic broadcasts by dimension name: `x + y` has the union of both shapes.
  """

  def __init__(self, operation, shape, dtype, name=None, index=0):
    self._operation = operation
    self._shape = convert_to_shape(shape)
    self._dtype = tf.as_dtype(dtype)
    self._index = index
    self._name = name or "%s:%d" % (operation.name, index)

  def __repr__(self):
    return "Tensor[%s, %s, %s]" % (self._name, self._shape.to_string, self._dtype.name)

  __str__ = __repr__

  @property
  def shape(self):
    return self._shape

  @property
  def size(self):
    return self._shape.size

  @property
  def dtype(self):
    return self._dtype

  @property
  def name(self):
    return self._name

  @property
  def operation(self):
    return self._operation

  @property
  def mesh(self):
    return self._operation.mesh

  @property
  def graph(self):
    return self._operation.graph

  @property
  def to_string(self):
    return repr(self)

  # Operators (mesh_tf.ops.elementwise, imported lazily: the ops depend on this module).
  __add__ = _elementwise("add")
  __radd__ = _elementwise("add", reflected=True)
  __sub__ = _elementwise("sub")
  __rsub__ = _elementwise("sub", reflected=True)
  __mul__ = _elementwise("multiply")
  __rmul__ = _elementwise("multiply", reflected=True)
  __truediv__ = _elementwise("divide")
  __rtruediv__ = _elementwise("divide", reflected=True)
  __floordiv__ = _elementwise("floordiv")
  __rfloordiv__ = _elementwise("floordiv", reflected=True)
  __mod__ = _elementwise("mod")
  __rmod__ = _elementwise("mod", reflected=True)
  __pow__ = _elementwise("pow")
  __rpow__ = _elementwise("pow", reflected=True)

  def __neg__(self):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.negative(self)

  def __abs__(self):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.abs(self)
