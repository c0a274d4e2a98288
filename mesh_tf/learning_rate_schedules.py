"""Learning-rate schedules (the original's transformer/learning_rate_schedules.py).

Every schedule is a gin-configurable function `(step, total_train_steps, **options) ->
scalar`, where step is an integer or a TF scalar (e.g. the global step) and the result a
float32 tf.Tensor or a Python number. To drive an mtf optimizer, give it a callable, e.g.
`SgdOptimizer(lambda: truncated_rsqrt(mtf.optimize.get_global_step(), 1000))`.
"""
import math

import gin
import tensorflow as tf


def _float(step):
  return tf.cast(step, tf.float32)


def _steps(steps_or_fraction, total_train_steps):
  """A step count given either directly or (if <= 1) as a fraction of training."""
  if steps_or_fraction <= 1:
    return float(steps_or_fraction) * float(total_train_steps)
  return float(steps_or_fraction)


@gin.configurable
def product_learning_rate(step, total_train_steps, factors=gin.REQUIRED, offset=0):
  """The product of the schedules in factors, each evaluated at step - offset."""
  result = 1.0
  for factor in factors:
    result *= factor(step - offset, total_train_steps)
  return result


@gin.configurable
def linear_decay(step, total_train_steps, steps_or_fraction=0.1):
  """1.0, then falling linearly to 0 over the last steps (or fraction) of training."""
  decay_steps = _steps(steps_or_fraction, total_train_steps)
  return tf.minimum(1.0, (float(total_train_steps) - _float(step)) / decay_steps)


@gin.configurable
def linear_warmup(step, total_train_steps, steps_or_fraction=10000):
  """Rising linearly from 0 to 1.0 over the first steps (or fraction) of training."""
  warmup_steps = _steps(steps_or_fraction, total_train_steps)
  return tf.minimum(1.0, _float(step) / warmup_steps)


@gin.configurable
def truncated_rsqrt(step, total_train_steps, warmup_steps=10000):
  """1 / sqrt(max(step, warmup_steps)): constant during warm-up, then rsqrt decay."""
  del total_train_steps
  return tf.math.rsqrt(tf.maximum(_float(step), float(warmup_steps)))


@gin.configurable
def constant(step, total_train_steps, value=1.0):
  """The same value at every step (a factor for product_learning_rate)."""
  del step, total_train_steps
  return value


@gin.configurable
def constant_learning_rate(step, total_train_steps, learning_rate=gin.REQUIRED):
  """The same learning rate at every step."""
  del step, total_train_steps
  return learning_rate


@gin.configurable
def linear_decay_learning_rate(step, total_train_steps, initial_lr=0.1, offset=0):
  """initial_lr until step `offset`, then linearly down to 0 at total_train_steps."""
  remaining = float(total_train_steps) - _float(step)
  return initial_lr * tf.minimum(1.0, remaining / (float(total_train_steps) - offset))


@gin.configurable
def learning_rate_schedule_noam(step, total_train_steps, warmup_steps=10000,
                                linear_decay_fraction=0.1, multiplier=1.0, offset=0):
  """multiplier * rsqrt(max(step, warmup_steps)), linearly decayed to 0 over the last
  linear_decay_fraction of training (no decay when it is 0); step counts from offset."""
  step_num = _float(step) - float(offset)
  learning_rate = tf.math.rsqrt(tf.maximum(step_num, float(warmup_steps))) * multiplier
  if linear_decay_fraction > 0:
    train_steps = float(total_train_steps)
    learning_rate *= tf.minimum(
        1.0, (train_steps - step_num) / (train_steps * linear_decay_fraction))
  return learning_rate


@gin.configurable
def slanted_triangular(step, total_train_steps, cut_fraction=0.1, ratio=32,
                       max_learning_rate=0.01, start_step=0):
  """ULMFiT's slanted triangle (Howard & Ruder, 2018): a short linear rise to
  max_learning_rate over cut_fraction of training, then a long linear fall; the
  lowest rate is max_learning_rate / ratio. Steps count from start_step."""
  train_steps = float(total_train_steps - start_step)
  cut = float(math.floor(train_steps * cut_fraction))
  step_num = _float(step) - float(start_step)
  p = tf.where(step_num < cut, step_num / cut,
               1.0 - (step_num - cut) / (cut * (1.0 / cut_fraction - 1.0)))
  return max_learning_rate * (1.0 + p * (ratio - 1.0)) / ratio
