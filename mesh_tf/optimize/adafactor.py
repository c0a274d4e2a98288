"""Adafactor (Shazeer & Stern, 2018): Adam-like steps with factored second moments.

For a variable with two dims of at least min_dim_size_to_factor elements (d0 the largest,
d1 the second largest; any other dims are carried along), the running mean of grad^2 is
kept as two smaller slots instead of one of the variable's size:

    vr = decay * vr + (1 - decay) * mean over d0 of (grad^2 + epsilon1)   # shape - d0
    vc = decay * vc + (1 - decay) * mean over d1 of (grad^2 + epsilon1)   # shape - d1
    x  = grad * rsqrt(vr / mean over d1 of vr) * rsqrt(vc)

Unfactored variables keep `v` of their own shape and use x = grad * rsqrt(v). Then x is
divided by max(1, rms(x) / clipping_threshold), scaled by the learning rate (times
max(rms(var), epsilon2) with multiply_by_parameter_scale), optionally averaged with
momentum beta1, and subtracted from the variable. Slots are float32 variables
`<var>_slot_vr`, `<var>_slot_vc`, `<var>_slot_v` and `<var>_slot_m`, as in the original.
Rates may follow the global step: they are computed at lowering time (`lowering_time`).
"""
import gin
import tensorflow as tf

from mesh_tf.errors import MtfError
from mesh_tf.ops.assign import assign, assign_sub
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import reduce as reduce_ops
from mesh_tf.optimize import lowering_time
from mesh_tf.optimize import sharded_state
from mesh_tf.optimize.base import Optimizer, make_slot, name_matches
from mesh_tf.optimize.global_step import step_num
from mesh_tf.shapes import Shape


def _step_function(fn, description):
  fn.__name__ = description
  fn.__qualname__ = description
  return fn


@gin.configurable(module="mesh_tf.optimize")
def adafactor_decay_rate_adam(beta2):
  """Second-moment decay giving Adam's bias-corrected average with this beta2: a callable
  computing beta2 (1 - beta2^(t-1)) / (1 - beta2^t), t = global step + 1, when called."""
  def rate():
    t = step_num() + 1.0
    return beta2 * (1.0 - tf.pow(beta2, t - 1.0)) / (1.0 - tf.pow(beta2, t))
  return _step_function(rate, "adafactor_decay_rate_adam(%r)" % (beta2,))


@gin.configurable(module="mesh_tf.optimize")
def adafactor_decay_rate_pow(exponent=0.8, offset=0):
  """Second-moment decay 1 - (step - offset + 1)^-exponent (memory grows as
  step^exponent): a zero-argument callable reading the global step when called."""
  def rate():
    return 1.0 - tf.pow(step_num() - float(offset) + 1.0, -float(exponent))
  return _step_function(rate, "adafactor_decay_rate_pow(%r, %r)" % (exponent, offset))


def _default_learning_rate(multiply_by_parameter_scale):
  """min(rsqrt(step + 1), 0.01), times 0.05 without parameter scaling (unless the
  unit-scaling convention of mtf.layers is on)."""
  factor = 1.0
  if not multiply_by_parameter_scale and not _unit_scaling_convention():
    factor = 0.05

  def rate():
    return tf.minimum(tf.math.rsqrt(step_num() + 1.0), 0.01) * factor
  return _step_function(rate, "adafactor_default_learning_rate")


def _is_on(rate):
  """False only for a rate that is literally zero (tensors and callables count as on)."""
  return not isinstance(rate, (int, float)) or rate != 0


def _unit_scaling_convention():
  from mesh_tf.layers import initializers  # pylint: disable=g-import-not-at-top
  return bool(initializers.unit_scaling_convention())


