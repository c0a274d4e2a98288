"""Slicing along one named dim: slice, pad, concat, split, stack, unstack, shift.

Each is a slice-wise op that needs its dim whole: a split dim is gathered first (an
allconcat) and the result cut back to the layout.
"""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation
from mesh_tf.lowering.plan_interpreter import lower_planned
from mesh_tf.ops.slicewise import SlicewiseOperation
from mesh_tf.plans.rules import shift_plan
from mesh_tf.shapes import Dimension, Shape


def _dim_index(x, dim_name, fn_name):
  name = dim_name.name if isinstance(dim_name, Dimension) else dim_name
  if name not in x.shape.dimension_names:
    raise ShapeError("%s: no dim %r in %s %s (dims: %s)" % (
        fn_name, name, x.name, x.shape, x.shape.dimension_names), tensor=x.name, dim=name)
  return x.shape.dimension_names.index(name), name


def _others(shape, name):
  return [n for n in shape.dimension_names if n != name]


class SliceOperation(SlicewiseOperation):
  """x[begin:begin+size] along slice_dim_name (the dim keeps its name, with the new size)."""

  def __init__(self, x, begin, size, slice_dim_name, name=None):
    axis, dim_name = _dim_index(x, slice_dim_name, "slice")
    full = x.shape[axis].size
    if not (0 <= begin and size >= 0 and begin + size <= full):
      raise ShapeError("slice of %s: [%d, %d) is outside dim %s=%d" % (
          x.name, begin, begin + size, dim_name, full), tensor=x.name, dim=dim_name)

    def grad(op, grad_ys):
      del op
      return [pad(grad_ys[0], [begin, full - begin - size], dim_name)]
    super().__init__(lambda t: _take(t, axis, begin, size), [x],
                     x.shape.resize_dimension(dim_name, size), x.dtype,
                     _others(x.shape, dim_name), grad, name=name or "slice")


def slice(x, begin, size, slice_dim_name, name=None):  # pylint: disable=redefined-builtin
  """x[begin:begin+size] along slice_dim_name (the dim keeps its name, with the new size)."""
  return SliceOperation(x, begin, size, slice_dim_name, name=name).outputs[0]


mtf_slice = slice


class PadOperation(SlicewiseOperation):
  """Zero-pads x by paddings = [before, after] along pad_dim_name."""

  def __init__(self, x, paddings, pad_dim_name, name=None):
    axis, dim_name = _dim_index(x, pad_dim_name, "pad")
    before, after = paddings
    size = x.shape[axis].size

    def fn(t):
      p = [[0, 0]] * t.shape.rank
      p[axis] = [before, after]
      return tf.pad(t, p)

    def grad(op, grad_ys):
      del op
      return [slice(grad_ys[0], before, size, dim_name)]
    super().__init__(fn, [x], x.shape.resize_dimension(dim_name, size + before + after),
                     x.dtype, _others(x.shape, dim_name), grad, name=name or "pad")


def pad(x, paddings, dim_name, name=None):
  """Zero-pads x by paddings = [before, after] along dim_name."""
  return PadOperation(x, paddings, dim_name, name=name).outputs[0]


class ConcatOperation(SlicewiseOperation):
  """Concatenates xs (identical but for concat_dim_name) along that dim."""

  def __init__(self, xs, concat_dim_name, name=None):
    xs = list(xs)
    axis, dim_name = _dim_index(xs[0], concat_dim_name, "concat")
    rest = xs[0].shape - [dim_name]
    for x in xs[1:]:
      if x.dtype != xs[0].dtype:
        raise ShapeError("concat: dtype mismatch between %s (%s) and %s (%s)" % (
            xs[0].name, xs[0].dtype.name, x.name, x.dtype.name), tensor=x.name)
      if x.shape - [dim_name] != rest or _dim_index(x, dim_name, "concat")[0] != axis:
        raise ShapeError("concat along %r: %s %s does not match %s %s apart from that dim"
                         % (dim_name, x.name, x.shape, xs[0].name, xs[0].shape),
                         tensor=x.name, dim=dim_name)
    sizes = [x.shape[axis].size for x in xs]
    out_shape = xs[0].shape.resize_dimension(dim_name, sum(sizes))

    def grad(op, grad_ys):
      del op
      return list(split(grad_ys[0], out_shape[axis], sizes))
    super().__init__(lambda *ts: tf.concat(ts, axis), xs, out_shape, xs[0].dtype,
                     _others(xs[0].shape, dim_name), grad, name=name or "concat")


