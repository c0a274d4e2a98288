"""Noise and gradient regularizers: dropout, jitter, annealed dropout, gradient clipping
(and summaries of the activation gradients that clipping acts on)."""
import gin
import tensorflow as tf

from mesh_tf.errors import MtfError, ShapeError
from mesh_tf.graph import Operation, Tensor
from mesh_tf.ops import creation
from mesh_tf.ops import elementwise as ew
from mesh_tf.ops import random as random_ops
from mesh_tf.ops import reduce as reduce_ops
from mesh_tf.ops.summary import scalar_summary


def dropout(x, is_training=True, keep_prob=None, rate=None, noise_shape=None,
            name=None):
  """mtf.dropout, offered under mtf.layers too."""
  return random_ops.dropout(x, is_training, keep_prob=keep_prob, rate=rate,
                            noise_shape=noise_shape, name=name)


def multiplicative_jitter(x, epsilon=1e-2):
  """x times noise drawn uniformly from [1 - epsilon, 1 + epsilon)."""
  if epsilon == 0:
    return x
  noise = random_ops.random_uniform(x.mesh, x.shape, minval=1.0 - epsilon,
                                    maxval=1.0 + epsilon, dtype=x.dtype)
  return x * noise


def _step_tensor(mesh, global_step):
  """The training step as a float32 mtf scalar."""
  if global_step is None:
    global_step = tf.compat.v1.train.get_or_create_global_step()
  if not isinstance(global_step, Tensor):
    # A tf.Variable is read when the graph is lowered, so each step sees its value.
    global_step = creation.import_tf_tensor(mesh, global_step, [], name="global_step")
  return ew.cast(global_step, tf.float32)


def annealed_dropout(x, is_training, start_step, end_step, init_rate=None,
                     noise_shape=None, name=None, final_rate=0.0, global_step=None):
  """Dropout whose rate moves linearly from init_rate (until start_step) to final_rate
  (from end_step on); no dropout if init_rate is None or not is_training.

  noise_shape: dims the mask varies over (default x.shape); name: unused, as in the
  original; global_step: an mtf scalar, a tf.Variable (read at each lowering), or None
  for tf.compat.v1.train.get_or_create_global_step().
  """
  del name
  if not is_training or init_rate is None:
    return x
  if end_step <= start_step:
    raise MtfError("annealed_dropout of %s: end_step %d must be after start_step %d"
                   % (x.name, end_step, start_step), tensor=x.name)
  step = _step_tensor(x.mesh, global_step)
  progress = ew.minimum(ew.maximum((step - float(start_step)) /
                                   float(end_step - start_step), 0.0), 1.0)
  rate = ew.cast(progress * (final_rate - init_rate) + init_rate, x.dtype)
  noise_shape = x.shape if noise_shape is None else noise_shape
  uniform = random_ops.random_uniform(x.mesh, noise_shape, dtype=x.dtype)
  keep = ew.cast(ew.greater_equal(uniform, rate), x.dtype)
  return x * keep / (1.0 - rate)


class _IdentityOperation(Operation):
  """Identity forward; subclasses give the gradient."""

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    lowering.set_tensor_lowering(
        self.outputs[0], impl.slicewise(tf.identity, lowering.tensors[self.inputs[0]]))


class ClipActivationGradientOperation(_IdentityOperation):
  """Identity forward; the backward gradient is rescaled to RMS at most clip_rms_norm."""

  def __init__(self, x, clip_rms_norm, name=None):
    super().__init__([x], name=name or "clip_activation_gradient")
    self._clip = float(clip_rms_norm)
    self._add_output(x.shape, x.dtype)

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    mean_square = reduce_ops.reduce_mean(ew.square(dy), output_shape=[])
    # rsqrt(0) is inf, so an all-zero gradient gets factor 1 (and stays zero).
    factor = ew.minimum(ew.rsqrt(mean_square) * self._clip, 1.0)
    return [dy * factor]


@gin.configurable
def clip_activation_gradient(x, clip_rms_norm=None):
  """x unchanged; its gradient is scaled down when its RMS (over all of x) exceeds
  clip_rms_norm. None disables the clipping."""
  if clip_rms_norm is None:
    return x
  if clip_rms_norm <= 0:
    raise ShapeError("clip_activation_gradient of %s: clip_rms_norm must be positive, "
                     "not %r" % (x.name, clip_rms_norm), tensor=x.name)
  return ClipActivationGradientOperation(x, clip_rms_norm).outputs[0]


class ActivationGradientSummaryOperation(_IdentityOperation):
  """Identity forward; building its gradient adds scalar summaries of that gradient."""

  def __init__(self, x, tag, batch_dims, name=None):
    super().__init__([x], name=name or "summary_for_clip_activation_gradient")
    self._tag = tag
    self._batch_dims = list(batch_dims)
    self._add_output(x.shape, x.dtype)

  def gradient(self, grad_ys):
    dy = grad_ys[0]
    square = ew.square(ew.cast(dy, tf.float32))
    rms = ew.sqrt(reduce_ops.reduce_mean(square, output_shape=[]))
    per_example = ew.sqrt(reduce_ops.reduce_mean(square, output_shape=self._batch_dims))
    scalar_summary(self._tag + "/grad_rms", rms)
    scalar_summary(self._tag + "/grad_rms_max_example",
                   reduce_ops.reduce_max(per_example, output_shape=[]))
    return [dy]


def summary_for_clip_activation_gradient(t, name=None, batch_dims=None):
  """t unchanged; in the backward pass, summaries of its gradient dt to tune clipping:
  "<name>/grad_rms", the RMS of dt (what clip_activation_gradient compares with
  clip_rms_norm), and "<name>/grad_rms_max_example", the largest RMS over the non-batch
  dims among the examples indexed by batch_dims (dims or names; default t's first dim).
  name defaults to "clip_activation_gradient".
  """
  name = name or "clip_activation_gradient"
  if batch_dims is None:
    batch_dims = t.shape.dims[:1]
  dims = []
  for d in batch_dims:
    d_name = d if isinstance(d, str) else d.name
    if d_name not in t.shape.dimension_names:
      raise ShapeError("summary_for_clip_activation_gradient %r: batch dim %r is not a "
                       "dim of %s %s" % (name, d_name, t.name, t.shape),
                       tensor=t.name, dim=d_name)
    dims.append(t.shape.get_dim_by_name(d_name))
  return ActivationGradientSummaryOperation(t, name, dims).outputs[0]
