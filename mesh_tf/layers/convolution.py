"""Convolution layers: each creates its filter with mtf.get_variable and convolves.

Variable names follow the original library, so its checkpoints load by name: a layer
opens the scope `name` (default "conv2d", "conv3d", "conv2d_transpose",
"conv3d_transpose", "separable_conv1d"; a second unnamed layer gets "conv2d_1", ...) and
creates "<scope>/kernel" of shape [fh, fw, in, out] (3-D: [fd, fh, fw, in, out]; transposed:
[..., out, in]), with filter dims named "fd", "fh", "fw". conv1d is conv2d on a
"fake_height" dim of size 1, so its kernel is "conv2d/kernel" [fh=1, fw, in, out] unless
named. separable_conv1d creates one "depthwise_conv_hack/depthwise_dense_<k>/kernel"
[in] per tap and "pointwise_dense/kernel" [in, out], with their biases.

The *_with_blocks layers convolve an image cut into blocks, [batch..., blocks dims...,
spatial dims..., channels], whose blocks dims may be split over the mesh: each block gets
its margins from its neighbours (halo exchange) and is convolved with VALID padding, so
the result equals a SAME convolution of the whole image. Strides must divide the block
size.
"""

from mesh_tf.errors import ShapeError
from mesh_tf.graph import variable_scope
from mesh_tf.layers.dense import dense
from mesh_tf.layers import initializers
from mesh_tf.layers.scoping import unique_scope_name
from mesh_tf.ops import convolution as conv_ops
from mesh_tf.ops.halo import halo_exchange_sides
from mesh_tf.ops.reshape import reshape
from mesh_tf.ops.slicing import mtf_slice, pad, shift
from mesh_tf.ops.variables import VariableDType, get_variable
from mesh_tf.shapes import Dimension, Shape

_FILTER_DIM_NAMES = {1: ["fw"], 2: ["fh", "fw"], 3: ["fd", "fh", "fw"]}


def _as_tuple(value, n, what, role):
  values = (value,) * n if isinstance(value, int) else tuple(value)
  if len(values) != n:
    raise ShapeError("%s: %s %s needs %d values" % (what, role, values, n))
  return values


def _make_kernel(x, output_dim, filter_size, transpose, filter_initializer,
                 variable_dtype, what):
  """Creates "kernel" in the current scope for an n-D (transposed) convolution of x."""
  n = len(filter_size)
  if x.shape.ndims < n + 1:
    raise ShapeError("%s: input %s has shape %s; it needs [batch dims..., %d spatial dims, "
                     "channels]" % (what, x.name, x.shape, n), tensor=x.name)
  input_dim = x.shape.dims[-1]
  if output_dim.name in x.shape.dimension_names:
    raise ShapeError("%s: output_dim %s has the name of a dim of input %s %s; name it "
                     "differently" % (what, output_dim, x.name, x.shape),
                     tensor=x.name, dim=output_dim.name)
  fdims = [Dimension(nm, s) for nm, s in zip(_FILTER_DIM_NAMES[n], filter_size)]
  channels = [output_dim, input_dim] if transpose else [input_dim, output_dim]
  if variable_dtype is None:
    variable_dtype = VariableDType(activation_dtype=x.dtype)
  return get_variable(x.mesh, "kernel", fdims + channels, initializer=filter_initializer,
                      dtype=variable_dtype)


def _conv_layer(x, output_dim, filter_size, n, strides, padding, filter_initializer,
                variable_dtype, name, transpose, blocks_dims=None):
  what = "conv%dd%s" % (n, "_transpose" if transpose else "")
  filter_size = _as_tuple(filter_size, n, what if blocks_dims is None
                          else what + "_with_blocks", "filter_size")
  strides = _as_tuple(strides, n, what, "strides")
  with variable_scope(name or unique_scope_name(x.graph, what)):
    kernel = _make_kernel(x, output_dim, filter_size, transpose, filter_initializer,
                          variable_dtype, what)
    if blocks_dims and any(d is not None for d in blocks_dims):
      return conv_with_blocks(x, kernel, strides, padding, blocks_dims, transpose)
    op = {(2, False): conv_ops.Conv2dOperation, (3, False): conv_ops.Conv3dOperation,
          (2, True): conv_ops.Conv2dTransposeOperation,
          (3, True): conv_ops.Conv3dTransposeOperation}[(n, transpose)]
    return op(x, kernel, list(strides), padding).outputs[0]


