"""Max and average pooling (VALID padding) over the trailing spatial dims, and its gradient.

Inputs are [batch dims..., spatial dims..., channels]; output spatial dims keep their
names. Batch and channel dims may be split; a split spatial dim stays split when the
windows tile it exactly (strides == ksize), else it is gathered and cut back after.
"""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation
from mesh_tf.lowering.plan_interpreter import lower_planned
from mesh_tf.ops.slicewise import slicewise
from mesh_tf.plans.rules import whole_dims_plan
from mesh_tf.shapes import Dimension, Shape

# fn string -> (number of spatial dims, is max pooling, TF pooling function).
_POOLS = {
    "MAX_2D": (2, True, tf.nn.max_pool2d),
    "AVG_2D": (2, False, tf.nn.avg_pool2d),
    "MAX_3D": (3, True, tf.nn.max_pool3d),
    "AVG_3D": (3, False, tf.nn.avg_pool3d),
}


def _pool_kind(pool_fn_string, what):
  try:
    return _POOLS[pool_fn_string]
  except KeyError:
    raise ShapeError("%s: unknown pooling %r; use one of %s" % (
        what, pool_fn_string, sorted(_POOLS))) from None


def pool_fn(pool_fn_string):
  """The TF pooling function fn(value, ksize, strides, padding) for "MAX_2D", "AVG_2D",
  "MAX_3D" or "AVG_3D"."""
  return _pool_kind(pool_fn_string, "pool_fn")[2]


def _window(values, n, what, role):
  values = [int(v) for v in values]
  if len(values) != n or any(v < 1 for v in values):
    raise ShapeError("%s: %s %s must be %d positive ints (one per spatial dim)" % (
        what, role, values, n))
  return values


def _flat(t, keep):
  return tf.reshape(t, [-1] + t.shape.as_list()[t.shape.rank - keep:])


def _unflat(t, like):
  return tf.reshape(t, like.shape.as_list()[:like.shape.rank - t.shape.rank + 1] +
                    t.shape.as_list()[1:])


class _PoolBase(Operation):
  """What pooling and its gradient share: geometry and which spatial dims go whole."""

  def _setup(self, x, ksize, strides, pool_fn_string, what):
    self._n, self._is_max, self._tf_pool = _pool_kind(pool_fn_string, what)
    n = self._n
    if x.shape.ndims < n + 1:
      raise ShapeError(
          "%s: input %s has shape %s; %s pooling needs [batch dims..., %d spatial dims, "
          "channels]" % (what, x.name, x.shape, pool_fn_string, n), tensor=x.name)
    self._ksize = _window(ksize, n, what, "ksize")
    self._strides = _window(ksize if strides is None else strides, n, what, "strides")
    self._pool_fn_string = pool_fn_string
    spatial = x.shape.dims[-n - 1:-1]
    out = []
    for d, k, s in zip(spatial, self._ksize, self._strides):
      size = (d.size - k) // s + 1 if d.size >= k else 0
      if size < 1:
        raise ShapeError("%s: window %d does not fit in dim %s of %s" % (
            what, k, d, x.name), tensor=x.name, dim=d.name)
      out.append(Dimension(d.name, size))
    self._pooled_shape = Shape(x.shape.dims[:-n - 1] + out + x.shape.dims[-1:])
    # Only dims whose windows overlap or do not tile them are gathered, whatever the op
    # declares (PoolOperation: spatial dims unsplittable; its gradient: none).
    self._whole = frozenset(d.name for d, k, s in zip(spatial, self._ksize, self._strides)
                            if k != s or d.size % k)

  def _tf_window(self, values):
    return [1] + list(values) + [1]

  def plan(self, layout):
    """The OpPlan on a MeshLayout: gather the unsplittable dims, cut them after."""
    return whole_dims_plan(layout, [x.shape for x in self.inputs],
                           [y.shape for y in self.outputs], self._whole)

  def _lower_with(self, lowering, fn):
    plan = self.plan(lowering.mesh_impl(self).slice_layout)
    lower_planned(lowering, self, plan, fn)


