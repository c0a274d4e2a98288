"""Writing variables (`assign`, `assign_add`, `assign_sub`) and ordering (`depend`)."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation
from mesh_tf.ops.variables import as_variable


def assign_slice(variable, slice_var):
  """Per-slice writer: variable := value."""
  return variable.assign(slice_var)


def assign_add_slice(variable, slice_var):
  """Per-slice writer: variable += value."""
  return variable.assign_add(slice_var)


def assign_sub_slice(variable, slice_var):
  """Per-slice writer: variable -= value."""
  return variable.assign_sub(slice_var)


def _group(ops):
  if tf.executing_eagerly():
    return None
  return tf.group(*[o for o in ops if o is not None])


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
  def has_gradient(self):
    return False

  def lower(self, lowering):
    ops = []
    for v, x in zip(self._variables, self.inputs):
      ops.extend(lowering.variables[v].assign_to_slices(self._assign_fn,
                                                        lowering.tensors[x]))
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