# ---------------------------------------------------------------- blocked convolution
def _extend(x, blocks_dim, size_dim, left, right):
  """Adds left/right margins to each block: halo exchange, or zero padding if unblocked."""
  if not left and not right:
    return x
  if blocks_dim is None:
    return pad(x, [left, right], size_dim.name)
  return halo_exchange_sides(x, blocks_dim, size_dim, left, right)


def conv_with_blocks(x, conv_filter, strides, padding, blocks_dims, transpose=False):
  """SAME (transposed) convolution of a blocked image with a filter tensor.

  x: [batch..., blocks dims..., n spatial dims, channels]; conv_filter: [n filter dims,
  in, out] ([..., out, in] if transpose); strides: n spatial strides (or the TF form);
  padding: must be "SAME"; blocks_dims: for each spatial dim, the Dimension numbering its
  blocks, or None. Returns the blocked result (spatial dims of the per-block size).
  """
  n = len(blocks_dims)
  what = "conv%dd%s_with_blocks" % (n, "_transpose" if transpose else "")
  strides = conv_ops.normalize_strides(strides, n, what)[1:-1]
  if conv_ops.normalize_padding(padding, what) != "SAME":
    raise ShapeError("%s: padding %r is not supported with blocks; use 'SAME'" % (
        what, padding), tensor=x.name)
  if x.shape.ndims < n + 1 or conv_filter.shape.ndims != n + 2:
    raise ShapeError("%s: input %s %s / filter %s %s do not have %d spatial dims" % (
        what, x.name, x.shape, conv_filter.name, conv_filter.shape, n), tensor=x.name)
  spatial = x.shape.dims[-n - 1:-1]
  fsizes = [d.size for d in conv_filter.shape.dims[:n]]
  leading = x.shape.dims[:-n - 1]
  for b in blocks_dims:
    name = getattr(b, "name", b)
    if b is not None and name not in [d.name for d in leading]:
      raise ShapeError("%s: blocks dim %s is not a leading dim of %s %s" % (
          what, b, x.name, x.shape), tensor=x.name, dim=name)
  crops = []
  for blocks, dim, f, s in zip(blocks_dims, spatial, fsizes, strides):
    if dim.size % s and not transpose:
      raise ShapeError("%s: stride %d does not divide the block size %s of %s" % (
          what, s, dim, x.name), tensor=x.name, dim=dim.name)
    # TF's SAME padding of a conv whose input size the stride divides (for a transpose,
    # of the conv from its output back to its input).
    pad_total = max(f - s, 0)
    before = pad_total // 2
    if transpose:
      left, right = (f - 1 - before) // s, -(-before // s)
      crops.append((left * s + before, dim.size * s))
    else:
      left, right = before, pad_total - before
    x = _extend(x, blocks, dim, left, right)
  strides = [1] + list(strides) + [1]
  if not transpose:
    op = conv_ops.Conv2dOperation if n == 2 else conv_ops.Conv3dOperation
    return op(x, conv_filter, strides, "VALID").outputs[0]
  op = conv_ops.Conv2dTransposeOperation if n == 2 else conv_ops.Conv3dTransposeOperation
  y = op(x, conv_filter, strides, "VALID").outputs[0]
  for dim, (begin, size) in zip(spatial, crops):
    y = mtf_slice(y, begin, size, dim.name)
  return y


