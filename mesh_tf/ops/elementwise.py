"""Elementwise math: unary ops as table rows (TF function, gradient as mtf math on
(x, y, dy) or `generic_gradient`), and binary/ternary ops that broadcast by name."""
import math

import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation, Tensor
from mesh_tf.lowering import direct_ops, plan_interpreter
from mesh_tf.plans import rules as plan_rules
from mesh_tf.ops.slicewise import cwise, generic_gradient, local_broadcast, slicewise
from mesh_tf.shapes import Shape, convert_to_shape, is_subsequence, shape_union


# ---------------------------------------------------------------- unary ops, one row each
# Unary ops whose `name` parameter defaults to the op's name in the original.
_NAMED_BY_DEFAULT = frozenset([
    "identity", "negative", "exp", "log", "sqrt", "rsqrt", "square", "reciprocal",
    "sigmoid", "tanh", "sin", "cos", "relu", "sign", "logical_not"])


def _named(public_fn, op_name, doc):
  """public_fn renamed op_name (with `name` defaulting to it where the original's did)."""
  public_fn.__name__ = public_fn.__qualname__ = op_name
  if op_name in _NAMED_BY_DEFAULT:
    public_fn.__defaults__ = (op_name,)
  public_fn.__doc__ = doc
  return public_fn


def _unary(op_name, tf_fn, grad=None, output_dtype=None):
  """Makes the public function for one elementwise unary op.

  grad: None (no gradient), "generic" (TF autodiff per slice), or fn(x, y, dy) -> dx.
  """
  def grad_function(op, grad_ys):
    return [grad(op.inputs[0], op.outputs[0], grad_ys[0])]

  if grad == "generic":
    grad_fn = generic_gradient
  else:
    grad_fn = None if grad is None else grad_function

  def public_fn(x, name=None):
    return cwise(tf_fn, [x], output_dtype=output_dtype, grad_function=grad_fn,
                 name=name or op_name)
  return _named(public_fn, op_name, "Elementwise %s of an mtf Tensor." % op_name)


def _tf_grad_kernel(kernel, of_output):
  """fn(x, y, dy) -> dx as one TF gradient kernel (e.g. ReluGrad) on each slice, where
  the composite would be two or three elementwise passes; of_output: the kernel reads
  the op's output y (TanhGrad, SigmoidGrad) rather than its input x (ReluGrad)."""
  def grad(x, y, dy):
    return cwise(lambda g, v: kernel(g, v), [dy, y if of_output else x],
                 grad_function=generic_gradient, name=kernel.__name__.lstrip("_"))
  return grad


def _relu_grad(g, v):
  return tf.raw_ops.ReluGrad(gradients=g, features=v)


def _tanh_grad(g, v):
  return tf.raw_ops.TanhGrad(y=v, dy=g)


def _sigmoid_grad(g, v):
  return tf.raw_ops.SigmoidGrad(y=v, dy=g)


