"""A toy model driven by the original's optimizers and mtf.utils helpers.

An autoencoder-like stack of dense layers learns to reproduce its input. As in the
original's TPU toy model, the mesh has a `BalancedVariablePlacer`, the model is built
inside `mtf.utils.outside_all_rewrites()`, and the loss summary goes through
`mtf.utils.create_host_call`, whose function the tf.function step runs.

    python -m models.examples.toy_model --mesh_shape="b1:2;b2:2" \
        --layout="batch:b1;hidden:b2" --optimizer=Adafactor --train_steps=20
"""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from models.examples import cpu_devices, start_training

DEFAULTS = dict(batch_size=8, io_size=8, hidden_size=16, num_hidden_layers=2,
                optimizer="SGD", learning_rate=0.1, model_dir=None)


def toy_model(features, mesh, params):
  """(output, loss): dense layers io -> hidden -> io; the squared reconstruction error."""
  batch_dim = mtf.Dimension("batch", params["batch_size"])
  io_dim = mtf.Dimension("io", params["io_size"])
  hidden_dim = mtf.Dimension("hidden", params["hidden_size"])
  x = mtf.import_tf_tensor(mesh, features, mtf.Shape([batch_dim, io_dim]))
  h = x
  for layer in range(params["num_hidden_layers"]):
    if layer:  # the previous layer's output dim becomes this layer's input dim
      h = mtf.rename_dimension(h, "hidden", "hidden_in")
    h = mtf.layers.dense(h, hidden_dim, reduced_dims=h.shape.dims[-1:],
                         activation=mtf.relu, name="layer_%d" % layer)
  y = mtf.layers.dense(h, io_dim, reduced_dims=h.shape.dims[-1:], name="output")
  loss = mtf.reduce_mean(mtf.square(y - x))
  return y, loss


def _optimizer(params):
  if params["optimizer"] == "Adafactor":
    return mtf.optimize.AdafactorOptimizer(learning_rate=params["learning_rate"])
  return mtf.optimize.SgdOptimizer(params["learning_rate"])


def model_fn(features, labels, mode, params):
  """Builds everything per call; returns the TF loss (after the update when training)."""
  del labels
  graph = mtf.Graph()
  var_placer = mtf.utils.BalancedVariablePlacer(params["devices"])
  mesh = mtf.Mesh(graph, "my_mesh", var_placer)
  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      params["mesh_shape"], params["layout"], params["devices"])
  with mtf.utils.outside_all_rewrites():
    _, loss = toy_model(features, mesh, params)
  update_ops = []
  if mode == "train":
    var_grads = mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
    update_ops = _optimizer(params).apply_grads(var_grads, graph.trainable_variables)
  summary = mtf.scalar_summary("loss", loss)
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  tf_loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
  lowering.lowered_operation(summary)
  deps = [lowering.lowered_operation(op) for op in update_ops]
  with mtf.utils.outside_all_rewrites():
    # Reads the global step before this step increments it: the loss is logged at the
    # step that computed it.
    host_call = (mtf.utils.create_host_call(params["model_dir"])
                 if params["model_dir"] else None)
    mtf.utils.remove_summaries()
  if mode == "train":
    deps.append(mtf.optimize.get_global_step().assign_add(1))
  with tf.control_dependencies([d for d in deps if d is not None]):
    tf_loss = tf.identity(tf_loss)
  if host_call is not None:
    host_call_fn, host_tensors = host_call
    with tf.control_dependencies([tf_loss]):
      host_call_fn(*host_tensors)
  return tf_loss


def synthetic_inputs(num_examples, params, seed=0):
  """Inputs on a low-dimensional subspace, so a narrow hidden layer can reproduce them."""
  rng = np.random.RandomState(seed)
  basis = rng.normal(size=[2, params["io_size"]])
  return (rng.normal(size=[num_examples, 2]) @ basis).astype(np.float32) * 0.5


def train(mesh_shape, layout, devices, train_steps, seed=0, **overrides):
  """The Estimator's train loop as a tf.function loop; returns the loss of each step."""
  params = start_training(DEFAULTS, overrides, mesh_shape, layout, devices, seed)
  inputs = synthetic_inputs(params["batch_size"] * train_steps, params, seed)
  step = tf.function(lambda x: model_fn(x, None, "train", params))
  b = params["batch_size"]
  return [float(step(tf.constant(inputs[i * b:(i + 1) * b]))) for i in range(train_steps)]


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  losses = train(f.mesh_shape, f.layout, cpu_devices(f.mesh_shape), f.train_steps,
                 optimizer=f.optimizer, learning_rate=f.learning_rate,
                 model_dir=f.model_dir)
  for i, loss in enumerate(losses):
    print("step %d loss %.5f" % (i, loss))


if __name__ == "__main__":
  from absl import app, flags as absl_flags  # pylint: disable=g-import-not-at-top,g-multiple-import
  absl_flags.DEFINE_string("mesh_shape", "b1:2;b2:2", "mesh shape")
  absl_flags.DEFINE_string("layout", "batch:b1;hidden:b2", "layout rules")
  absl_flags.DEFINE_string("optimizer", "SGD", "SGD or Adafactor")
  absl_flags.DEFINE_float("learning_rate", 0.1, "learning rate")
  absl_flags.DEFINE_integer("train_steps", 20, "training steps")
  absl_flags.DEFINE_string("model_dir", None, "where the loss summaries go")
  app.run(main)