# ---------------------------------------------------------------- public layers
def conv2d(x, output_dim, filter_size=(3, 3), strides=(1, 1), padding="SAME",
           filter_initializer=None, variable_dtype=None, name=None):
  """2-D convolution of x [batch..., h, w, in] to [batch..., h', w', output_dim]."""
  return _conv_layer(x, output_dim, filter_size, 2, strides, padding, filter_initializer,
                     variable_dtype, name, False)


def conv2d_with_blocks(x, output_dim, filter_size=(3, 3), strides=(1, 1),
                       padding="SAME", h_blocks_dim=None, w_blocks_dim=None,
                       filter_initializer=None, variable_dtype=None, name=None):
  """conv2d of an image cut into blocks: [batch, h_blocks, w_blocks, h, w, in].

  The blocks dims may be split over the mesh; with neither given this is conv2d.
  """
  return _conv_layer(x, output_dim, filter_size, 2, strides, padding, filter_initializer,
                     variable_dtype, name, False, [h_blocks_dim, w_blocks_dim])


def conv2d_transpose(x, output_dim, filter_size=(2, 2), strides=(2, 2), padding="SAME",
                     filter_initializer=None, variable_dtype=None, name=None):
  """Transposed 2-D convolution (kernel [fh, fw, output_dim, in]); upsamples by strides."""
  return _conv_layer(x, output_dim, filter_size, 2, strides, padding, filter_initializer,
                     variable_dtype, name, True)


def conv2d_transpose_with_blocks(x, output_dim, filter_size=(2, 2),
                                 strides=(2, 2), padding="SAME", h_blocks_dim=None,
                                 w_blocks_dim=None, filter_initializer=None,
                                 variable_dtype=None, name=None):
  """conv2d_transpose of an image cut into blocks; each block grows by the strides."""
  return _conv_layer(x, output_dim, filter_size, 2, strides, padding, filter_initializer,
                     variable_dtype, name, True, [h_blocks_dim, w_blocks_dim])


def conv3d(x, output_dim, filter_size=(3, 3, 3), strides=(1, 1, 1), padding="SAME",
           filter_initializer=None, variable_dtype=None, name=None):
  """3-D convolution of x [batch..., d, h, w, in] to [batch..., d', h', w', output_dim]."""
  return _conv_layer(x, output_dim, filter_size, 3, strides, padding, filter_initializer,
                     variable_dtype, name, False)


def conv3d_with_blocks(x, output_dim, filter_size=(3, 3, 3), strides=(1, 1, 1),
                       padding="SAME", d_blocks_dim=None, h_blocks_dim=None,
                       filter_initializer=None, variable_dtype=None, name=None):
  """conv3d of a volume cut into blocks: [batch, d_blocks, h_blocks, d, h, w, in]."""
  return _conv_layer(x, output_dim, filter_size, 3, strides, padding, filter_initializer,
                     variable_dtype, name, False, [d_blocks_dim, h_blocks_dim, None])


def conv3d_transpose(x, output_dim, filter_size=(2, 2, 2), strides=(2, 2, 2),
                     padding="SAME", filter_initializer=None, variable_dtype=None,
                     name=None):
  """Transposed 3-D convolution (kernel [fd, fh, fw, output_dim, in])."""
  return _conv_layer(x, output_dim, filter_size, 3, strides, padding, filter_initializer,
                     variable_dtype, name, True)


def conv3d_transpose_with_blocks(x, output_dim, filter_size=(2, 2, 2),
                                 strides=(2, 2, 2), padding="SAME", d_blocks_dim=None,
                                 h_blocks_dim=None, filter_initializer=None,
                                 variable_dtype=None, name=None):
  """conv3d_transpose of a volume cut into d/h blocks."""
  return _conv_layer(x, output_dim, filter_size, 3, strides, padding, filter_initializer,
                     variable_dtype, name, True, [d_blocks_dim, h_blocks_dim, None])


