"""Convolutions over the trailing spatial dims: conv2d/conv3d, their transposes, and the
backprop ops that are their gradients.

Tensors are [batch dims..., spatial dims..., channels]; filters are [filter spatial
dims..., in channels, out channels] ([..., out channels, in channels] for a transposed
convolution, as in TF). Output spatial dims keep the input's names with their new sizes.
Batch and channel dims may be split (the dims a convolution sums over are then
allreduced); split spatial dims are gathered and cut back after (to avoid that, split the
image into blocks: `mtf.layers.conv2d_with_blocks`).
"""
import collections

import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation
from mesh_tf.lowering.plan_interpreter import lower_planned
from mesh_tf.plans.rules import whole_dims_plan
from mesh_tf.shapes import Dimension, Shape, convert_to_shape

_KERNELS = {
    2: (tf.nn.conv2d, tf.raw_ops.Conv2DBackpropInput, tf.raw_ops.Conv2DBackpropFilter),
    3: (tf.nn.conv3d, tf.raw_ops.Conv3DBackpropInputV2, tf.raw_ops.Conv3DBackpropFilterV2),
}


def normalize_strides(strides, n, what):
  """Strides as the full TF list [1, s_1, ..., s_n, 1]; also accepts [s_1, ..., s_n]."""
  if strides is None:
    return [1] * (n + 2)
  strides = [int(s) for s in strides]
  if len(strides) == n:
    strides = [1] + strides + [1]
  if (len(strides) != n + 2 or strides[0] != 1 or strides[-1] != 1 or
      any(s < 1 for s in strides)):
    raise ShapeError("%s: strides %s must be %d positive ints [1, ..., 1] (or the %d "
                     "spatial strides alone)" % (what, strides, n + 2, n))
  return strides


def normalize_padding(padding, what):
  """"SAME" or "VALID" (any case), else a ShapeError."""
  p = str(padding).upper()
  if p not in ("SAME", "VALID"):
    raise ShapeError("%s: padding %r is neither 'SAME' nor 'VALID'" % (what, padding))
  return p