@gin.configurable(module="mesh_tf.optimize")
class AdafactorOptimizer(Optimizer):
  """Adafactor; see the module docstring for the update.

  Args:
    multiply_by_parameter_scale: scale steps by max(rms(var), epsilon2).
    learning_rate: None for min(rsqrt(step + 1), 0.01) (x 0.05 without parameter
      scaling); else a number, mtf scalar, tf.Variable or zero-argument callable.
    decay_rate: None for adafactor_decay_rate_pow(0.8); same kinds as learning_rate.
    beta1: momentum on the scaled steps (0 keeps no first-moment slot).
    clipping_threshold: clip each update's rms to this (None: no clipping).
    factored: whether to factor second moments at all.
    epsilon1: added to grad^2; epsilon2: floor of the parameter scale.
    min_dim_size_to_factor: factor only if the two largest dims are at least this.
    stacked_dim_names: names of dims along which a variable is a stack of separate
      variables: they are never factored, and the parameter scale and clipping are
      computed for each index of them separately.
    exclude_from_parameter_scale: regular expressions; matching variable names
      (re.search) are not scaled by their rms.
    shard_optimizer_state: split the slots over the data-parallel mesh axes (see
      `sharded_state`); a factored slot is split where the dim it keeps is.
  """

  def __init__(self, multiply_by_parameter_scale=True, learning_rate=None,
               decay_rate=None, beta1=0.0, clipping_threshold=1.0, factored=True,
               epsilon1=1e-30, epsilon2=1e-3, min_dim_size_to_factor=128,
               stacked_dim_names=None, exclude_from_parameter_scale=None,
               shard_optimizer_state=False):
    self._multiply_by_parameter_scale = multiply_by_parameter_scale
    if learning_rate is None:
      learning_rate = _default_learning_rate(multiply_by_parameter_scale)
    if decay_rate is None:
      decay_rate = adafactor_decay_rate_pow(0.8)
    for what, value in (("learning_rate", learning_rate), ("decay_rate", decay_rate),
                        ("beta1", beta1)):
      lowering_time.check_rate(value, "AdafactorOptimizer.%s" % what)
    if clipping_threshold is not None and not clipping_threshold > 0:
      raise MtfError("AdafactorOptimizer.clipping_threshold must be positive or None, "
                     "got %r" % (clipping_threshold,))
    self._learning_rate = learning_rate
    self._decay_rate = decay_rate
    self._beta1 = beta1
    self._clipping_threshold = clipping_threshold
    self._factored = factored
    self._epsilon1 = epsilon1
    self._epsilon2 = epsilon2
    self._min_dim_size_to_factor = min_dim_size_to_factor
    self._stacked_dim_names = list(stacked_dim_names or [])
    self._exclude_from_parameter_scale = list(exclude_from_parameter_scale or [])
    self.shard_optimizer_state = sharded_state.check_flag(
        shard_optimizer_state, type(self).__name__)

  @property
  def learning_rate(self):
    """The learning rate (a number, tensor, variable or callable)."""
    return self._learning_rate

  @property
  def decay_rate(self):
    """The second-moment decay rate (a number, tensor, variable or callable)."""
    return self._decay_rate

  def _learning_rate_for(self, var):
    """The learning rate applied to var (subclasses may pick one per variable)."""
    del var
    return self._learning_rate

  def _factored_dims(self, shape):
    """The two largest non-stacked dims [d0, d1] if both are big enough, else None."""
    if not self._factored:
      return None
    dims = [d for d in shape.dims if d.name not in self._stacked_dim_names]
    if len(dims) < 2:
      return None
    by_size = sorted(dims, key=lambda d: -d.size)  # stable: ties keep shape order
    if by_size[1].size < self._min_dim_size_to_factor:
      return None
    return by_size[:2]

  def _per_stack_rms(self, x, view):
    """rms of x over all dims but the stacked ones (a scalar if there are none)."""
    keep = Shape([d for d in x.shape.dims
                  if view.base_name(d) in self._stacked_dim_names])
    return ew.sqrt(reduce_ops.reduce_mean(ew.square(x), output_shape=keep))

  def _parameter_scale(self, value, view):
    """max(rms(value), epsilon2): the scale of the variable's current values."""
    return ew.maximum(self._per_stack_rms(value, view), self._epsilon2)

  def _second_moment_step(self, var, grad, decay, view):
    """(slot assignments, grad divided by the sqrt of the new second-moment estimate)."""
    grad_squared = ew.square(grad) + self._epsilon1
    mixing = 1.0 - decay
    factored = self._factored_dims(var.shape)
    if factored is None:
      v = make_slot(var, "_slot_v", view.shape)
      new_v = v * decay + grad_squared * mixing
      return [assign(v, new_v)], grad * ew.rsqrt(new_v)
    d0, d1 = view.dim(factored[0]), view.dim(factored[1])
    vr_shape, vc_shape = view.shape - d0, view.shape - d1
    vr = make_slot(var, "_slot_vr", vr_shape)
    vc = make_slot(var, "_slot_vc", vc_shape)
    new_vr = vr * decay + reduce_ops.reduce_mean(grad_squared, output_shape=vr_shape) * mixing
    new_vc = vc * decay + reduce_ops.reduce_mean(grad_squared, output_shape=vc_shape) * mixing
    r_factor = ew.rsqrt(new_vr / reduce_ops.reduce_mean(new_vr, reduced_dim=d1))
    c_factor = ew.rsqrt(new_vc)
    x = grad * r_factor * c_factor
    return [assign(vr, new_vr), assign(vc, new_vc)], x

  def apply_grad(self, grad, var):
    mesh = var.mesh
    view = sharded_state.ShardView(var, self.shard_optimizer_state)
    grad = ew.to_float(view.to_shard(grad))
    decay = self._scalar(mesh, self._decay_rate, tf.float32, "decay_rate")
    updates, x = self._second_moment_step(var, grad, decay, view)
    if self._clipping_threshold is not None:
      x = x / ew.maximum(self._per_stack_rms(x, view) / self._clipping_threshold, 1.0)
    lr = self._scalar(mesh, self._learning_rate_for(var), tf.float32, "learning_rate")
    if (self._multiply_by_parameter_scale and
        not name_matches(var.name, self._exclude_from_parameter_scale)):
      step = x * (self._parameter_scale(view.to_shard(ew.to_float(var.value)), view) * lr)
    else:
      step = x * lr
    if _is_on(self._beta1):
      m = make_slot(var, "_slot_m", view.shape)
      beta1 = self._scalar(mesh, self._beta1, tf.float32, "beta1")
      step = m * beta1 + step * (1.0 - beta1)
      updates.append(assign(m, step))
    updates.append(assign_sub(var, view.from_shard(step)))
    return updates


def adafactor_optimizer_from_hparams(hparams, lr):
  """An AdafactorOptimizer from T2T-style hparams (optimizer_adafactor_* fields)."""
  decay_type = hparams.optimizer_adafactor_decay_type
  if decay_type == "Adam":
    decay_rate = adafactor_decay_rate_adam(hparams.optimizer_adafactor_beta2)
  elif decay_type == "pow":
    decay_rate = adafactor_decay_rate_pow(hparams.optimizer_adafactor_memory_exponent)
  else:
    raise MtfError("unknown optimizer_adafactor_decay_type %r (expected 'Adam' or 'pow')"
                   % (decay_type,))
  return AdafactorOptimizer(
      multiply_by_parameter_scale=hparams.optimizer_adafactor_multiply_by_parameter_scale,
      learning_rate=lr,
      decay_rate=decay_rate,
      beta1=hparams.optimizer_adafactor_beta1,
      clipping_threshold=hparams.optimizer_adafactor_clipping_threshold,
      factored=hparams.optimizer_adafactor_factored)
