"""Shape changes: reshape (which may change the layout and communicate), broadcast,
rename/replace dimensions, transpose, anonymize."""
import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation, Tensor
from mesh_tf.lowering import plan_interpreter
from mesh_tf.plans import rules as plan_rules
from mesh_tf.shapes import Dimension, Shape, anonymous_shape, convert_to_shape


class ReshapeOperation(Operation):
  """Reshape to a shape of the same size; may gather and re-split mesh axes."""

  def __init__(self, x, new_shape, name=None):
    super().__init__([x], name=name or "reshape")
    new_shape = convert_to_shape(new_shape)
    if new_shape.size != x.shape.size:
      raise ShapeError("reshape of %s from %s (size %d) to %s (size %d): sizes differ"
                       % (x.name, x.shape, x.shape.size, new_shape, new_shape.size),
                       op=self.name, tensor=x.name)
    self._add_output(new_shape, x.dtype)

  def gradient(self, grad_ys):
    return [reshape(grad_ys[0], self.inputs[0].shape)]

  def plan(self, layout):
    """The OpPlan of this reshape on a MeshLayout (see plans/rules.reshape_plan)."""
    return plan_rules.reshape_plan(layout, self.inputs[0].shape, self.outputs[0].shape)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    plan = self.plan(impl.slice_layout)
    if any(s.kind == "allconcat" for s in plan.operands[0].steps):
      lowering.add_counter("reshape_allconcat", impl.laid_out_size(self.inputs[0].shape))
    local = plan_interpreter.local_output_shape(lowering, self, plan)
    plan_interpreter.lower_planned(lowering, self, plan, lambda t: tf.reshape(t, local))


def reshape(x, new_shape, name="reshape"):
  """x with a new shape of the same total size (row-major order)."""
  new_shape = convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return ReshapeOperation(x, new_shape, name=name).outputs[0]


class BroadcastOperation(Operation):
  """Expands x to new_shape, a superset of its dims (any order)."""

  def __init__(self, x, output_shape, name=None):
    super().__init__([x], name=name or "broadcast")
    new_shape = convert_to_shape(output_shape)
    missing = [str(d) for d in x.shape.dims if d not in new_shape.dims]
    if missing:
      raise ShapeError("cannot broadcast %s %s to %s: dims %s are missing from the target"
                       % (x.name, x.shape, new_shape, missing), op=self.name, tensor=x.name)
    self._add_output(new_shape, x.dtype)

  def gradient(self, grad_ys):
    from mesh_tf.ops.reduce import reduce_sum  # pylint: disable=g-import-not-at-top
    return [reduce_sum(grad_ys[0], output_shape=self.inputs[0].shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    x, y = self.inputs[0], self.outputs[0]
    lowering.set_tensor_lowering(y, impl.broadcast_impl(lowering.tensors[x], x.shape,
                                                        y.shape))


def broadcast(x, new_shape, name=None):
  """x expanded (by dim name) to new_shape."""
  new_shape = convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return BroadcastOperation(x, new_shape, name=name).outputs[0]


def rename_dimension(x, old_name, new_name):
  """x with dim old_name called new_name (its layout may change, so it may communicate)."""
  if isinstance(x, Shape):
    return x.rename_dimension(old_name, new_name)
  if old_name not in x.shape.dimension_names:
    raise ShapeError("rename_dimension: no dim %r in %s %s (dims: %s)" % (
        old_name, x.name, x.shape, x.shape.dimension_names), tensor=x.name, dim=old_name)
  return reshape(x, x.shape.rename_dimension(old_name, new_name))


def replace_dimensions(tensor_or_shape, old_dim_or_dims, new_dim_or_dims):
  """Replaces a run of consecutive dims with new dims (reshaping a Tensor)."""
  if isinstance(tensor_or_shape, Tensor):
    return reshape(tensor_or_shape, replace_dimensions(
        tensor_or_shape.shape, old_dim_or_dims, new_dim_or_dims))
  shape = convert_to_shape(tensor_or_shape)
  old = [old_dim_or_dims] if isinstance(old_dim_or_dims, Dimension) else list(old_dim_or_dims)
  new = [new_dim_or_dims] if isinstance(new_dim_or_dims, Dimension) else list(new_dim_or_dims)
  if not old or not new:
    raise ShapeError("replace_dimensions needs non-empty old and new dims")
  dims = shape.dims
  if any(d not in dims for d in old):
    raise ShapeError("replace_dimensions: %s are not all dims of %s" % (
        [str(d) for d in old], shape))
  start = dims.index(old[0])
  if dims[start:start + len(old)] != old:
    raise ShapeError("replace_dimensions: %s must be consecutive dims of %s" % (
        [str(d) for d in old], shape))
  return Shape(dims[:start] + new + dims[start + len(old):])


def transpose(x, new_shape, name="transpose"):
  """x with its dims reordered to new_shape."""
  from mesh_tf.ops.einsum import einsum  # pylint: disable=g-import-not-at-top
  new_shape = convert_to_shape(new_shape)
  if set(new_shape.dims) != set(x.shape.dims):
    raise ShapeError("transpose of %s %s to %s: the dims must be the same" % (
        x.name, x.shape, new_shape), tensor=x.name)
  return einsum([x], output_shape=new_shape, name=name or "transpose")


def anonymize(x):
  """x with dims renamed so no layout rule matches: fully replicated."""
  return reshape(x, anonymous_shape(x.shape))
