"""Trains the README MLP on an emulated mesh (the main job until the Transformer lands).

    python -m models.mlp.main --mesh_shape="rows:2;cols:4" --layout="batch:rows;hidden:cols"

Trains with plain SGD under tf.function, shows progress, saves a checkpoint, then
restores it on a single device and checks that the eval loss is the same there.
"""
import os
import sys
import tempfile
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("mesh_shape", "rows:2;cols:4", "Mesh shape, e.g. 'rows:2;cols:4'.")
flags.DEFINE_string("layout", "batch:rows;hidden:cols", "Layout rules.")
flags.DEFINE_integer("train_steps", 60, "Number of SGD steps.")
flags.DEFINE_integer("batch_size", 32, "Examples per step (divisible by the batch split).")
flags.DEFINE_integer("hidden_size", 64, "Hidden units (divisible by the hidden split).")
flags.DEFINE_float("learning_rate", 0.1, "SGD learning rate.")
flags.DEFINE_string("model_dir", None, "Where checkpoints go (default: a temp dir).")
flags.DEFINE_integer("log_every", 10, "Print progress every this many steps.")


def configure_virtual_cpus(n):
  """Splits the host CPU into n logical devices; must run before TF initializes."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpus = tf.config.list_physical_devices("CPU")
  tf.config.set_logical_device_configuration(
      cpus[0], [tf.config.LogicalDeviceConfiguration()] * n)
  return ["/cpu:%d" % i for i in range(n)]


def main(argv):
  del argv
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.mlp.model import MlpModel, synthetic_digits  # pylint: disable=g-import-not-at-top

  mesh_size = mtf.convert_to_shape(FLAGS.mesh_shape).size
  devices = configure_virtual_cpus(mesh_size)
  model_dir = FLAGS.model_dir or tempfile.mkdtemp(prefix="mtf_mlp_")
  batch = FLAGS.batch_size
  images, labels = synthetic_digits(batch * FLAGS.train_steps, seed=0)
  eval_images, eval_labels = synthetic_digits(batch, seed=1)

  model = MlpModel(batch_size=batch, hidden_size=FLAGS.hidden_size,
                   learning_rate=FLAGS.learning_rate)
  mesh_impl = mtf.PlacementMeshImpl(FLAGS.mesh_shape, FLAGS.layout, devices)
  print("mesh %s, layout %s, %d devices" % (FLAGS.mesh_shape, FLAGS.layout, mesh_size))
  train_step = model.make_train_step(mesh_impl)
  eval_step = model.make_eval_step(mesh_impl)
  print("eval loss before training: %.4f" % float(eval_step(eval_images, eval_labels)))

  start = time.time()
  for step in range(FLAGS.train_steps):
    s = slice(step * batch, (step + 1) * batch)
    loss = float(train_step(images[s], labels[s]))
    if (step + 1) % FLAGS.log_every == 0 or step == 0:
      elapsed = time.time() - start
      rate = (step + 1) * batch / max(elapsed, 1e-9)
      eta = elapsed / (step + 1) * (FLAGS.train_steps - step - 1)
      print("step %4d/%d  loss %.4f  %7.0f examples/s  ETA %.0fs"
            % (step + 1, FLAGS.train_steps, loss, rate, eta))
      sys.stdout.flush()

  mesh_eval = float(eval_step(eval_images, eval_labels))
  path = mtf.save_checkpoint(os.path.join(model_dir, "model.ckpt"), mesh_impl,
                             global_step=FLAGS.train_steps)
  print("eval loss after training (mesh %s): %.6f; saved %s"
        % (FLAGS.mesh_shape, mesh_eval, path))

  single_impl = mtf.PlacementMeshImpl("", "", [""])
  single_eval_step = model.make_eval_step(single_impl)
  mtf.restore_checkpoint(path, single_impl)
  single_eval = float(single_eval_step(eval_images, eval_labels))
  print("eval loss restored on one device: %.6f (difference %.2e)"
        % (single_eval, abs(single_eval - mesh_eval)))


if __name__ == "__main__":
  app.run(main)
