"""An MNIST-style convolutional classifier written as a mesh_tensorflow user would, on
synthetic digits (a bright quadrant per class).

The image is cut into row and column blocks, and `mtf.layers.conv2d_with_blocks`
convolves across block borders, so the layout "row_blocks:b1;col_blocks:b2" spreads one
image over a b1 x b2 mesh (spatial partitioning).

    python -m models.examples.mnist --mesh_shape="b1:2;b2:2" \
        --layout="row_blocks:b1;col_blocks:b2" --train_steps=20
"""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from models.examples import cpu_devices, start_training

DEFAULTS = dict(batch_size=8, image_size=8, row_blocks=2, col_blocks=2, filters1=8,
                filters2=8, hidden_size=16, num_classes=4,
                # Adafactor's default rate warms up too slowly for a few dozen steps.
                learning_rate=0.05)


def mnist_model(image, labels, mesh, params):
  """Logits and mean cross-entropy of a small conv net; image is [batch, h, w] float32."""
  batch_dim = mtf.Dimension("batch", params["batch_size"])
  row_blocks_dim = mtf.Dimension("row_blocks", params["row_blocks"])
  col_blocks_dim = mtf.Dimension("col_blocks", params["col_blocks"])
  rows_dim = mtf.Dimension("rows_size", params["image_size"] // params["row_blocks"])
  cols_dim = mtf.Dimension("cols_size", params["image_size"] // params["col_blocks"])
  classes_dim = mtf.Dimension("classes", params["num_classes"])
  one_channel_dim = mtf.Dimension("one_channel", 1)

  x = mtf.import_tf_tensor(
      mesh, tf.reshape(image, [params["batch_size"], params["row_blocks"],
                               rows_dim.size, params["col_blocks"], cols_dim.size, 1]),
      mtf.Shape([batch_dim, row_blocks_dim, rows_dim, col_blocks_dim, cols_dim,
                 one_channel_dim]))
  x = mtf.transpose(x, [batch_dim, row_blocks_dim, col_blocks_dim, rows_dim, cols_dim,
                        one_channel_dim])

  filters1_dim = mtf.Dimension("filters1", params["filters1"])
  filters2_dim = mtf.Dimension("filters2", params["filters2"])
  f1 = mtf.relu(mtf.layers.conv2d_with_blocks(
      x, filters1_dim, filter_size=[3, 3], strides=[1, 1], padding="SAME",
      h_blocks_dim=row_blocks_dim, w_blocks_dim=col_blocks_dim, name="conv0"))
  f2 = mtf.relu(mtf.layers.conv2d_with_blocks(
      f1, filters2_dim, filter_size=[3, 3], strides=[1, 1], padding="SAME",
      h_blocks_dim=row_blocks_dim, w_blocks_dim=col_blocks_dim, name="conv1"))
  pooled = mtf.reduce_mean(f2, reduced_dim=rows_dim)
  pooled = mtf.reduce_mean(pooled, reduced_dim=cols_dim)

  hidden_dim = mtf.Dimension("hidden", params["hidden_size"])
  h = mtf.layers.dense(pooled, hidden_dim, reduced_dims=pooled.shape.dims[-3:],
                       activation=mtf.relu, name="hidden1")
  logits = mtf.layers.dense(h, classes_dim, name="logits")
  if labels is None:
    return logits, None
  labels = mtf.import_tf_tensor(mesh, tf.reshape(labels, [params["batch_size"]]),
                                mtf.Shape([batch_dim]))
  loss = mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(labels, classes_dim), classes_dim)
  return logits, mtf.reduce_mean(loss)


def model_fn(features, labels, mode, params):
  """Builds graph, mesh, MeshImpl and Lowering; returns the TF loss (after the update in
  "train" mode). Call it inside tf.function: variables are made on the first trace."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      params["mesh_shape"], params["layout"], params["devices"])
  _, loss = mnist_model(features["image"], labels, mesh, params)
  if mode == "train":
    var_grads = mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
    optimizer = mtf.optimize.AdafactorOptimizer(learning_rate=params["learning_rate"])
    update_ops = optimizer.apply_grads(var_grads, graph.trainable_variables)
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  tf_loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
  if mode != "train":
    return tf_loss
  tf_update_ops = [lowering.lowered_operation(op) for op in update_ops]
  tf_update_ops.append(mtf.optimize.get_global_step().assign_add(1))
  with tf.control_dependencies([op for op in tf_update_ops if op is not None]):
    return tf.identity(tf_loss)


def synthetic_digits(num_examples, params, seed=0):
  """Images with one bright quadrant (the class) on noise, and their labels."""
  rng = np.random.RandomState(seed)
  size = params["image_size"]
  labels = rng.randint(0, params["num_classes"], size=num_examples).astype(np.int32)
  images = rng.uniform(0.0, 0.3, size=[num_examples, size, size]).astype(np.float32)
  half = size // 2
  for i, label in enumerate(labels):
    r, c = divmod(int(label) % 4, 2)
    images[i, r * half:(r + 1) * half, c * half:(c + 1) * half] += 0.7
  return images, labels


def train(mesh_shape, layout, devices, train_steps, seed=0, **overrides):
  """The Estimator's train loop as a tf.function loop; returns the loss of each step."""
  params = start_training(DEFAULTS, overrides, mesh_shape, layout, devices, seed)
  images, labels = synthetic_digits(params["batch_size"] * train_steps, params, seed)
  step = tf.function(lambda image, label: model_fn({"image": image}, label, "train",
                                                     params))
  b = params["batch_size"]
  return [float(step(tf.constant(images[i * b:(i + 1) * b]),
                     tf.constant(labels[i * b:(i + 1) * b]))) for i in range(train_steps)]


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  losses = train(f.mesh_shape, f.layout, cpu_devices(f.mesh_shape), f.train_steps)
  for i, loss in enumerate(losses):
    print("step %d loss %.4f" % (i, loss))


if __name__ == "__main__":
  from absl import app, flags as absl_flags  # pylint: disable=g-import-not-at-top,g-multiple-import
  absl_flags.DEFINE_string("mesh_shape", "b1:2;b2:2", "mesh shape")
  absl_flags.DEFINE_string("layout", "row_blocks:b1;col_blocks:b2", "layout rules")
  absl_flags.DEFINE_integer("train_steps", 20, "training steps")
  app.run(main)
