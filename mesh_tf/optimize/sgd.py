"""Plain and momentum stochastic gradient descent."""
import gin

from mesh_tf.ops.assign import assign, assign_sub
from mesh_tf.ops.variables import VariableDType
from mesh_tf.optimize import lowering_time
from mesh_tf.optimize import sharded_state
from mesh_tf.optimize.base import Optimizer, cast_to, make_slot


@gin.configurable(module="mesh_tf.optimize")
class SgdOptimizer(Optimizer):
  """var -= learning_rate * grad, with assign_sub (a bfloat16 variable gets the small
  difference added). It keeps no state, so shard_optimizer_state=True is an error."""

  def __init__(self, learning_rate, shard_optimizer_state=False):
    lowering_time.check_rate(learning_rate, "SgdOptimizer.learning_rate")
    sharded_state.reject_stateless(
        shard_optimizer_state, "SgdOptimizer",
        "use MomentumOptimizer or an Adam/Adafactor optimizer to shard state")
    self._lr = learning_rate

  @property
  def lr(self):
    """The learning rate as given."""
    return self._lr

  learning_rate = lr

  def apply_grad(self, grad, var):
    lr = self._scalar(var.mesh, self._lr, grad.dtype, "learning_rate")
    return [assign_sub(var, grad * lr)]


@gin.configurable(module="mesh_tf.optimize")
class MomentumOptimizer(Optimizer):
  """Heavy-ball momentum: v = momentum * v + learning_rate * grad; var -= v.

  The velocity slot is `<var>_momentum_v`, with the variable's own VariableDType. The step
  subtracts the *new* velocity, as tf.compat.v1.train.MomentumOptimizer does."""

  def __init__(self, learning_rate, momentum, shard_optimizer_state=False):
    lowering_time.check_rate(learning_rate, "MomentumOptimizer.learning_rate")
    lowering_time.check_rate(momentum, "MomentumOptimizer.momentum")
    self._lr = learning_rate
    self._momentum = momentum
    self.shard_optimizer_state = sharded_state.check_flag(
        shard_optimizer_state, type(self).__name__)

  @property
  def lr(self):
    """The learning rate as given."""
    return self._lr

  learning_rate = lr

  @property
  def momentum(self):
    """The momentum coefficient as given."""
    return self._momentum

  def apply_grad(self, grad, var):
    view = sharded_state.ShardView(var, self.shard_optimizer_state)
    velocity = make_slot(var, "_momentum_v", view.shape, dtype=VariableDType(
        var.master_dtype, var.slice_dtype, var.activation_dtype))
    dtype = velocity.dtype
    lr = self._scalar(var.mesh, self._lr, dtype, "learning_rate")
    momentum = self._scalar(var.mesh, self._momentum, dtype, "momentum")
    new_velocity = velocity * momentum + cast_to(view.to_shard(grad), dtype) * lr
    return [assign(velocity, new_velocity),
            assign_sub(var, view.from_shard(new_velocity))]