class PoolOperation(_PoolBase):
  """Pools x with windows ksize and strides (default ksize, i.e. non-overlapping)."""

  def __init__(self, x, ksize, strides, pool_fn_string, name=None):
    what = name or "pool"
    super().__init__([x], name=what)
    self._setup(x, ksize, strides, pool_fn_string, what)
    self._add_output(self._pooled_shape, x.dtype)
    spatial = [d.name for d in x.shape.dims[-self._n - 1:-1]]
    self._splittable_dims, self._unsplittable_dims = (
        self._initialize_splittable_and_unsplittable_dims("splittable", spatial))

  def gradient(self, grad_ys):
    return [PoolBackPropOperation(self.inputs[0], self.outputs[0], grad_ys[0], self._ksize,
                                  self._strides, self._pool_fn_string).outputs[0]]

  def lower(self, lowering):
    n = self._n

    def fn(t):
      out = self._tf_pool(_flat(t, n + 1), self._tf_window(self._ksize),
                          self._tf_window(self._strides), "VALID")
      return _unflat(out, t)
    self._lower_with(lowering, fn)


class PoolBackPropOperation(_PoolBase):
  """Gradient of PoolOperation: dx from dy, the pooled input x and its output y."""

  def __init__(self, x, y, dy, ksize, strides, pool_fn_string, name=None):
    what = name or "pool_backprop"
    super().__init__([dy, x, y], name=what)
    self._setup(x, ksize, strides, pool_fn_string, what)
    for t in (dy, y):
      if t.shape != self._pooled_shape:
        raise ShapeError("%s: %s has shape %s, but pooling %s gives %s" % (
            what, t.name, t.shape, x.name, self._pooled_shape), tensor=t.name)
    self._add_output(x.shape, x.dtype)

  def gradient(self, grad_ys):
    """Only dy gets a gradient: dx is linear in dy and piecewise constant in x and y."""
    (_, x, y), ddx = self.inputs, grad_ys[0]
    if not self._is_max:  # AvgPoolGrad is the adjoint of average pooling
      return [PoolOperation(ddx, self._ksize, self._strides,
                            self._pool_fn_string).outputs[0], None, None]
    n = self._n
    grad_grad = tf.raw_ops.MaxPoolGradGrad if n == 2 else tf.raw_ops.MaxPool3DGradGrad
    ksize, strides = self._tf_window(self._ksize), self._tf_window(self._strides)

    def fn(x_slice, y_slice, g_slice):
      out = grad_grad(orig_input=_flat(x_slice, n + 1), orig_output=_flat(y_slice, n + 1),
                      grad=_flat(g_slice, n + 1), ksize=ksize, strides=strides,
                      padding="VALID")
      return _unflat(out, y_slice)
    names = set(x.shape.dimension_names) | set(y.shape.dimension_names)
    ddy = slicewise(fn, [x, y, ddx], y.shape, y.dtype, names - self._whole,
                    name="max_pool_grad_grad")
    return [ddy, None, None]

  def lower(self, lowering):
    n = self._n
    ksize, strides = self._tf_window(self._ksize), self._tf_window(self._strides)
    if self._is_max:
      grad_op = tf.raw_ops.MaxPoolGrad if n == 2 else tf.raw_ops.MaxPool3DGrad

      def fn(dy, x, y):
        out = grad_op(orig_input=_flat(x, n + 1), orig_output=_flat(y, n + 1),
                      grad=_flat(dy, n + 1), ksize=ksize, strides=strides, padding="VALID")
        return _unflat(out, x)
    else:
      grad_op = tf.raw_ops.AvgPoolGrad if n == 2 else tf.raw_ops.AvgPool3DGrad

      def fn(dy, x, y):
        del y
        flat_x = _flat(x, n + 1)
        out = grad_op(orig_input_shape=tf.constant(flat_x.shape.as_list(), tf.int32),
                      grad=_flat(dy, n + 1), ksize=ksize, strides=strides, padding="VALID")
        return _unflat(out, x)
    self._lower_with(lowering, fn)


def pool_backprop(x, y, dy, ksize, strides, pool_fn_string, name=None):
  """Gradient of pooling w.r.t. its input x, given y = pool(x) and dy."""
  return PoolBackPropOperation(x, y, dy, ksize, strides, pool_fn_string,
                               name=name).outputs[0]
