"""Reductions over named dimensions: a local reduce, then an allreduce over the mesh axes
that split a reduced dimension."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation
from mesh_tf.lowering import direct_ops, plan_interpreter
from mesh_tf.lowering import reductions
from mesh_tf.lowering.reductions import canonical_reduction
from mesh_tf.ops import elementwise as ew
from mesh_tf.plans import rules as plan_rules
from mesh_tf.shapes import Dimension, Shape, convert_to_shape


class ReduceOperation(Operation):
  """Reduces x to output_shape (a subset of its dims, in any order) with SUM, MAX, MIN or
  MEAN (TF's fused mean per slice; the slices' means are summed over the mesh axes
  splitting a reduced dim, each scaled by 1 / their processor count)."""

  def __init__(self, x, output_shape, reduction_fn_string, name=None):
    super().__init__([x], name=name or "reduce")
    output_shape = convert_to_shape(output_shape)
    extra = [d for d in output_shape.dims if d not in x.shape.dims]
    if extra:
      raise ShapeError("reduce of %s %s: output dims %s are not dims of the input"
                       % (x.name, x.shape, [str(d) for d in extra]), tensor=x.name)
    reduction_fn_string = canonical_reduction(reduction_fn_string)
    if reduction_fn_string not in reductions.OP_REDUCTIONS:
      raise ShapeError("unknown reduction %r; use one of %s"
                       % (reduction_fn_string, sorted(reductions.OP_REDUCTIONS)))
    self.reduction_fn_string = reduction_fn_string
    self._add_output(output_shape, x.dtype)

  def gradient(self, grad_ys):
    from mesh_tf.ops.reshape import broadcast  # pylint: disable=g-import-not-at-top
    x, y, dy = self.inputs[0], self.outputs[0], grad_ys[0]
    if self.reduction_fn_string == "SUM":
      return [broadcast(dy, x.shape)]
    if self.reduction_fn_string == "MEAN":
      return [broadcast(dy * (float(y.shape.size) / x.shape.size), x.shape)]
    mask = ew.cast(ew.equal(x, broadcast(y, x.shape)), x.dtype)
    return [mask * dy / reduce_sum(mask, output_shape=y.shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, y = self.inputs[0], self.outputs[0]
    in_names = x.shape.dimension_names
    axes = [i for i, n in enumerate(in_names) if n not in y.shape.dimension_names]
    kept = [n for n in in_names if n in y.shape.dimension_names]
    perm = [kept.index(n) for n in y.shape.dimension_names]
    tf_reduce = reductions.op_reduction_fn(self.reduction_fn_string)
    plan = self.plan(impl.slice_layout)
    summed = plan.outputs[0][0].mesh_axes if plan.outputs[0] else ()
    shards = impl.slice_layout.axes_size(summed) if self.reduction_fn_string == "MEAN" else 1

    def fn(t):
      r = direct_ops.reduce(tf_reduce, t, axes) if axes else t
      r = r * (1.0 / shards) if shards > 1 else r
      return direct_ops.transpose(r, perm) if perm != sorted(perm) else r
    plan_interpreter.lower_planned(lowering, self, plan, fn)

  def plan(self, layout):
    """The OpPlan of this reduction on a MeshLayout (see plans/rules.py)."""
    reduction = self.reduction_fn_string
    return plan_rules.reduce_plan(layout, self.inputs[0].shape, self.outputs[0].shape,
                                  "SUM" if reduction == "MEAN" else reduction)


def _output_shape(x, output_shape, reduced_dim, disable_positional_args, fn_name):
  if disable_positional_args is not None:
    raise ShapeError("%s takes output_shape/reduced_dim as keyword arguments only" % fn_name)
  if output_shape is not None:
    return convert_to_shape(output_shape)
  if reduced_dim is None:
    return Shape([])
  # One dim (a Dimension, a (name, size) pair or a name), or a list/Shape of them.
  single = isinstance(reduced_dim, (str, Dimension)) or (
      isinstance(reduced_dim, tuple) and reduced_dim and isinstance(reduced_dim[0], str))
  reduced = [reduced_dim] if single else list(reduced_dim)
  for d in reduced:
    name = d if isinstance(d, str) else d[0]
    if name not in x.shape.dimension_names:
      raise ShapeError("%s: reduced dim %r is not a dim of %s %s (dims: %s)" % (
          fn_name, name, x.name, x.shape, x.shape.dimension_names), tensor=x.name, dim=name)
  return x.shape - reduced


def _reduce(fn_name, reduction):
  def public_fn(x, disable_positional_args=None, output_shape=None, reduced_dim=None,
                name=None):
    out = _output_shape(x, output_shape, reduced_dim, disable_positional_args, fn_name)
    if out == x.shape:
      return x
    return ReduceOperation(x, out, reduction, name=name or fn_name).outputs[0]
  public_fn.__name__ = fn_name
  public_fn.__doc__ = ("%s of x over the dims not in output_shape (or over reduced_dim); "
                       "keyword arguments only." % reduction.title())
  return public_fn


reduce_sum = _reduce("reduce_sum", "SUM")
reduce_max = _reduce("reduce_max", "MAX")
reduce_min = _reduce("reduce_min", "MIN")


def reduce_mean(x, disable_positional_args=None, output_shape=None, reduced_dim=None,
                name=None):
  """Mean of x over the dims not in output_shape (or over reduced_dim)."""
  out = _output_shape(x, output_shape, reduced_dim, disable_positional_args, "reduce_mean")
  if out == x.shape:
    return x
  if not x.dtype.is_floating:  # an integer mean is the sum scaled, as in the original
    return reduce_sum(x, output_shape=out, name=name) * (float(out.size) / x.shape.size)
  return ReduceOperation(x, out, "MEAN", name=name or "reduce_mean").outputs[0]


def _reduce_bool(x, out, reducer, name):
  if x.dtype != tf.bool:
    raise ShapeError("%s needs a bool tensor; %s is %s" % (name, x.name, x.dtype.name),
                     tensor=x.name)
  return ew.cast(reducer(ew.cast(x, tf.float32), output_shape=out, name=name), tf.bool)


def reduce_all(x, disable_positional_args=None, output_shape=None, reduced_dim=None,
               name=None):
  """Logical AND over the reduced dims (a MIN over 0/1 floats)."""
  out = _output_shape(x, output_shape, reduced_dim, disable_positional_args, "reduce_all")
  return _reduce_bool(x, out, reduce_min, name or "reduce_all")


def reduce_any(x, disable_positional_args=None, output_shape=None, reduced_dim=None,
               name=None):
  """Logical OR over the reduced dims (a MAX over 0/1 floats)."""
  out = _output_shape(x, output_shape, reduced_dim, disable_positional_args, "reduce_any")
  return _reduce_bool(x, out, reduce_max, name or "reduce_any")


def _reduced_dim_of(x, reduced_dim, fn_name):
  """The Dimension of x named by reduced_dim (a Dimension, pair or name)."""
  reduced_shape = _output_shape(x, None, reduced_dim, None, fn_name)
  return [d for d in x.shape.dims if d not in reduced_shape.dims], reduced_shape


def _fused(x, reduced_dim, kind, extra_logit, name):
  """The fused op when reduced_dim is one dim and there is no extra_logit, else None."""
  dims, _ = _reduced_dim_of(x, reduced_dim, kind)
  if extra_logit is not None or len(dims) != 1:
    return None
  from mesh_tf.ops import fused_softmax  # pylint: disable=g-import-not-at-top
  return fused_softmax.fused_softmax(x, dims[0], kind, name=name)


def reduce_logsumexp(x, reduced_dim, extra_logit=None, name=None):
  """log(sum(exp(x))) over reduced_dim, computed stably; extra_logit adds one more term."""
  fused = _fused(x, reduced_dim, "logsumexp", extra_logit, name)
  if fused is not None:
    return fused
  from mesh_tf.autodiff.gradients import stop_gradient  # pylint: disable=g-import-not-at-top
  _, reduced_shape = _reduced_dim_of(x, reduced_dim, "reduce_logsumexp")
  max_logit = reduce_max(stop_gradient(x), output_shape=reduced_shape)
  if extra_logit is not None:
    max_logit = ew.maximum(max_logit, extra_logit)
  total = reduce_sum(ew.exp(x - max_logit), output_shape=reduced_shape)
  if extra_logit is not None:
    total += ew.exp(extra_logit - max_logit)
  return ew.add(ew.log(total), max_logit, name=name)


def softmax(x, reduced_dim, extra_logit=None, name=None):
  """exp(x) normalized over reduced_dim."""
  fused = _fused(x, reduced_dim, "softmax", extra_logit, name)
  if fused is not None:
    return fused
  return ew.exp(log_softmax(x, reduced_dim, extra_logit=extra_logit), name=name)


def log_softmax(x, reduced_dim, extra_logit=None, name=None):
  """x minus its logsumexp over reduced_dim."""
  fused = _fused(x, reduced_dim, "log_softmax", extra_logit, name)
  if fused is not None:
    return fused
  return ew.sub(x, reduce_logsumexp(x, reduced_dim, extra_logit=extra_logit), name=name)
