"""A named tensor dimension."""

import collections
import numbers

from mesh_tf.errors import ShapeError


def _check_size(name, size):
  """Returns `size` as a plain int >= 0 (not a bool), or raises ShapeError."""
  if isinstance(size, bool) or not isinstance(size, numbers.Integral):
    raise ShapeError(
        "dimension %r: size must be an int >= 0, got %r (%s)"
        % (name, size, type(size).__name__), dim=name)
  size = int(size)
  if size < 0:
    raise ShapeError(
        "dimension %r: size must be an int >= 0, got %d" % (name, size),
        dim=name)
  return size


class Dimension(collections.namedtuple("Dimension", ["name", "size"])):
  """A (name, size) pair naming one axis of a tensor or a mesh."""

  __slots__ = ()

  def __new__(cls, name, size):
    if not isinstance(name, str) or not name:
      raise ShapeError(
          "dimension name must be a non-empty str, got %r" % (name,), dim=name)
    return super().__new__(cls, name, _check_size(name, size))

  def __str__(self):
    return "%s:%d" % (self.name, self.size)


class DimensionConversionError(ShapeError, TypeError):
  """convert_to_dimension got a value that is not a pair at all (an int, say): both the
  original's TypeError and the port's ShapeError."""


def convert_to_dimension(d):
  """Converts None, a Dimension or a (name, size) pair (any iterable of two items; not a
  "name:size" string); None stays None."""
  if d is None or isinstance(d, Dimension):
    return d
  if isinstance(d, str):
    raise ShapeError(
        "cannot convert the string %r to a Dimension; give a (name, size) pair or "
        "mtf.Dimension(name, size) (strings such as \"name:size\" are read only by "
        "convert_to_shape)" % (d,))
  try:
    items = tuple(d)
  except TypeError:
    raise DimensionConversionError(
        "cannot convert %r (%s) to a Dimension; expected None, a Dimension or a "
        "(name, size) pair" % (d, type(d).__name__)) from None
  if len(items) != 2:
    raise ShapeError(
        "cannot convert %r to a Dimension: a (name, size) pair has 2 items, got %d"
        % (d, len(items)))
  return Dimension(items[0], items[1])
