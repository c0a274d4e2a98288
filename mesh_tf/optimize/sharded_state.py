"""Optimizer state split over the data-parallel mesh axes (ZeRO-style), opt-in.

With `shard_optimizer_state=True` an optimizer computes each variable's update on its
*shard view*: the same values renamed to optimizer-shard dims
(mesh_tf/shapes/optimizer_shard.py), so where the layout splits "batch" over a mesh axis
the variable is replicated over, each processor keeps 1/dp of every slot. Lowered, the
update is a reduce-scatter of the gradient (`ToShardOperation`), the slot arithmetic on
that slice, and an all-gather of the step, subtracted from the replicated variable as in
the unsharded optimizer. Slot names and full shapes do not change, so checkpoints restore
with or without sharded state.
"""
import tensorflow as tf

from mesh_tf.errors import MtfError
from mesh_tf.lowering import plan_interpreter
from mesh_tf.lowering.lazy_allreduce import LazyAllreduceSum
from mesh_tf.ops.reshape import ReshapeOperation, reshape
from mesh_tf.plans import rules as plan_rules
from mesh_tf.shapes import optimizer_shard


def check_flag(value, optimizer_name):
  """value (the shard_optimizer_state argument) as a bool; MtfError if not one."""
  if not isinstance(value, bool):
    raise MtfError("%s.shard_optimizer_state must be True or False, got %r (%s)"
                   % (optimizer_name, value, type(value).__name__))
  return value


def reject_stateless(value, optimizer_name, why):
  """MtfError when an optimizer without slots is asked to shard them."""
  check_flag(value, optimizer_name)
  if value:
    raise MtfError("%s.shard_optimizer_state=True: %s keeps no optimizer state (slots) to "
                   "shard; %s" % (optimizer_name, optimizer_name, why))


class ToShardOperation(ReshapeOperation):
  """The reshape into a shard view that reduce-scatters a gradient owing a SUM (the owed
  axes: from the cost model, or when lowered from the input's unforced LazyAllreduceSum)."""
  reads_owed_sums = True

  def plan(self, layout, owed_axes=None):
    """reshape_plan, with reduce-scatters where the input still owes its SUM."""
    owed = owed_axes[0] if owed_axes else None
    return plan_rules.reduce_scatter_reshape_plan(
        layout, self.inputs[0].shape, self.outputs[0].shape, owed)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    raw = lowering.tensors.raw(self.inputs[0])
    owed = (raw.mesh_axes if isinstance(raw, LazyAllreduceSum) and not raw.forced
            else None)
    plan = self.plan(impl.slice_layout, [owed])
    local = plan_interpreter.local_output_shape(lowering, self, plan)
    plan_interpreter.lower_planned(lowering, self, plan, lambda t: tf.reshape(t, local))


class ShardView:
  """Moves tensors of one variable's shape to and from its shard view (both directions
  are the identity with enabled=False)."""

  def __init__(self, var, enabled):
    self.var_shape = var.shape
    self.enabled = enabled
    self.shape = optimizer_shard.shard_shape(var.shape) if enabled else var.shape

  def dim(self, dim):
    """The shard-view dim of one of the variable's dims."""
    return self.shape.dims[self.var_shape.dims.index(dim)]

  def base_name(self, dim):
    """The variable's dim name of a shard-view dim."""
    return self.var_shape.dims[self.shape.dims.index(dim)].name

  def to_shard(self, x):
    """x (shaped like the variable) in the shard view."""
    if not self.enabled:
      return x
    return ToShardOperation(x, self.shape, name="to_optimizer_shard").outputs[0]

  def from_shard(self, x):
    """x (in the shard view) back in the variable's shape: an all-gather when split."""
    return reshape(x, self.var_shape, name="from_optimizer_shard") if self.enabled else x
