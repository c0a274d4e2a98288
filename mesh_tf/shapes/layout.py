"""Layout rules: which tensor dims are split over which mesh dims."""

import numbers
import re

from mesh_tf.errors import LayoutError
from mesh_tf.shapes.dimension import convert_to_dimension
from mesh_tf.shapes.shape import convert_to_shape

_SEPARATORS = re.compile(r"[;,.\s]+")


def _rule_str(tensor_dim_name, mesh_dim_name):
  return "%s:%s" % (tensor_dim_name, mesh_dim_name)


def _check_pair(pair, context):
  """Returns `pair` as a (str, str) tuple, or raises LayoutError."""
  if (not isinstance(pair, (tuple, list)) or len(pair) != 2
      or not all(isinstance(n, str) and n for n in pair)):
    raise LayoutError(
        "bad layout rule %r in %r; expected a (tensor_dim_name, "
        "mesh_dim_name) pair of non-empty strings" % (pair, context),
        rule=pair)
  return (pair[0], pair[1])


class LayoutRules(object):
  """An immutable ordered tuple of (tensor_dim_name, mesh_dim_name) rules."""

  __slots__ = ("_pairs",)

  def __init__(self, pairs=()):
    if isinstance(pairs, str):
      raise LayoutError(
          "LayoutRules() takes (tensor_dim, mesh_dim) pairs, got the string "
          "%r; use convert_to_layout_rules() to parse a string" % pairs)
    pairs = list(pairs)
    object.__setattr__(
        self, "_pairs", tuple(_check_pair(p, pairs) for p in pairs))

  def __setattr__(self, name, value):
    raise AttributeError("LayoutRules is immutable")

  def __reduce__(self):
    return (LayoutRules, (self._pairs,))

  def __iter__(self):
    return iter(self._pairs)

  def __len__(self):
    return len(self._pairs)

  def __eq__(self, other):
    if isinstance(other, LayoutRules):
      return self._pairs == other._pairs
    return NotImplemented

  def __hash__(self):
    return hash(self._pairs)

  def __str__(self):
    return ";".join(_rule_str(t, m) for t, m in self._pairs)

  def __repr__(self):
    return "LayoutRules(%r)" % str(self)

  def tensor_dimension_to_mesh_axis(self, tensor_dimension, mesh_shape):
    """The mesh axis that splits `tensor_dimension`, or None if none does.

    Args:
      tensor_dimension: a Dimension (or pair), or a dimension name.
      mesh_shape: a Shape, or anything convert_to_shape accepts.
    """
    name = (tensor_dimension if isinstance(tensor_dimension, str)
            else convert_to_dimension(tensor_dimension).name)
    return self._mesh_axis(name, convert_to_shape(mesh_shape), None, "")

  def _mesh_axis(self, name, mesh_shape, tensor_name, prefix):
    axes = [i for i, m in enumerate(mesh_shape)
            if (name, m.name) in self._pairs]
    if len(axes) > 1:
      mesh_dims = [mesh_shape[i].name for i in axes]
      raise LayoutError(
          "%stensor dim %s is split over several mesh dims %s of mesh %s by "
          "rules %s" % (prefix, name, mesh_dims, mesh_shape, self),
          tensor=tensor_name, dim=name, mesh_dim=mesh_dims[0], rule=str(self),
          hint="keep only one rule for %s among the mesh dims" % name)
    return axes[0] if axes else None

  def tensor_layout(self, tensor_shape, mesh_shape, tensor_name=None):
    """Returns the TensorLayout of `tensor_shape` on `mesh_shape`.

    Raises LayoutError if two tensor dims land on one mesh dim, or if a
    split dim's size is not divisible by its mesh dim's size.
    """
    tensor_shape = convert_to_shape(tensor_shape)
    mesh_shape = convert_to_shape(mesh_shape)
    dims = "[%s]" % ", ".join(str(d) for d in tensor_shape)
    what = "tensor \"%s\" %s" % (tensor_name, dims) if tensor_name else "tensor %s" % dims
    axes = []
    owner = {}  # mesh axis -> tensor Dimension already split over it
    for d in tensor_shape:
      axis = self._mesh_axis(d.name, mesh_shape, tensor_name, what + ": ")
      axes.append(axis)
      if axis is None:
        continue
      m = mesh_shape[axis]
      rule = _rule_str(d.name, m.name)
      if axis in owner:
        first = owner[axis]
        raise LayoutError(
            "%s: dims %s and %s are both split over mesh dim \"%s\" by rules "
            "\"%s\" and \"%s\" (rules: %s); a mesh dim can split at most one "
            "dim of a tensor" % (what, first.name, d.name, m.name,
                                 _rule_str(first.name, m.name), rule, self),
            tensor=tensor_name, dim=d.name, mesh_dim=m.name, rule=rule,
            hint="drop one of the two rules, or split %s or %s over another "
            "mesh dim" % (first.name, d.name))
      owner[axis] = d
      if m.size == 0 or d.size % m.size:
        raise LayoutError(
            "%s: dim %s=%d is split over mesh dim \"%s\" (size %d) by rule "
            "\"%s\"; %d does not divide %d"
            % (what, d.name, d.size, m.name, m.size, rule, m.size, d.size),
            tensor=tensor_name, dim=d.name, mesh_dim=m.name, rule=rule,
            hint="change the mesh shape, pad %s, or drop the rule" % d.name)
    return TensorLayout(axes)

  def mesh_dimension_name_to_tensor_dimension_names(self,
                                                     mesh_dimension_name):
    """The tensor dim names mapped to `mesh_dimension_name`, in rule order."""
    return [t for t, m in self._pairs if m == mesh_dimension_name]


