"""Train and eval steps shared by the models, each one tf.function over an mtf graph
built once. A model provides `lowering(mesh_impl, *batch)` (with no batch it only
creates the variables), `loss` and `update_ops`."""
import tensorflow as tf

from mesh_tf.lowering.train_step import lower_train_step  # re-exported for the models


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
