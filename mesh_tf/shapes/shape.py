"""An ordered list of uniquely named dimensions, and helpers over such lists."""

import math
import re

from mesh_tf.errors import ShapeError
from mesh_tf.shapes.dimension import Dimension
from mesh_tf.shapes.dimension import convert_to_dimension

# Separators accepted between "name:size" pieces of a shape string.
_SEPARATORS = re.compile(r"[;,.\s]+")
_INT = re.compile(r"-?[0-9]+")


def _dims_str(dims):
  return "[%s]" % ", ".join(str(d) for d in dims)


class Shape(object):
  """An immutable, hashable sequence of Dimensions with distinct names."""

  __slots__ = ("_dims",)

  def __init__(self, dims=()):
    if isinstance(dims, Shape):
      dims = dims.dims
    elif isinstance(dims, str):
      raise ShapeError(
          "Shape() takes Dimensions or (name, size) pairs, got the string %r; "
          "use convert_to_shape() to parse a string" % dims)
    converted = []
    for d in dims:
      if d is None:
        raise ShapeError("Shape() got None among its dimensions %r" % (dims,))
      converted.append(convert_to_dimension(d))
    seen = set()
    for d in converted:
      if d.name in seen:
        raise ShapeError(
            "dimension name %r appears twice in shape %s"
            % (d.name, _dims_str(converted)), dim=d.name)
      seen.add(d.name)
    object.__setattr__(self, "_dims", tuple(converted))

  def __setattr__(self, name, value):
    raise AttributeError("Shape is immutable")

  def __reduce__(self):
    return (Shape, (self._dims,))

  @property
  def dims(self):
    """The dimensions, as a new list."""
    return list(self._dims)

  @property
  def ndims(self):
    """The number of dimensions."""
    return len(self._dims)

  @property
  def size(self):
    """The number of elements: the product of the sizes (1 for no dims)."""
    return list_product(d.size for d in self._dims)

  @property
  def to_integer_list(self):
    """The sizes, as a list of ints."""
    return [d.size for d in self._dims]

  @property
  def dimension_names(self):
    """The names, as a list of str."""
    return [d.name for d in self._dims]

  @property
  def cumprod(self):
    """Row-major strides: for each axis, the product of the sizes after it."""
    return [list_product(d.size for d in self._dims[i + 1:]) for i in range(len(self._dims))]

  @property
  def to_string(self):
    """The "a:2;b:3" form, which convert_to_shape parses back."""
    return ";".join(str(d) for d in self._dims)

  def cumprod_to_tensor_axis(self, cumprod):
    """Returns the innermost axis whose stride is `cumprod`, or None."""
    strides = self.cumprod
    return next((a for a in reversed(range(len(strides))) if strides[a] == cumprod), None)

  def has_dim(self, name):
    """Whether a dimension called `name` is in this shape."""
    return any(d.name == name for d in self._dims)

  def index_of(self, name):
    """Returns the axis of the dimension called `name`."""
    for i, d in enumerate(self._dims):
      if d.name == name:
        return i
    raise ShapeError(
        "no dimension %r in shape %s; valid names: %s"
        % (name, self, self.dimension_names), dim=name)

  def get_dim_by_name(self, name):
    """Returns the Dimension called `name`."""
    return self._dims[self.index_of(name)]

  def rename_dimension(self, old_name, new_name):
    """Returns a copy with dimension `old_name` renamed to `new_name`."""
    i = self.index_of(old_name)
    dims = self.dims
    dims[i] = Dimension(new_name, dims[i].size)
    return Shape(dims)

  def resize_dimension(self, name, new_size):
    """Returns a copy with dimension `name` given size `new_size`."""
    i = self.index_of(name)
    dims = self.dims
    dims[i] = Dimension(name, new_size)
    return Shape(dims)

  def __len__(self):
    return len(self._dims)

  def __getitem__(self, key):
    if isinstance(key, slice):
      return Shape(self._dims[key])
    return self._dims[key]

  def __iter__(self):
    return iter(self._dims)

  def __eq__(self, other):
    if isinstance(other, Shape):
      return self._dims == other._dims
    if isinstance(other, (list, tuple)):
      return self._dims == tuple(other)
    return NotImplemented

  def __hash__(self):
    return hash(self._dims)

  def __add__(self, other):
    if isinstance(other, (Shape, list, tuple)):
      return Shape(self.dims + Shape(other).dims)
    return NotImplemented

  def __radd__(self, other):
    if isinstance(other, (list, tuple)):
      return Shape(Shape(other).dims + self.dims)
    return NotImplemented

  def __sub__(self, other):
    """Removes dims given by name or as Dimensions; absent ones are ignored.

    A Dimension is removed only if both name and size match; a name removes
    whatever dimension has that name.
    """
    if other is None:
      return self
    if isinstance(other, (str, Dimension)):
      other = [other]
    names = set()
    dims = set()
    for d in other:
      if isinstance(d, str):
        names.add(d)
      else:
        dims.add(convert_to_dimension(d))
    return Shape([d for d in self._dims
                  if d.name not in names and d not in dims])

  def __str__(self):
    return "Shape[%s]" % ", ".join(
        "%s=%d" % (d.name, d.size) for d in self._dims)

  __repr__ = __str__


