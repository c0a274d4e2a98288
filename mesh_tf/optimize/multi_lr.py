"""Per-variable learning-rate schedules: `compute_lr_for_step` and the MultiLR optimizers.

A schedule is None (the optimizer's own learning rate), a list of factor schedules
(multiplied by product_learning_rate), or a function `(step, total_train_steps) -> rate`;
each becomes a callable that reads the global step when the graph is lowered.
"""
import gin

from mesh_tf import learning_rate_schedules
from mesh_tf.errors import MtfError
from mesh_tf.optimize.adafactor import AdafactorOptimizer
from mesh_tf.optimize.adam import AdamWeightDecayOptimizer
from mesh_tf.optimize.base import name_matches
from mesh_tf.optimize.global_step import get_global_step


@gin.configurable(module="mesh_tf.optimize")
def product_learning_rate(step, total_train_steps, factors=gin.REQUIRED, offset=0):
  """The product of the factor schedules at step - offset (as in learning_rate_schedules)."""
  return learning_rate_schedules.product_learning_rate(step, total_train_steps,
                                                       factors=factors, offset=offset)


def _schedule_callable(schedule, train_steps):
  if isinstance(schedule, (list, tuple)):
    factors = list(schedule)
    return lambda: product_learning_rate(get_global_step(), train_steps, factors=factors)
  if callable(schedule):
    return lambda: schedule(get_global_step(), train_steps)
  raise MtfError("a learning-rate schedule must be None, a list of factor schedules or a "
                 "function (step, total_train_steps) -> rate; got %r" % (schedule,))


@gin.configurable(module="mesh_tf.optimize")
def compute_lr_for_step(schedules, learning_rate, train_steps=524288):
  """One learning rate per schedule: learning_rate for None, else a callable reading
  the global step at lowering time (see the module docstring)."""
  return [learning_rate if s is None else _schedule_callable(s, train_steps)
          for s in schedules]


class _MultiScheduleMixin:
  """Picks the learning rate of the first pattern in variable_search matching a
  variable's name (re.search); other variables use the optimizer's own rate."""

  def __init__(self, variable_search=None, alt_lr_schedules=None, **kwargs):
    train_steps = kwargs.pop("train_steps", 524288)
    super().__init__(**kwargs)
    if isinstance(variable_search, str):
      variable_search = [variable_search]
      alt_lr_schedules = [alt_lr_schedules]
    variable_search = list(variable_search or [])
    alt_lr_schedules = list(alt_lr_schedules or [])
    if len(variable_search) != len(alt_lr_schedules):
      raise MtfError("%s: %d variable_search patterns but %d alt_lr_schedules; give one "
                     "schedule per pattern" % (type(self).__name__, len(variable_search),
                                               len(alt_lr_schedules)))
    self._variable_search = variable_search
    self._alt_lrs = compute_lr_for_step(alt_lr_schedules, self.learning_rate, train_steps)

  def _learning_rate_for(self, var):
    for pattern, lr in zip(self._variable_search, self._alt_lrs):
      if name_matches(var.name, [pattern]):
        return lr
    return super()._learning_rate_for(var)


@gin.configurable(module="mesh_tf.optimize")
class AdafactorWithMultiLRSchedule(_MultiScheduleMixin, AdafactorOptimizer):
  """AdafactorOptimizer whose variables matching variable_search[i] follow
  alt_lr_schedules[i]; **kwargs go to AdafactorOptimizer."""


@gin.configurable(module="mesh_tf.optimize")
class AdamWithMultiLRSchedule(_MultiScheduleMixin, AdamWeightDecayOptimizer):
  """AdamWeightDecayOptimizer whose variables matching variable_search[i] follow
  alt_lr_schedules[i]; **kwargs go to AdamWeightDecayOptimizer."""
