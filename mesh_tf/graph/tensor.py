"""`Tensor`: a symbolic distributed tensor with named dimensions."""
import tensorflow as tf

from mesh_tf.shapes import convert_to_shape


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

  # Operators. Imported lazily: the ops depend on this module.
  def __add__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.add(self, other)

  def __radd__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.add(other, self)

  def __sub__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.sub(self, other)

  def __rsub__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.sub(other, self)

  def __mul__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.multiply(self, other)

  def __rmul__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.multiply(other, self)

  def __truediv__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.divide(self, other)

  def __rtruediv__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.divide(other, self)

  def __floordiv__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.floordiv(self, other)

  def __rfloordiv__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.floordiv(other, self)

  def __mod__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.mod(self, other)

  def __rmod__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.mod(other, self)

  def __pow__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.pow(self, other)

  def __rpow__(self, other):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.pow(other, self)

  def __neg__(self):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.negative(self)

  def __abs__(self):
    from mesh_tf.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.abs(self)