def _parse_layout_string(s):
  """Parses "tdim:mdim" pieces separated by ';' ',' '.' or whitespace."""
  pairs = []
  for piece in _SEPARATORS.split(s.strip()):
    if not piece:
      continue
    tensor_dim, colon, mesh_dim = piece.partition(":")
    if not colon or not tensor_dim or not mesh_dim or ":" in mesh_dim:
      raise LayoutError(
          "cannot parse layout rules %r: bad piece %r; expected "
          "\"tensor_dim:mesh_dim\" pieces separated by ';', ',', '.' or "
          "spaces" % (s, piece), rule=piece)
    pairs.append((tensor_dim, mesh_dim))
  return LayoutRules(pairs)


def convert_to_layout_rules(x):
  """Converts LayoutRules, None, a string, a list of pairs or a dict."""
  if isinstance(x, LayoutRules):
    return x
  if x is None:
    return LayoutRules()
  if isinstance(x, str):
    return _parse_layout_string(x)
  if isinstance(x, dict):
    return LayoutRules(x.items())
  if isinstance(x, (list, tuple)):
    return LayoutRules(x)
  raise LayoutError(
      "cannot convert %r (%s) to LayoutRules; expected None, LayoutRules, a "
      "string like \"batch:rows;d_ff:cols\", a list of (tensor_dim, mesh_dim) "
      "pairs or a dict {tensor_dim: mesh_dim}" % (x, type(x).__name__))


def _check_mesh_axis(a, axes):
  if a is None:
    return None
  if isinstance(a, bool) or not isinstance(a, numbers.Integral) or a < 0:
    raise LayoutError(
        "TensorLayout entries must be None or ints >= 0, got %r in %r"
        % (a, axes))
  return int(a)


class TensorLayout(object):
  """For each tensor axis, the mesh axis splitting it, or None if replicated."""

  __slots__ = ("_axes",)

  def __init__(self, tensor_axis_to_mesh_axis):
    axes = list(tensor_axis_to_mesh_axis)
    object.__setattr__(
        self, "_axes", tuple(_check_mesh_axis(a, axes) for a in axes))

  def __setattr__(self, name, value):
    raise AttributeError("TensorLayout is immutable")

  def __reduce__(self):
    return (TensorLayout, (self._axes,))

  @property
  def tensor_axis_to_mesh_axis(self):
    """For each tensor axis, the mesh axis splitting it, or None (a tuple)."""
    return self._axes

  def __len__(self):
    return len(self._axes)

  def __getitem__(self, key):
    return self._axes[key]

  def __iter__(self):
    return iter(self._axes)

  def __eq__(self, other):
    if isinstance(other, TensorLayout):
      return self._axes == other._axes
    return NotImplemented

  def __hash__(self):
    return hash(self._axes)

  def __str__(self):
    return "TensorLayout(%s)" % ", ".join(str(a) for a in self._axes)

  __repr__ = __str__

  @property
  def is_fully_replicated(self):
    """Whether no tensor axis is split."""
    return all(a is None for a in self._axes)

  @property
  def mesh_axes(self):
    """The mesh axes that split some tensor axis, in tensor-axis order."""
    return [a for a in self._axes if a is not None]

  def mesh_axis_to_tensor_axis(self, mesh_ndims):
    """A tuple of length mesh_ndims: per mesh axis, the tensor axis it splits, or None.

    Only mesh axes below mesh_ndims are looked at (as in the original): larger ones are
    not an error.
    """
    return tuple(self._axes.index(m) if m in self._axes else None
                 for m in range(mesh_ndims))