identity = _unary("identity", tf.identity, lambda x, y, dy: dy)
negative = _unary("negative", tf.negative, lambda x, y, dy: -dy)
exp = _unary("exp", tf.exp, lambda x, y, dy: dy * y)
log = _unary("log", tf.math.log, lambda x, y, dy: dy / x)
sqrt = _unary("sqrt", tf.sqrt, lambda x, y, dy: dy * 0.5 / y)
rsqrt = _unary("rsqrt", tf.math.rsqrt, lambda x, y, dy: dy * -0.5 * y * y * y)
square = _unary("square", tf.square, lambda x, y, dy: dy * 2.0 * x)
reciprocal = _unary("reciprocal", tf.math.reciprocal, lambda x, y, dy: -dy * y * y)
sigmoid = _unary("sigmoid", tf.sigmoid, _tf_grad_kernel(_sigmoid_grad, of_output=True))
tanh = _unary("tanh", tf.tanh, _tf_grad_kernel(_tanh_grad, of_output=True))
sin = _unary("sin", tf.sin, lambda x, y, dy: dy * cos(x))
cos = _unary("cos", tf.cos, lambda x, y, dy: -dy * sin(x))
abs = _unary("abs", tf.abs, lambda x, y, dy: dy * sign(x))  # pylint: disable=redefined-builtin
relu = _unary("relu", tf.nn.relu, _tf_grad_kernel(_relu_grad, of_output=False))
sign = _unary("sign", tf.sign)
floor = _unary("floor", tf.floor)
ceil = _unary("ceil", tf.math.ceil)
round = _unary("round", tf.round)  # pylint: disable=redefined-builtin
logical_not = _unary("logical_not", tf.logical_not)
softplus = _unary("softplus", tf.nn.softplus, "generic")
elu = _unary("elu", tf.nn.elu, "generic")
selu = _unary("selu", tf.nn.selu, "generic")
swish = _unary("swish", lambda t: t * tf.sigmoid(t), "generic")
log1p = _unary("log1p", tf.math.log1p, "generic")
expm1 = _unary("expm1", tf.math.expm1, "generic")
gelu = _unary("gelu", lambda t: 0.5 * t * (1.0 + tf.tanh(
    math.sqrt(2.0 / math.pi) * (t + 0.044715 * t * t * t))), "generic")
mtf_abs = abs


def leaky_relu(x, alpha=0.2, name="leaky_relu"):
  """max(x, alpha * x), elementwise."""
  return cwise(lambda t: tf.nn.leaky_relu(t, alpha), [x], grad_function=generic_gradient,
               name=name or "leaky_relu")


def cast(x, dtype, name="cast"):
  """Casts x to dtype; the gradient is cast back when both are floating."""
  dtype = tf.as_dtype(dtype)
  if x.dtype == dtype:
    return x

  def grad(op, grad_ys):
    return [cast(grad_ys[0], op.inputs[0].dtype)]
  return cwise(lambda t: tf.cast(t, dtype), [x], output_dtype=dtype,
               grad_function=grad if x.dtype.is_floating and dtype.is_floating else None,
               name=name or "cast")


def to_float(x, name="to_float"):
  return cast(x, tf.float32, name=name)


def to_bfloat16(x, name="to_bfloat16"):
  return cast(x, tf.bfloat16, name=name)


def to_int32(x, name="to_int32"):
  return cast(x, tf.int32, name=name)


# ------------------------------------------------------- broadcasting by dimension name
def binary_arguments_to_tensors(x1, x2):
  """Turns Python numbers (and TF scalars) beside an mtf Tensor into mtf scalars."""
  from mesh_tf.ops import creation  # pylint: disable=g-import-not-at-top
  if not isinstance(x1, Tensor) and not isinstance(x2, Tensor):
    raise ShapeError("at least one of %r and %r must be an mtf.Tensor" % (x1, x2))
  if not isinstance(x1, Tensor):
    x1 = creation.import_fully_replicated(x2.mesh, tf.cast(x1, x2.dtype), Shape([]),
                                          name="scalar")
  if not isinstance(x2, Tensor):
    x2 = creation.import_fully_replicated(x1.mesh, tf.cast(x2, x1.dtype), Shape([]),
                                          name="scalar")
  return x1, x2


def _broadcast_shape(xs, output_shape, op_name):
  """Output shape of a broadcasting op: as given, else the original's union rule."""
  shapes = [x.shape for x in xs]
  union = shape_union(shapes)  # raises if one name has two sizes
  if output_shape is not None:
    output_shape = convert_to_shape(output_shape)
    missing = [d for d in union.dims if d not in output_shape.dims]
    if missing:
      raise ShapeError("%s: output shape %s lacks input dims %s" % (
          op_name, output_shape, [str(d) for d in missing]), op=op_name)
    return output_shape
  for s in shapes:
    if all(is_subsequence(t.dims, s.dims) for t in shapes):
      return s
  return union


def _check_dtypes(xs, op_name):
  for x in xs[1:]:
    if x.dtype != xs[0].dtype:
      raise ShapeError(
          "%s: dtype mismatch between %s (%s) and %s (%s); cast one with mtf.cast"
          % (op_name, xs[0].name, xs[0].dtype.name, x.name, x.dtype.name), op=op_name,
          tensor=x.name)