def concat(xs, concat_dim_name, name=None):
  """Concatenates xs (identical but for concat_dim_name) along that dim."""
  return ConcatOperation(xs, concat_dim_name, name=name).outputs[0]


def _parts_or_zeros(op, grad_ys):
  from mesh_tf.ops.elementwise import zeros_like  # pylint: disable=g-import-not-at-top
  return [g if g is not None else zeros_like(y) for g, y in zip(grad_ys, op.outputs)]


class SplitOperation(SlicewiseOperation):
  """Splits x along split_dim into equal parts (an int) or parts of the given sizes."""

  def __init__(self, x, split_dim, num_or_size_splits, name=None):
    axis, dim_name = _dim_index(x, split_dim, "split")
    size = x.shape[axis].size
    if isinstance(num_or_size_splits, int):
      if size % num_or_size_splits:
        raise ShapeError("split of %s: dim %s=%d is not divisible into %d parts" % (
            x.name, dim_name, size, num_or_size_splits), tensor=x.name, dim=dim_name)
      sizes = [size // num_or_size_splits] * num_or_size_splits
    else:
      sizes = list(num_or_size_splits)
      if sum(sizes) != size:
        raise ShapeError("split of %s: sizes %s do not add up to dim %s=%d" % (
            x.name, sizes, dim_name, size), tensor=x.name, dim=dim_name)
    shapes = [x.shape.resize_dimension(dim_name, s) for s in sizes]

    def grad(op, grad_ys):
      return [concat(_parts_or_zeros(op, grad_ys), dim_name)]
    super().__init__(lambda t: tuple(tf.split(t, sizes, axis)), [x], shapes,
                     [x.dtype] * len(sizes), _others(x.shape, dim_name), grad,
                     name=name or "split")


def split(x, split_dim, num_or_size_splits, name=None):
  """Splits x along split_dim into equal parts (an int) or parts of the given sizes."""
  return list(SplitOperation(x, split_dim, num_or_size_splits, name=name).outputs)


class StackOperation(SlicewiseOperation):
  """Stacks same-shaped xs along a new dim `dim_name` (of size len(xs)) at position axis."""

  def __init__(self, xs, dim_name, axis, name=None):
    xs = list(xs)
    for x in xs[1:]:
      if x.shape != xs[0].shape or x.dtype != xs[0].dtype:
        raise ShapeError("stack: %s %s differs from %s %s" % (
            x.name, x.shape, xs[0].name, xs[0].shape), tensor=x.name)
    new_dim = Dimension(dim_name, len(xs))
    dims = xs[0].shape.dims
    rank = len(dims)
    if not -rank - 1 <= axis <= rank:
      raise ShapeError("stack: axis %d is out of range for inputs of rank %d (use -%d..%d)"
                       % (axis, rank, rank + 1, rank), tensor=xs[0].name)
    axis = axis + rank + 1 if axis < 0 else axis
    out_shape = Shape(dims[:axis] + [new_dim] + dims[axis:])

    def grad(op, grad_ys):
      del op
      return unstack(grad_ys[0], new_dim)
    super().__init__(lambda *ts: tf.stack(ts, axis), xs, out_shape, xs[0].dtype,
                     xs[0].shape.dimension_names, grad, name=name or "stack")


def stack(xs, dim_name, axis=0, name=None):
  """Stacks same-shaped xs along a new dim `dim_name` (of size len(xs)) at position axis
  (negative: from the end, as in tf.stack, so -1 makes it the last dim)."""
  return StackOperation(xs, dim_name, axis, name=name).outputs[0]


class UnstackOperation(SlicewiseOperation):
  """The list of slices of x along dim (which is removed)."""

  def __init__(self, x, dim, name=None):
    axis, dim_name = _dim_index(x, dim, "unstack")
    n = x.shape[axis].size
    out_shape = x.shape - [dim_name]

    def grad(op, grad_ys):
      return [stack(_parts_or_zeros(op, grad_ys), dim_name, axis)]
    super().__init__(lambda t: tuple(tf.unstack(t, n, axis)), [x], [out_shape] * n,
                     [x.dtype] * n, out_shape.dimension_names, grad,
                     name=name or "unstack")


def unstack(x, dim, name=None):
  """The list of slices of x along dim (which is removed)."""
  return list(UnstackOperation(x, dim, name=name).outputs)


def _local_shift(t, offset, axis, size, wrap):
  """Shift of a tensor holding the whole dim (size elements along axis)."""
  if wrap:
    # Two no-wrap shifts (x, and the part that falls off moved to the other end): under
    # XLA's SPMD partitioner tf.roll of a split dim would reshard with all-to-alls.
    offset %= size
    if offset == 0:
      return t
    fell_off = _local_shift(t, offset - size, axis, size, wrap=False)
    return _local_shift(t, offset, axis, size, wrap=False) + fell_off
  if abs(offset) >= size:
    return tf.zeros_like(t)
  p = [[0, 0]] * t.shape.rank
  if offset >= 0:
    p[axis] = [offset, 0]
    return tf.pad(_take(t, axis, 0, size - offset), p)
  p[axis] = [0, -offset]
  return tf.pad(_take(t, axis, -offset, size + offset), p)


def _take(t, axis, begin, size):
  b = [0] * t.shape.rank
  s = [-1] * t.shape.rank
  b[axis], s[axis] = begin, size
  return tf.slice(t, b, s)


class ShiftOperation(Operation):
  """Static shift along one dim. When the dim is split and |offset| fits in one slice,
  each processor receives its neighbour's slice (one `shift_by_n_processors`) and keeps
  the |offset| edge it needs, instead of gathering the dim."""

  def __init__(self, x, offset, dim, wrap, name=None):
    _, dim_name = _dim_index(x, dim, "shift")
    super().__init__([x], name=name or "shift")
    self._axis = x.shape.dimension_names.index(dim_name)
    self._offset, self._dim_name, self._wrap = offset, dim_name, wrap
    self._add_output(x.shape, x.dtype)

  @property
  def offset(self):
    return self._offset

  @property
  def dim_name(self):
    return self._dim_name

  def gradient(self, grad_ys):
    return [shift(grad_ys[0], -self._offset, self._dim_name, self._wrap)]

  def plan(self, layout):
    """The OpPlan on a MeshLayout (see plans/rules.shift_plan)."""
    return shift_plan(layout, self.inputs[0].shape, self._dim_name, self._offset,
                      self._wrap)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x = self.inputs[0]
    axis, offset, wrap = self._axis, self._offset, self._wrap
    plan = self.plan(impl.slice_layout)
    if len(plan.operands) == 1:  # the dim is whole here (or gathered by the plan)
      size = x.shape[axis].size
      lower_planned(lowering, self, plan, lambda t: _local_shift(t, offset, axis, size, wrap))
      return
    local = impl.slice_shape(x.shape)[axis]
    k = abs(offset)
    if offset > 0:
      fn = lambda own, prev: tf.concat(
          [_take(prev, axis, local - k, k), _take(own, axis, 0, local - k)], axis)
    else:
      fn = lambda own, nxt: tf.concat(
          [_take(own, axis, k, local - k), _take(nxt, axis, 0, k)], axis)
    lower_planned(lowering, self, plan, fn)


def shift(x, offset, dim, wrap, name=None):
  """Moves x by offset positions along dim: zero-filled, or rotated if wrap."""
  return ShiftOperation(x, offset, dim, wrap, name=name).outputs[0]
