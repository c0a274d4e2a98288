"""The original's Operation classes for elementwise arithmetic, for code that builds them
directly: slice-wise ops with the original constructors (mtf.add, mtf.minimum, ... do
the same work through `elementwise.py`)."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops.slicewise import SlicewiseOperation, local_broadcast
from mesh_tf.shapes import convert_to_shape


def _sum_to_shape(g, shape):
  from mesh_tf.ops.reduce import reduce_sum  # pylint: disable=g-import-not-at-top
  return g if g.shape == shape else reduce_sum(g, output_shape=shape)


class BinaryOpWithBroadcasting(SlicewiseOperation):
  """tf_fn(x1, x2) with both broadcast by dim name to output_shape; no gradient.

  output_shape must hold every dim of both inputs and no others.
  """

  def __init__(self, tf_fn, x1, x2, output_shape, output_dtype, name=None,
               grad_function=None):
    output_shape = convert_to_shape(output_shape)
    dims = set(x1.shape.dims) | set(x2.shape.dims)
    if set(output_shape.dims) != dims:
      raise ShapeError("%s: output shape %s must have exactly the dims of %s %s and %s %s"
                       % (name or type(self).__name__, output_shape, x1.name, x1.shape,
                          x2.name, x2.shape), tensor=x1.name)
    s1, s2 = x1.shape, x2.shape

    def fn(a, b):
      return tf_fn(local_broadcast(a, s1, output_shape), local_broadcast(b, s2, output_shape))
    super().__init__(fn, [x1, x2], output_shape, output_dtype, grad_function=grad_function,
                     name=name or "binary_op")

  def gradient(self, unused_grad_ys):
    return super().gradient(unused_grad_ys)


class AddOperation(BinaryOpWithBroadcasting):
  """x1 + x2 broadcast to output_shape; each gradient is summed back to its input shape."""

  def __init__(self, x1, x2, output_shape, name=None):
    super().__init__(tf.add, x1, x2, output_shape, x1.dtype, name=name or "add",
                     grad_function=lambda op, dys: [
                         _sum_to_shape(dys[0], x.shape) for x in op.inputs])

  def gradient(self, grad_ys):
    return SlicewiseOperation.gradient(self, grad_ys)


def _min_max_gradient(op, grad_ys):
  # The output equals x1 where x1 won (ties included, as in TF); x2 gets the rest.
  x1, x2 = op.inputs
  dy = grad_ys[0]
  first = ew.cast(ew.equal(x1, op.outputs[0]), dy.dtype)
  return [_sum_to_shape(dy * first, x1.shape), _sum_to_shape(dy * (1.0 - first), x2.shape)]


class MinMaxOperation(BinaryOpWithBroadcasting):
  """tf.minimum or tf.maximum (tf_fn) broadcast to output_shape; the gradient goes to the
  input that was chosen (x1 on ties)."""

  def __init__(self, tf_fn, x1, x2, output_shape, name=None):
    super().__init__(tf_fn, x1, x2, output_shape, x1.dtype, name=name or "min_max",
                     grad_function=_min_max_gradient)

  def gradient(self, grad_ys):
    return SlicewiseOperation.gradient(self, grad_ys)


class ScalarMultiplyOperation(SlicewiseOperation):
  """x times a Python or TF scalar; no gradient flows to the scalar."""

  def __init__(self, x, scalar, name=None):
    self.scalar = scalar  # the multiplier, as given
    super().__init__(lambda t: t * tf.cast(scalar, t.dtype), [x], x.shape, x.dtype,
                     grad_function=lambda op, dys: [
                         ScalarMultiplyOperation(dys[0], scalar).outputs[0]],
                     name=name or "scalar_mul")


class ScalarAddOperation(SlicewiseOperation):
  """x plus a Python or TF scalar; no gradient flows to the scalar."""

  def __init__(self, x, scalar, name=None):
    self.scalar = scalar
    super().__init__(lambda t: t + tf.cast(scalar, t.dtype), [x], x.shape, x.dtype,
                     grad_function=lambda op, dys: [dys[0]], name=name or "scalar_add")
