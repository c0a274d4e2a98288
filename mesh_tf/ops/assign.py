"""Writing variables (`assign`, `assign_add`, `assign_sub`) and ordering (`depend`).

An assign function has the original's contract `assign_fn(variable, slice_var, value)`:
`slice_var` is the TF variable holding one processor's slice (for the SIMD emulation: all
slices at once) and `value` its new value.
"""
import inspect

import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation
from mesh_tf.lowering import direct_ops
from mesh_tf.ops.variables import as_variable


def assign_slice(variable, slice_var, val):
  """Per-slice writer: slice_var := val (variable is the mtf Variable, unused)."""
  del variable
  return direct_ops.write_variable("assign", slice_var, val)


def assign_add_slice(variable, slice_var, val):
  """Per-slice writer: slice_var += val."""
  del variable
  return direct_ops.write_variable("assign_add", slice_var, val)


def assign_sub_slice(variable, slice_var, val):
  """Per-slice writer: slice_var -= val."""
  del variable
  return direct_ops.write_variable("assign_sub", slice_var, val)


def _takes_three_arguments(fn):
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return True
  if any(p.kind == p.VAR_POSITIONAL for p in params):
    return True
  return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
              and p.default is p.empty]) >= 3


def slice_writer(assign_fn, variable):
  """The backends' per-slice writer (slice_var, value) for assign_fn and mtf variable;
  a two-argument assign_fn(slice_var, value) is accepted too."""
  if _takes_three_arguments(assign_fn):
    return lambda slice_var, val: assign_fn(variable, slice_var, val)
  return assign_fn


def _group(ops):
  if tf.executing_eagerly():
    return None
  ops = [o if isinstance(o, tf.Operation) else getattr(o, "op", o) for o in ops
         if o is not None]
  if len(ops) == 1 and isinstance(ops[0], tf.Operation):
    return ops[0]
  # One NoOp waiting for every write (tf.group would add one more per device).
  with tf.control_dependencies(ops):
    return tf.no_op()


class Assign(Operation):
  """Writes new values into one or more variables with assign_fn, slice by slice."""

  def __init__(self, variables, new_values, assign_fn=assign_slice, name=None):
    variables = [as_variable(v) for v in variables]
    super().__init__(list(new_values), mesh=variables[0].mesh, name=name or "assign")
    for v, x in zip(variables, self.inputs):
      if x.shape != v.shape:
        raise ShapeError("assign to variable %r of shape %s from %s of shape %s: shapes "
                         "differ (reorder with mtf.transpose if only the order differs)"
                         % (v.name, v.shape, x.name, x.shape), op=self.name, tensor=v.name)
    self._variables = variables
    self._assign_fn = assign_fn

  @property
  def variables(self):
    return self._variables

  @property
  def assign_fn(self):
    """The per-slice writer, assign_fn(variable, slice_var, value)."""
    return self._assign_fn

  @property
  def has_gradient(self):
    return False

  def lower(self, lowering):
    ops = []
    for v, x in zip(self._variables, self.inputs):
      ops.extend(lowering.variables[v].assign_to_slices(
          slice_writer(self._assign_fn, v), lowering.tensors[x]))
    lowering.operations[self] = _group(ops)


def assign(var, new_val, assign_fn=assign_slice, name=None):
  """An op writing new_val into var (a variable or the value of get_variable)."""
  return Assign([var], [new_val], assign_fn=assign_fn, name=name)


def assign_add(var, new_val, name=None):
  """An op adding new_val to var."""
  return Assign([var], [new_val], assign_fn=assign_add_slice, name=name or "assign_add")


def assign_sub(var, new_val, name=None):
  """An op subtracting new_val from var."""
  return Assign([var], [new_val], assign_fn=assign_sub_slice, name=name or "assign_sub")


class Depend(Operation):
  """x, but only after the given operations have run."""

  def __init__(self, x, dependencies, name=None):
    super().__init__([x], name=name or "depend")
    self.control_inputs = [d.operation if hasattr(d, "operation") else d
                           for d in dependencies]
    self._add_output(x.shape, x.dtype)

  def gradient(self, grad_ys):
    return grad_ys

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    deps = [lowering.operations.get(d) for d in self.control_inputs]
    deps += [t for d in self.control_inputs for y in d.outputs
             for t in impl.control_tensors(lowering.tensors[y])]
    deps = [d for d in deps if d is not None] if not tf.executing_eagerly() else []

    def fn(t):
      with tf.control_dependencies(deps):
        return tf.identity(t)
    lowering.set_tensor_lowering(self.outputs[0], impl.slicewise(fn, lowering.tensors[
        self.inputs[0]]))


def depend(x, dependencies):
  """x, ordered after `dependencies` (operations or tensors)."""
  return Depend(x, dependencies).outputs[0]
