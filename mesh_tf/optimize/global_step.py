"""The training step counter that learning-rate and decay schedules read.

TF 2 has no global-step collection, so this module keeps one int64 `tf.Variable` named
"global_step" (the original trainer's checkpoint key), created lazily under
`tf.init_scope()` (the first call may come from a `tf.function` trace). A trainer may hand
over its own counter with `set_global_step(var)`. As in the original, the optimizers never
increment it: the trainer does, e.g. `mtf.optimize.get_global_step().assign_add(1)`.
"""
import tensorflow as tf

from mesh_tf.errors import MtfError

_state = {"step": None}


def get_global_step():
  """The global step tf.Variable (int64, scalar), created on first use."""
  if _state["step"] is None:
    with tf.init_scope():
      _state["step"] = tf.Variable(0, dtype=tf.int64, trainable=False,
                                   name="global_step")
  return _state["step"]


def set_global_step(variable):
  """Makes `variable` (a scalar integer tf.Variable; None forgets it) the global step;
  returns the previous one."""
  if variable is not None:
    if not isinstance(variable, tf.Variable):
      raise MtfError("set_global_step needs a tf.Variable, got %r" % (variable,))
    if variable.shape.rank != 0 or not variable.dtype.is_integer:
      raise MtfError("global step %r must be an integer scalar, got shape %s dtype %s"
                     % (variable.name, variable.shape, variable.dtype.name))
  previous = _state["step"]
  _state["step"] = variable
  return previous


def step_num():
  """The current global step as a float32 tf.Tensor (read when called)."""
  return tf.cast(get_global_step(), tf.float32)
