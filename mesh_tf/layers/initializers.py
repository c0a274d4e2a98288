"""Initializers of dense kernels, computed from the kernel's named dimensions.

A `DenseInitializer` is called with (reduced_dims, new_dims) and returns an ordinary
initializer `fn(shape, dtype)`, so the fan-in and fan-out come from the dims the layer
contracts and creates rather than from positions in the shape.
"""
import math

import gin
import tensorflow as tf

from mesh_tf.errors import MtfError
from mesh_tf.shapes import list_product

# Standard deviation of a unit normal truncated to [-2, 2]; dividing by it makes a
# truncated normal draw have the requested standard deviation.
_TRUNCATED_NORMAL_STDDEV = 0.87962566103423978


@gin.configurable
def unit_scaling_convention(value=False):
  """Whether the unit-scaling convention is on (configure with gin).

  Under it, kernels are drawn with unit variance and `us_einsum` divides its result by
  sqrt(size of the contracted dims) instead.
  """
  return value


class DenseInitializer:
  """Base class: `init(reduced_dims, new_dims)` returns an initializer fn(shape, dtype)."""

  def __call__(self, reduced_dims, new_dims):
    raise NotImplementedError("%s does not implement __call__" % type(self).__name__)


def _sizes(dims):
  return list_product([d.size for d in dims])


@gin.configurable
class VarianceScalingInitializer(DenseInitializer):
  """Random kernel with variance scale / fan, the fan counted over named dims.

  Args:
    scale: the variance before dividing by the fan.
    mode: "fan_in" (size of the reduced dims), "fan_out" (size of the new dims) or
      "fan_avg" (their mean).
    distribution: "normal" / "truncated_normal" (truncated at 2 stddev, rescaled),
      "untruncated_normal", or "uniform".
  """

  _MODES = ("fan_in", "fan_out", "fan_avg")
  _DISTRIBUTIONS = ("normal", "truncated_normal", "untruncated_normal", "uniform")

  def __init__(self, scale=1.0, mode="fan_in", distribution="normal"):
    if mode not in self._MODES:
      raise MtfError("VarianceScalingInitializer: mode %r is not one of %s"
                     % (mode, self._MODES), rule=mode)
    if distribution not in self._DISTRIBUTIONS:
      raise MtfError("VarianceScalingInitializer: distribution %r is not one of %s"
                     % (distribution, self._DISTRIBUTIONS), rule=distribution)
    self.scale = scale
    self.mode = mode
    self.distribution = distribution

  def variance(self, reduced_dims, new_dims):
    """The variance of the kernel entries for these dims."""
    fan_in, fan_out = _sizes(reduced_dims), _sizes(new_dims)
    if unit_scaling_convention():
      if self.mode != "fan_in":
        raise MtfError("VarianceScalingInitializer: the unit-scaling convention only "
                       "supports mode 'fan_in', not %r" % self.mode, rule=self.mode)
      return self.scale
    fan = {"fan_in": fan_in, "fan_out": fan_out,
           "fan_avg": (fan_in + fan_out) / 2.0}[self.mode]
    return self.scale / max(1.0, fan)

  def __call__(self, reduced_dims, new_dims):
    variance = self.variance(reduced_dims, new_dims)
    distribution = self.distribution

    # TF1's initializers, looked up when the variable is made (as the original's were),
    # so a test that patches tf.compat.v1.truncated_normal_initializer sees the call.
    v1 = tf.compat.v1
    if distribution in ("normal", "truncated_normal"):
      make = v1.truncated_normal_initializer(
          stddev=math.sqrt(variance) / _TRUNCATED_NORMAL_STDDEV)
    elif distribution == "untruncated_normal":
      make = v1.random_normal_initializer(stddev=math.sqrt(variance))
    else:
      limit = math.sqrt(3.0 * variance)
      make = v1.random_uniform_initializer(-limit, limit)

    def init(shape, dtype=tf.float32, **unused_kwargs):
      return tf.cast(make(shape, dtype=tf.float32), dtype)
    return init