def conv_output_size(in_size, filter_size, stride, padding):
  """Spatial size TF's convolution gives (0 when the filter does not fit)."""
  if padding == "SAME":
    return -(-in_size // stride)
  return max(0, -(-(in_size - filter_size + 1) // stride))


def conv_transpose_output_size(in_size, filter_size, stride, padding):
  """Spatial size of the transposed convolution (the input size of its conv)."""
  if padding == "SAME":
    return in_size * stride
  return in_size * stride + max(filter_size - stride, 0)


def _flat(t, keep):
  """Folds all but the last `keep` axes of a slice into one batch axis."""
  return tf.reshape(t, [-1] + t.shape.as_list()[t.shape.rank - keep:])


def _unflat(t, batch_sizes):
  return tf.reshape(t, list(batch_sizes) + t.shape.as_list()[1:])


def _check_rank(x, rank, n, role, what, at_least=False):
  ok = x.shape.ndims >= rank if at_least else x.shape.ndims == rank
  if not ok:
    want = ("[batch dims..., %d spatial dims, channels]" % n if role == "input" else
            "[%d filter spatial dims, in channels, out channels]" % n)
    raise ShapeError("%s: %s %s has shape %s; a %dd convolution needs %s" % (
        what, role, x.name, x.shape, n, want), tensor=x.name)


def _check_spatial(what, x_dims, y_dims, f_dims, strides, padding, y_tensor):
  """Checks that y's spatial sizes are those a conv of x gives (names must match too)."""
  for xd, yd, fd, s in zip(x_dims, y_dims, f_dims, strides[1:-1]):
    want = conv_output_size(xd.size, fd.size, s, padding)
    if xd.name != yd.name or yd.size != want:
      raise ShapeError("%s: spatial dim %s of %s should be %s (input dim %s, filter %s, "
                       "stride %d, %s)" % (what, yd, y_tensor.name, Dimension(xd.name, want),
                                           xd, fd, s, padding),
                       tensor=y_tensor.name, dim=yd.name)


def _check_same_dim(a, a_tensor, b, b_tensor, what, role):
  if a != b:
    raise ShapeError("%s: %s of %s is %s but %s has %s; they must be the same dimension"
                     % (what, role, a_tensor.name, a, b_tensor.name, b),
                     tensor=b_tensor.name, dim=b.name)


def _check_dtypes(xs, what):
  for x in xs[1:]:
    if x.dtype != xs[0].dtype:
      raise ShapeError("%s: dtype of %s is %s but %s is %s" % (
          what, xs[0].name, xs[0].dtype.name, x.name, x.dtype.name), tensor=x.name)


def _output_shape(batch_dims, spatial_dims, sizes, channel_dim, what, filter_name):
  for d, size in zip(spatial_dims, sizes):
    if size < 1:
      raise ShapeError("%s: filter %s leaves no output along %s (VALID padding needs the "
                       "filter to fit in the input)" % (what, filter_name, d),
                       tensor=filter_name, dim=d.name)
  dims = batch_dims + [Dimension(d.name, s) for d, s in zip(spatial_dims, sizes)]
  if channel_dim.name in [d.name for d in dims]:
    raise ShapeError("%s: output channel dim %s has the name of an input dim (%s)" % (
        what, channel_dim, Shape(dims)), dim=channel_dim.name, tensor=filter_name)
  return Shape(dims + [channel_dim])


# Stands in for a tensor in error messages about a shape argument.
_Named = collections.namedtuple("_Named", "name")


class ConvFamilyOperation(Operation):
  """Shared lowering of every convolution op: gather spatial dims, run the TF kernel on
  each slice, allreduce the summed dims, cut spatial dims back to the layout. Subclasses
  call _setup and define _local(*slices)."""

  def _setup(self, n, strides, padding, whole, summed):
    self._n = n
    self._strides = strides
    self._padding = padding
    self._whole = frozenset(whole)
    self._summed = list(summed)

  @property
  def strides(self):
    """The TF strides list [1, s_1, ..., s_n, 1]."""
    return list(self._strides)

  @property
  def padding(self):
    """"SAME" or "VALID"."""
    return self._padding

  # The forward ops declare their spatial dims unsplittable, the backprop ops none; the
  # lowering gathers self._whole in every case.
  _DECLARES_WHOLE = True

  @property
  def unsplittable_dims(self):
    """Names of the dims this op declares it needs whole."""
    return self._whole if self._DECLARES_WHOLE else frozenset()

  def _conv_slices(self, x, f, transpose):
    """conv(x, f), or conv_transpose(x, f) sized as outputs[0], on local slices."""
    n = self._n
    fwd, backprop_input, _ = _KERNELS[n]
    flat = _flat(x, n + 1)
    if transpose:
      y_dims = self.outputs[0].shape.dims[-n - 1:-1]
      sizes = [flat.shape[0]] + [d.size for d in y_dims] + [f.shape[n]]
      out = backprop_input(input_sizes=tf.constant(sizes, tf.int32), filter=f,
                           out_backprop=flat, strides=self._strides, padding=self._padding)
    else:
      out = fwd(flat, f, self._strides, self._padding)
    return _unflat(out, x.shape.as_list()[:-n - 1])

  def plan(self, layout):
    """The OpPlan on a MeshLayout: gather the spatial dims, allreduce the summed ones."""
    axes = sorted(set(layout.tensor_dimension_to_mesh_axis(d) for d in self._summed)
                  - {None})
    return whole_dims_plan(layout, [x.shape for x in self.inputs],
                           [y.shape for y in self.outputs], self._whole, axes)

  def lower(self, lowering):
    plan = self.plan(lowering.mesh_impl(self).slice_layout)
    lower_planned(lowering, self, plan, self._local)


class _ConvOperation(ConvFamilyOperation):
  """y = conv(x, filter) contracting the input channels and the filter window; with
  _TRANSPOSE, y = conv_transpose(x, filter), the input-gradient of a conv from y to x."""

  _N = None
  _TRANSPOSE = False

  def __init__(self, conv_input, conv_filter, strides, padding, name=None):
    n, transpose = self._N, self._TRANSPOSE
    what = name or "conv%dd%s" % (n, "_transpose" if transpose else "")
    super().__init__([conv_input, conv_filter], name=what)
    _check_rank(conv_input, n + 1, n, "input", what, at_least=True)
    _check_rank(conv_filter, n + 2, n, "filter", what)
    _check_dtypes([conv_input, conv_filter], what)
    strides = normalize_strides(strides, n, what)
    padding = normalize_padding(padding, what)
    xd, fd = conv_input.shape.dims, conv_filter.shape.dims
    if transpose:
      in_ch, out_ch, size_fn = fd[n + 1], fd[n], conv_transpose_output_size
      role = "the channel dim (the filter's last dim for a transpose)"
    else:
      in_ch, out_ch, size_fn, role = fd[n], fd[n + 1], conv_output_size, "the channel dim"
    _check_same_dim(xd[-1], conv_input, in_ch, conv_filter, what, role)
    sizes = [size_fn(d.size, f.size, s, padding)
             for d, f, s in zip(xd[-n - 1:-1], fd[:n], strides[1:-1])]
    self._add_output(_output_shape(xd[:-n - 1], xd[-n - 1:-1], sizes, out_ch, what,
                                   conv_filter.name), conv_input.dtype)
    self._setup(n, strides, padding, [d.name for d in xd[-n - 1:-1] + fd[:n]], [xd[-1]])

  def _local(self, x, f):
    return self._conv_slices(x, f, self._TRANSPOSE)

  def gradient(self, grad_ys):
    (x, f), dy = self.inputs, grad_ys[0]
    n, s, p, t = self._n, self._strides, self._padding, self._TRANSPOSE
    return [Conv2or3dBackpropInputOperation(n, t, x.shape, f, dy, s, p).outputs[0],
            Conv2or3dBackpropFilterOperation(n, t, x, f.shape, dy, s, p).outputs[0]]


class Conv2dOperation(_ConvOperation):
  """2-D convolution of [batch..., h, w, in] with a [fh, fw, in, out] filter."""
  _N = 2


class Conv3dOperation(_ConvOperation):
  """3-D convolution of [batch..., d, h, w, in] with a [fd, fh, fw, in, out] filter."""
  _N = 3


class Conv2dTransposeOperation(_ConvOperation):
  """2-D transposed convolution of [batch..., h, w, in] with a [fh, fw, out, in] filter."""
  _N, _TRANSPOSE = 2, True


class Conv3dTransposeOperation(_ConvOperation):
  """3-D transposed convolution of [batch..., d, h, w, in] with [fd, fh, fw, out, in]."""
  _N, _TRANSPOSE = 3, True


class Conv2or3dBackpropInputOperation(ConvFamilyOperation):
  """Gradient of a convolution w.r.t. its input: conv_transpose(dy, filter), or with
  is_transpose (y = conv_transpose(x, filter)) conv(dy, filter)."""

  _DECLARES_WHOLE = False

  def __init__(self, conv_dimension, is_transpose, input_shape, conv_filter, dy, strides,
               padding, name=None):
    n = conv_dimension
    what = name or "conv%dd%s_backprop_input" % (n, "_transpose" if is_transpose else "")
    super().__init__([conv_filter, dy], name=what)
    if n not in (2, 3):
      raise ShapeError("%s: conv_dimension must be 2 or 3, got %r" % (what, n))
    input_shape = convert_to_shape(input_shape)
    _check_rank(dy, n + 1, n, "input", what, at_least=True)
    _check_rank(conv_filter, n + 2, n, "filter", what)
    _check_dtypes([conv_filter, dy], what)
    self._is_transpose = is_transpose
    strides = normalize_strides(strides, n, what)
    padding = normalize_padding(padding, what)
    fd = conv_filter.shape.dims
    x_ch, y_ch = (fd[n + 1], fd[n]) if is_transpose else (fd[n], fd[n + 1])
    if input_shape.ndims != dy.shape.ndims or input_shape.dims[-1] != x_ch:
      raise ShapeError("%s: input_shape %s does not fit filter %s %s (its channel dim "
                       "must be %s)" % (what, input_shape, conv_filter.name,
                                        conv_filter.shape, x_ch), tensor=conv_filter.name)
    _check_same_dim(y_ch, conv_filter, dy.shape.dims[-1], dy, what, "the output channel dim")
    x_sp, y_sp = input_shape.dims[-n - 1:-1], dy.shape.dims[-n - 1:-1]
    if is_transpose:  # the forward op's input x is the conv output of its output y
      _check_spatial(what, y_sp, x_sp, fd[:n], strides, padding, _Named("input_shape"))
    else:
      _check_spatial(what, x_sp, y_sp, fd[:n], strides, padding, dy)
    self._add_output(input_shape, dy.dtype)
    self._setup(n, strides, padding,
                [d.name for d in input_shape.dims[-n - 1:-1] + fd[:n]], [y_ch])

  def _local(self, f, dy):
    return self._conv_slices(dy, f, not self._is_transpose)

  def gradient(self, grad_ys):
    (f, dy), ddx = self.inputs, grad_ys[0]
    n, s, p = self._n, self._strides, self._padding
    if self._is_transpose:  # dx = conv(dy, f)
      return [Conv2or3dBackpropFilterOperation(n, False, dy, f.shape, ddx, s, p).outputs[0],
              Conv2or3dBackpropInputOperation(n, False, dy.shape, f, ddx, s, p).outputs[0]]
    conv = Conv2dOperation if n == 2 else Conv3dOperation  # dx = conv_transpose(dy, f)
    return [Conv2or3dBackpropFilterOperation(n, False, ddx, f.shape, dy, s, p).outputs[0],
            conv(ddx, f, s, p).outputs[0]]


class Conv2or3dBackpropFilterOperation(ConvFamilyOperation):
  """Gradient of a convolution (a transposed one with is_transpose) w.r.t. its filter;
  sums over the batch dims (an allreduce over the mesh axes that split them)."""

  _DECLARES_WHOLE = False

  def __init__(self, conv_dimension, is_transpose, conv_input, filter_shape, dy, strides,
               padding, name=None):
    n = conv_dimension
    what = name or "conv%dd%s_backprop_filter" % (n, "_transpose" if is_transpose else "")
    super().__init__([conv_input, dy], name=what)
    if n not in (2, 3):
      raise ShapeError("%s: conv_dimension must be 2 or 3, got %r" % (what, n))
    filter_shape = convert_to_shape(filter_shape)
    _check_rank(conv_input, n + 1, n, "input", what, at_least=True)
    _check_dtypes([conv_input, dy], what)
    if filter_shape.ndims != n + 2:
      raise ShapeError("%s: filter_shape %s needs %d dims" % (what, filter_shape, n + 2))
    self._is_transpose = is_transpose
    strides = normalize_strides(strides, n, what)
    padding = normalize_padding(padding, what)
    fd = filter_shape.dims
    x_ch, y_ch = (fd[n + 1], fd[n]) if is_transpose else (fd[n], fd[n + 1])
    _check_same_dim(x_ch, _Named("filter_shape"), conv_input.shape.dims[-1], conv_input,
                    what, "the input channel dim")
    _check_same_dim(y_ch, _Named("filter_shape"), dy.shape.dims[-1], dy, what,
                    "the output channel dim")
    if dy.shape.dims[:-n - 1] != conv_input.shape.dims[:-n - 1]:
      raise ShapeError("%s: batch dims of %s %s and %s %s differ" % (
          what, conv_input.name, conv_input.shape, dy.name, dy.shape), tensor=dy.name)
    x_sp, y_sp = conv_input.shape.dims[-n - 1:-1], dy.shape.dims[-n - 1:-1]
    if is_transpose:
      _check_spatial(what, y_sp, x_sp, fd[:n], strides, padding, conv_input)
    else:
      _check_spatial(what, x_sp, y_sp, fd[:n], strides, padding, dy)
    self._add_output(filter_shape, conv_input.dtype)
    self._setup(n, strides, padding,
                [d.name for d in conv_input.shape.dims[-n - 1:-1] + fd[:n]],
                conv_input.shape.dims[:-n - 1])

  def _local(self, x, dy):
    n = self._n
    backprop_filter = _KERNELS[n][2]
    fdims = [d.size for d in self.outputs[0].shape.dims[:n]]
    x, dy = _flat(x, n + 1), _flat(dy, n + 1)
    if self._is_transpose:
      x, dy = dy, x
    sizes = fdims + [x.shape[-1], dy.shape[-1]]
    return backprop_filter(input=x, filter_sizes=tf.constant(sizes, tf.int32),
                           out_backprop=dy, strides=self._strides, padding=self._padding)

  def gradient(self, grad_ys):
    (x, dy), ddf = self.inputs, grad_ys[0]
    n, s, p = self._n, self._strides, self._padding
    if self._is_transpose:  # df = backprop_filter(dy, x): conv(dy, .) paired with x
      return [Conv2or3dBackpropInputOperation(n, True, x.shape, ddf, dy, s, p).outputs[0],
              Conv2or3dBackpropInputOperation(n, False, dy.shape, ddf, x, s, p).outputs[0]]
    conv = Conv2dOperation if n == 2 else Conv3dOperation
    return [Conv2or3dBackpropInputOperation(n, False, x.shape, ddf, dy, s, p).outputs[0],
            conv(x, ddf, s, p).outputs[0]]


def _backprop_function(n, is_transpose, wrt):
  """The public conv{n}d[_transpose]_backprop_{wrt} function (wrt "input" or "filter")."""
  if wrt == "input":
    def fn(input_shape, conv_filter, dy, strides, padding, name=None):
      return Conv2or3dBackpropInputOperation(n, is_transpose, input_shape, conv_filter, dy,
                                             strides, padding, name=name).outputs[0]
  else:
    def fn(conv_input, filter_shape, dy, strides, padding, name=None):
      return Conv2or3dBackpropFilterOperation(n, is_transpose, conv_input, filter_shape, dy,
                                              strides, padding, name=name).outputs[0]
  kind = "transposed convolution" if is_transpose else "convolution"
  fn.__name__ = fn.__qualname__ = "conv%dd%s_backprop_%s" % (
      n, "_transpose" if is_transpose else "", wrt)
  fn.__doc__ = "Gradient of a %d-D %s w.r.t. its %s." % (n, kind, wrt)
  return fn


conv2d_backprop_input = _backprop_function(2, False, "input")
conv2d_backprop_filter = _backprop_function(2, False, "filter")
conv3d_backprop_input = _backprop_function(3, False, "input")
conv3d_backprop_filter = _backprop_function(3, False, "filter")
conv2d_transpose_backprop_input = _backprop_function(2, True, "input")
conv2d_transpose_backprop_filter = _backprop_function(2, True, "filter")
conv3d_transpose_backprop_input = _backprop_function(3, True, "input")
conv3d_transpose_backprop_filter = _backprop_function(3, True, "filter")