def _sum_to_shape(g, shape):
  """Reduces a gradient back to an input's shape (undoing broadcasting)."""
  if g is None or g.shape == shape:
    return g
  from mesh_tf.ops import reduce as reduce_ops  # pylint: disable=g-import-not-at-top
  return reduce_ops.reduce_sum(g, output_shape=shape)


def broadcasting_op(tf_fn, xs, output_shape=None, output_dtype=None, grad_function=None,
                    name="binary_op", check_dtypes=True):
  """Applies tf_fn to inputs broadcast (by dim name) to a common output shape."""
  xs = list(xs)
  if check_dtypes:
    _check_dtypes(xs, name)
  out_shape = _broadcast_shape(xs, output_shape, name)
  union = shape_union([x.shape for x in xs])
  compute_shape = out_shape if all(d in union.dims for d in out_shape.dims) else union
  in_shapes = [x.shape for x in xs]

  def fn(*slices):
    args = [local_broadcast(s, shp, compute_shape, full_rank=False)
            for s, shp in zip(slices, in_shapes)]
    return direct_ops.binary(tf_fn, *args) if len(args) == 2 else tf_fn(*args)
  y = slicewise(fn, xs, output_shape=compute_shape,
                output_dtype=output_dtype or xs[0].dtype, grad_function=grad_function,
                name=name)
  if compute_shape != out_shape:
    from mesh_tf.ops.reshape import broadcast  # pylint: disable=g-import-not-at-top
    y = broadcast(y, out_shape)
  return y


def binary_op_with_broadcasting(tf_fn, x1, x2, output_shape=None, output_dtype=None,
                                name="binary_op"):
  """tf_fn(x1, x2) broadcast by dim name; no gradient."""
  x1, x2 = binary_arguments_to_tensors(x1, x2)
  return broadcasting_op(tf_fn, [x1, x2], output_shape, output_dtype, name=name)


def _binary(op_name, tf_fn, grads=None, output_dtype=None):
  """Public function for a broadcasting binary op; grads(x1, x2, y, dy) -> (dx1, dx2)."""
  def grad_function(op, grad_ys):
    x1, x2 = op.inputs
    g1, g2 = grads(x1, x2, op.outputs[0], grad_ys[0])
    return [_sum_to_shape(g1, x1.shape), _sum_to_shape(g2, x2.shape)]

  def public_fn(x1, x2, output_shape=None, name=None):
    x1, x2 = binary_arguments_to_tensors(x1, x2)
    return broadcasting_op(tf_fn, [x1, x2], output_shape, output_dtype,
                           grad_function=grad_function if grads else None,
                           name=name or op_name)
  return _named(public_fn, op_name, "Elementwise %s, broadcasting by dimension name." % op_name)


add = _binary("add", tf.add, lambda a, b, y, dy: (dy, dy))
sub = _binary("sub", tf.subtract, lambda a, b, y, dy: (dy, -dy))
multiply = _binary("multiply", tf.multiply, lambda a, b, y, dy: (dy * b, dy * a))
divide = _binary("divide", tf.math.truediv, lambda a, b, y, dy: (dy / b, -dy * y / b))
minimum = _binary("minimum", tf.minimum, lambda a, b, y, dy: (
    dy * cast(less_equal(a, b), dy.dtype), dy * cast(greater(a, b), dy.dtype)))
maximum = _binary("maximum", tf.maximum, lambda a, b, y, dy: (
    dy * cast(greater_equal(a, b), dy.dtype), dy * cast(less(a, b), dy.dtype)))
_binary_pow = _binary("pow", tf.pow, lambda a, b, y, dy: (
    dy * b * _binary_pow(a, b - 1.0),
    dy * y * log(where(greater(a, 0.0), a, ones_like(a)))))


def pow(x, y, output_shape=None, name=None):  # pylint: disable=redefined-builtin
  """x ** y, elementwise, broadcasting by dim name (either may be a Python number)."""
  return _binary_pow(x, y, output_shape=output_shape, name=name)