def _parse_shape_string(s):
  """Parses "a:2;b:3" (any of ';' ',' '.' or whitespace between pieces)."""
  dims = []
  for piece in _SEPARATORS.split(s.strip()):
    if not piece:
      continue
    name, colon, size = piece.partition(":")
    problem = None
    if not colon:
      problem = "missing ':' between name and size"
    elif not name:
      problem = "empty dimension name"
    elif not _INT.fullmatch(size):
      problem = "size %r is not an integer" % size
    elif int(size) < 0:
      problem = "size %s is negative" % size
    if problem:
      raise ShapeError(
          "cannot parse shape string %r: bad piece %r (%s); expected "
          "\"name:size\" pieces separated by ';', ',', '.' or spaces"
          % (s, piece, problem), dim=name or None)
    dims.append(Dimension(name, int(size)))
  return Shape(dims)


def convert_to_shape(x):
  """Converts None, a Shape, a list of dims/pairs or a "a:2;b:3" string."""
  if x is None or isinstance(x, Shape):
    return x
  if isinstance(x, str):
    return _parse_shape_string(x)
  if isinstance(x, (list, tuple)):
    return Shape(x)
  raise ShapeError(
      "cannot convert %r (%s) to a Shape; expected None, a Shape, a list of "
      "Dimensions or (name, size) pairs, or a string like \"a:2;b:3\""
      % (x, type(x).__name__))


def list_product(l):
  """The product of the numbers in `l` (1 if empty)."""
  return math.prod(l)


def is_subsequence(short_seq, long_seq):
  """Whether `short_seq` appears in `long_seq` in order, maybe with gaps."""
  it = iter(long_seq)
  return all(any(x == y for y in it) for x in short_seq)


def transpose_list_of_lists(lol):
  """Transposes a rectangular list of lists; [] stays []."""
  if not lol:
    return []
  lengths = set(len(row) for row in lol)
  if len(lengths) != 1:
    raise ShapeError(
        "cannot transpose rows of different lengths %s" % sorted(lengths))
  return [list(col) for col in zip(*lol)]


def combined_dimension(dims, name=None):
  """A Dimension whose size is the product of `dims`' sizes.

  The name defaults to the dims' names joined by '_'.
  """
  dims = [convert_to_dimension(d) for d in dims]
  if name is None:
    if not dims:
      raise ShapeError("combined_dimension of no dims needs a name")
    name = "_".join(d.name for d in dims)
  return Dimension(name, list_product(d.size for d in dims))


def anonymous_shape(shape):
  """The same sizes as `shape`, with dims renamed "_anonymous_0", ..."""
  shape = convert_to_shape(shape)
  return Shape([Dimension("_anonymous_%d" % i, d.size)
                for i, d in enumerate(shape)])


def shape_union(shapes):
  """All dims of `shapes`, in order of first appearance, each once."""
  by_name = {}
  dims = []
  for shape in shapes:
    for d in convert_to_shape(shape):
      old = by_name.get(d.name)
      if old is None:
        by_name[d.name] = d
        dims.append(d)
      elif old.size != d.size:
        raise ShapeError(
            "shape_union: dimension %r has size %d in one shape and %d in "
            "another (%s vs %s)" % (d.name, old.size, d.size, old, d),
            dim=d.name)
  return Shape(dims)