def conv1d(x, output_dim, filter_size=3, stride=1, **kw_args):
  """1-D convolution of x [batch..., length, in] to [batch..., length', output_dim].

  Runs conv2d over an inserted "fake_height" dim of size 1; kw_args go to conv2d
  (padding="SAME", filter_initializer, variable_dtype, name).
  """
  unknown = set(kw_args) - {"padding", "filter_initializer", "variable_dtype", "name"}
  if unknown:
    raise TypeError("conv1d got unexpected keyword arguments %s" % sorted(unknown))
  if x.shape.ndims < 2:
    raise ShapeError("conv1d: input %s has shape %s; it needs [batch dims..., length, "
                     "channels]" % (x.name, x.shape), tensor=x.name)
  height = Dimension("fake_height", 1)
  dims = x.shape.dims
  x = reshape(x, Shape(dims[:-2] + [height] + dims[-2:]))
  y = conv2d(x, output_dim, (1, filter_size), (1, stride), **kw_args)
  return reshape(y, Shape(y.shape.dims[:-3] + y.shape.dims[-2:]))


def separable_conv1d(x, output_dim, min_relative_pos=-1, max_relative_pos=1,
                     depthwise_filter_initializer_scale=1.0,
                     pointwise_filter_initializer_scale=1.0, name=None, use_bias=True,
                     kernel_depth_weights=None):
  """A depthwise 1-D convolution along x's length dim, then a pointwise dense layer.

  x is [batch..., length, channels]. For each tap k = 0 .. K-1 (K = max_relative_pos -
  min_relative_pos + 1), x shifted so that position t reads t + min_relative_pos + k
  (zeros past the ends) is scaled per channel by the dense layer "depthwise_dense_<k>"
  (bias on tap 0 only); the taps' sum goes through the dense layer "pointwise_dense".
  Tap kernels start from VarianceScalingInitializer(depthwise scale / K), the pointwise
  kernel from VarianceScalingInitializer(pointwise scale).

  kernel_depth_weights: optional list of K Tensors with the channels dim, used as the
    tap kernels instead of variables.
  output_dim may share its name with the channels dim (dense renames the reduced one).
  """
  what = "separable_conv1d"
  if x.shape.ndims < 2:
    raise ShapeError("%s: input %s has shape %s; it needs [batch dims..., length, "
                     "channels]" % (what, x.name, x.shape), tensor=x.name)
  taps = max_relative_pos - min_relative_pos + 1
  if taps < 1:
    raise ShapeError("%s: max_relative_pos %d < min_relative_pos %d" % (
        what, max_relative_pos, min_relative_pos), tensor=x.name)
  length_dim, depth_dim = x.shape.dims[-2:]
  if kernel_depth_weights is not None and len(kernel_depth_weights) != taps:
    raise ShapeError("%s: %d kernel_depth_weights for %d taps (min_relative_pos %d, "
                     "max_relative_pos %d)" % (what, len(kernel_depth_weights), taps,
                                               min_relative_pos, max_relative_pos),
                     tensor=x.name)
  with variable_scope(name or unique_scope_name(x.graph, what)):
    total = None
    with variable_scope("depthwise_conv_hack"):
      for k in range(taps):
        term = dense(
            shift(x, -(min_relative_pos + k), length_dim.name, wrap=False),
            new_dims=[], reduced_dims=[], expert_dims=[depth_dim],
            kernel_weights=None if kernel_depth_weights is None
            else kernel_depth_weights[k],
            name="depthwise_dense_%d" % k, use_bias=use_bias and k == 0,
            kernel_initializer=initializers.VarianceScalingInitializer(
                scale=depthwise_filter_initializer_scale / taps))
        total = term if total is None else total + term
    return dense(
        total, new_dims=[output_dim], reduced_dims=[depth_dim], name="pointwise_dense",
        use_bias=use_bias, kernel_initializer=initializers.VarianceScalingInitializer(
            scale=pointwise_filter_initializer_scale))