mtf_pow = pow
floordiv = _binary("floordiv", tf.math.floordiv)
mod = _binary("mod", tf.math.floormod)
less = _binary("less", tf.less, output_dtype=tf.bool)
greater = _binary("greater", tf.greater, output_dtype=tf.bool)
less_equal = _binary("less_equal", tf.less_equal, output_dtype=tf.bool)
greater_equal = _binary("greater_equal", tf.greater_equal, output_dtype=tf.bool)
equal = _binary("equal", tf.equal, output_dtype=tf.bool)
not_equal = _binary("not_equal", tf.not_equal, output_dtype=tf.bool)
logical_and = _binary("logical_and", tf.logical_and, output_dtype=tf.bool)
logical_or = _binary("logical_or", tf.logical_or, output_dtype=tf.bool)


class AddNOperation(Operation):
  """Sum of tensors of one shape and dtype. Partial sums still owing the same allreduce
  (see lowering/lazy_allreduce.py) are added locally and reduced once."""

  reads_owed_sums = True

  def __init__(self, xs, name=None):
    super().__init__(xs, name=name or "add_n")
    _check_dtypes(xs, self.name)
    self._add_output(xs[0].shape, xs[0].dtype)

  def gradient(self, grad_ys):
    return [grad_ys[0]] * len(self.inputs)

  def plan(self, layout, owed_axes=None):
    """The OpPlan on a MeshLayout, given the mesh axes of the SUM each input still owes
    (None: none); see plans/rules.add_n_plan."""
    owed_axes = owed_axes or [None] * len(self.inputs)
    return plan_rules.add_n_plan(layout, self.outputs[0].shape, list(owed_axes))

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    owed = [plan_interpreter.owed_axes(lowering, x) for x in self.inputs]
    plan_interpreter.lower_planned(lowering, self, self.plan(impl.slice_layout, owed),
                                   lambda *s: tf.add_n(list(s)))


def add_n(xs, name=None):
  """Sum of a list of tensors (broadcasting by name)."""
  xs = list(xs)
  if not xs:
    raise ShapeError("add_n needs at least one tensor")
  if len(xs) > 1 and all(x.shape == xs[0].shape for x in xs):
    return AddNOperation(xs, name=name).outputs[0]
  total = xs[0]
  for x in xs[1:]:
    total = add(total, x, name=name)
  return total


def ones_like(t):
  """Ones of t's shape and dtype."""
  from mesh_tf.ops import creation  # pylint: disable=g-import-not-at-top
  return creation.ones(t.mesh, t.shape, dtype=t.dtype)


def zeros_like(t):
  """Zeros of t's shape and dtype."""
  from mesh_tf.ops import creation  # pylint: disable=g-import-not-at-top
  return creation.zeros(t.mesh, t.shape, dtype=t.dtype)


def squared_relu(x):
  """relu(x) squared, elementwise."""
  return square(relu(x))


def where(condition, if_true, if_false, output_shape=None, name=None):
  """Elementwise choice, broadcasting all three arguments by dim name."""
  if not isinstance(if_true, Tensor):
    if_true, _ = binary_arguments_to_tensors(if_true, if_false)
  if not isinstance(if_false, Tensor):
    _, if_false = binary_arguments_to_tensors(if_true, if_false)
  if condition.dtype != tf.bool:
    raise ShapeError("where: condition %s must be bool, not %s"
                     % (condition.name, condition.dtype.name), tensor=condition.name)
  _check_dtypes([if_true, if_false], "where")

  def grad_function(op, grad_ys):
    (c, a, b), dy = op.inputs, grad_ys[0]
    zero = zeros_like(dy)
    return [None, _sum_to_shape(where(c, dy, zero), a.shape),
            _sum_to_shape(where(c, zero, dy), b.shape)]
  return broadcasting_op(tf.where, [condition, if_true, if_false], output_shape,
                         output_dtype=if_true.dtype, grad_function=grad_function,
                         name=name or "where", check_dtypes=False)
