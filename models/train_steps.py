"""Train and eval steps shared by the models: each is one tf.function over an mtf graph
that was built once.

A model provides `lowering(mesh_impl, *batch)` (a Lowering fed with one batch; with no
batch it only creates the variables), `loss` and `update_ops`.
"""
import tensorflow as tf


def lower_train_step(lowering, loss, update_ops, skip_nonfinite=False):
  """Emits the loss and every update op in one Lowering; returns the loss tf.Tensor.

  With skip_nonfinite, the updates run only when the loss is finite (inside a tf.cond),
  so a NaN/Inf step leaves every variable and optimizer slot as it was.
  """
  loss_value = lowering.export_to_tf_tensor(loss)

  def apply_updates():
    for op in update_ops:
      lowering.lowered_operation(op)
    return tf.constant(True)
  if skip_nonfinite:
    tf.cond(tf.math.is_finite(loss_value), apply_updates, lambda: tf.constant(False))
  else:
    apply_updates()
  return loss_value


def make_train_step(model, mesh_impl, jit_compile=False):
  """A tf.function(*batch) running one update and returning the loss before it."""
  model.lowering(mesh_impl)  # creates the variables eagerly, before any trace

  @tf.function(jit_compile=jit_compile)
  def train_step(*batch):
    return lower_train_step(model.lowering(mesh_impl, *batch), model.loss,
                            model.update_ops)
  return train_step


def make_eval_step(model, mesh_impl):
  """A tf.function(*batch) computing the loss without updating."""
  model.lowering(mesh_impl)

  @tf.function
  def eval_step(*batch):
    return model.lowering(mesh_impl, *batch).export_to_tf_tensor(model.loss)
  return eval_step
