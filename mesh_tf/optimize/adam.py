"""Adam with decoupled weight decay (the BERT variant the original ships)."""
import gin
import tensorflow as tf

from mesh_tf.ops.assign import assign, assign_sub
from mesh_tf.ops import elementwise as ew
from mesh_tf.optimize import lowering_time
from mesh_tf.optimize import sharded_state
from mesh_tf.optimize.base import Optimizer, make_slot, name_matches


@gin.configurable(module="mesh_tf.optimize")
class AdamWeightDecayOptimizer(Optimizer):
  """Adam without bias correction, plus weight_decay_rate * var added to the update.

      m = beta_1 m + (1 - beta_1) g;   v = beta_2 v + (1 - beta_2) g^2
      var -= learning_rate * (m / (sqrt(v) + epsilon) + weight_decay_rate * var)

  The decay term is skipped for variables whose name matches (re.search) a pattern of
  exclude_from_weight_decay. Slots are float32 variables `<var>/adam_m` and
  `<var>/adam_v`, the original's names; the update is computed in float32.
  """

  def __init__(self, learning_rate, weight_decay_rate=0.0, beta_1=0.9, beta_2=0.999,
               epsilon=1e-6, exclude_from_weight_decay=None, shard_optimizer_state=False):
    for what, value in (("learning_rate", learning_rate),
                        ("weight_decay_rate", weight_decay_rate), ("beta_1", beta_1),
                        ("beta_2", beta_2), ("epsilon", epsilon)):
      lowering_time.check_rate(value, "AdamWeightDecayOptimizer.%s" % what)
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = exclude_from_weight_decay
    self.shard_optimizer_state = sharded_state.check_flag(
        shard_optimizer_state, type(self).__name__)

  def _do_use_weight_decay(self, param_name):
    """Whether the variable called param_name gets the weight-decay term."""
    if isinstance(self.weight_decay_rate, (int, float)) and not self.weight_decay_rate:
      return False
    return not name_matches(param_name, self.exclude_from_weight_decay)

  def _learning_rate_for(self, var):
    """The learning rate applied to var (subclasses may pick one per variable)."""
    del var
    return self.learning_rate

  def apply_grad(self, grad, var):
    mesh = var.mesh
    view = sharded_state.ShardView(var, self.shard_optimizer_state)
    grad = ew.to_float(view.to_shard(grad))
    m = make_slot(var, "/adam_m", view.shape)
    v = make_slot(var, "/adam_v", view.shape)
    beta_1 = self._scalar(mesh, self.beta_1, tf.float32, "beta_1")
    beta_2 = self._scalar(mesh, self.beta_2, tf.float32, "beta_2")
    next_m = m * beta_1 + grad * (1.0 - beta_1)
    next_v = v * beta_2 + ew.square(grad) * (1.0 - beta_2)
    update = next_m / (ew.sqrt(next_v) + self._scalar(mesh, self.epsilon, tf.float32,
                                                      "epsilon"))
    if self._do_use_weight_decay(var.name):
      decay = self._scalar(mesh, self.weight_decay_rate, tf.float32, "weight_decay_rate")
      update += view.to_shard(ew.to_float(var.value)) * decay
    lr = self._scalar(mesh, self._learning_rate_for(var), tf.float32, "learning_rate")
    return [assign_sub(var, view.from_shard(update * lr)),
            assign(m, next_m),
            assign(v, next_v)]
