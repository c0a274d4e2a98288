"""`Optimizer`: turns (gradient, variable) pairs into mtf assignment ops.

Lowering any one of the Assign ops `apply_grads` returns first reads every variable and
computes every gradient (see `_order_reads_before_writes`), so each update applies to the
values the step started from.
"""
import re

from absl import logging
import tensorflow as tf

from mesh_tf.errors import MtfError, ShapeError
from mesh_tf.graph import Operation, Tensor
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import reduce as reduce_ops
from mesh_tf.ops import variables as var_ops
from mesh_tf.ops.variables import Variable
from mesh_tf.optimize import lowering_time


class Optimizer:
  """Base class of the optimizers. Subclasses implement `apply_grad` and take the rate as
  `learning_rate` (a number, mtf scalar, tf.Variable or zero-argument callable)."""

  def apply_grads(self, grads, variables):
    """A list of mtf Assign ops applying grads[i] (an mtf Tensor, or None: the variable
    is left alone) to variables[i] (a Variable op, e.g. of graph.trainable_variables, or
    its value)."""
    variables, grads = _check_grads_and_variables(grads, variables)
    ops = []
    for grad, var in zip(grads, variables):
      if grad is None:
        logging.warning("no gradient for variable %s; it is not updated", var.name)
        continue
      ops.extend(self.apply_grad(grad, var))
    _order_reads_before_writes(ops, grads, variables)
    return ops

  def apply_grad(self, grad, var):
    """A list of mtf Assign ops updating Variable op `var` (and its slots) with grad."""
    raise MtfError("%s does not implement apply_grad (variable %r)"
                   % (type(self).__name__, var.name), tensor=var.name)

  def _scalar(self, mesh, value, dtype, what):
    """value (a rate given to the constructor) as an mtf scalar or number on mesh."""
    cache = self.__dict__.setdefault("_scalar_cache", lowering_time.ScalarCache())
    return cache.get(mesh, value, dtype, "%s.%s" % (type(self).__name__, what))


def _as_variable_op(var, index):
  if isinstance(var, Variable):
    return var
  if isinstance(var, Tensor) and isinstance(var.operation, Variable):
    return var.operation
  raise ShapeError("variables[%d] is %r, not a variable: pass Variable ops (e.g. "
                   "graph.trainable_variables) or the tensors mtf.get_variable returned"
                   % (index, var), tensor=getattr(var, "name", None))


def _check_grads_and_variables(grads, variables):
  """Variable ops and grads, after checking they pair up (count, mesh, shape, dtype)."""
  grads, variables = list(grads), list(variables)
  if len(grads) != len(variables):
    raise MtfError("apply_grads got %d gradients for %d variables (%s); give exactly one "
                   "gradient (or None) per variable"
                   % (len(grads), len(variables),
                      ", ".join(repr(getattr(v, "name", v)) for v in variables[:5])))
  variables = [_as_variable_op(v, i) for i, v in enumerate(variables)]
  seen = set()
  for i, (grad, var) in enumerate(zip(grads, variables)):
    if var.name in seen:
      raise MtfError("variable %r appears twice in apply_grads; it would be updated twice"
                     % var.name, tensor=var.name)
    seen.add(var.name)
    if grad is None:
      continue
    if not isinstance(grad, Tensor):
      raise ShapeError("gradient %d for variable %r is %r, not an mtf Tensor"
                       % (i, var.name, grad), tensor=var.name)
    if grad.mesh is not var.mesh:
      raise ShapeError("gradient %s for variable %r is on mesh %r, the variable on %r"
                       % (grad.name, var.name, grad.mesh, var.mesh), tensor=var.name)
    if grad.shape != var.shape:
      raise ShapeError("gradient %s has shape %s but variable %r has shape %s (the "
                       "gradients and variables lists must be in the same order)"
                       % (grad.name, grad.shape.to_string, var.name,
                          var.shape.to_string), tensor=var.name)
    if not grad.dtype.is_floating:
      raise ShapeError("gradient %s for variable %r has dtype %s; gradients must be "
                       "floating point" % (grad.name, var.name, grad.dtype.name),
                       tensor=var.name)
  return variables, grads


class ReadsBarrier(Operation):
  """Emits nothing; lowering it first lowers its control_inputs (reads and gradients)."""

  def __init__(self, mesh, dependencies):
    super().__init__([], mesh=mesh, name="optimizer_reads")
    self.control_inputs = list(dependencies)

  @property
  def has_gradient(self):
    return False

  def lower(self, lowering):
    lowering.operations[self] = None


def _order_reads_before_writes(ops, grads, variables):
  """Makes lowering any update op first lower every gradient and variable read.

  Lowering emits ops on demand, so one update's write could otherwise come before
  another update's gradient reads that variable. Each update op gets one barrier in its
  control_inputs, whose own control_inputs are the gradients and all variables (weights
  and slots)."""
  if not ops:
    return
  deps = [g.operation for g in grads if g is not None] + list(variables)
  deps += [v for op in ops for v in getattr(op, "variables", ())]
  barrier = ReadsBarrier(variables[0].mesh, {id(d): d for d in deps}.values())
  for op in ops:
    op.control_inputs = list(getattr(op, "control_inputs", ())) + [barrier]


def reduce_rms(x, **kwargs):
  """Root mean square of the elements of mtf Tensor x: a scalar, or over the dims that
  kwargs (those of mtf.reduce_mean: reduced_dim=, output_shape=, name=) select."""
  return ew.sqrt(reduce_ops.reduce_mean(ew.square(x), **kwargs))


def clip_by_global_norm(grads, clip_norm):
  """(grads scaled so their joint L2 norm is at most clip_norm, the float32 global norm);
  None entries stay None; clip_norm may be a number or an mtf scalar."""
  present = [g for g in grads if g is not None]
  if not present:
    raise MtfError("clip_by_global_norm got no gradients (all %d are None)" % len(grads))
  squares = [reduce_ops.reduce_sum(ew.square(ew.to_float(g))) for g in present]
  global_norm = ew.sqrt(ew.add_n(squares) if len(squares) > 1 else squares[0])
  multiplier = clip_norm / ew.maximum(global_norm, clip_norm)
  clipped = [None if g is None else g * ew.cast(multiplier, g.dtype) for g in grads]
  return clipped, global_norm


def name_matches(name, patterns):
  """True when any regular expression in patterns matches (re.search) the name."""
  return any(re.search(p, name) is not None for p in patterns or ())


def make_slot(var, suffix, shape=None, dtype=tf.float32):
  """A zero-initialized, non-trainable mtf variable `<var.name><suffix>` (its value);
  dtype may be a tf.DType or a VariableDType."""
  return var_ops.get_variable(var.mesh, var.name + suffix,
                              var.shape if shape is None else shape, dtype=dtype,
                              initializer=tf.zeros_initializer(), trainable=False)


def cast_to(x, dtype):
  """mtf Tensor x in dtype (x itself when it already has it)."""
  return x if x.dtype == dtype else ew.cast(x, dtype)
