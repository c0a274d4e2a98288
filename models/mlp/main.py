"""Trains the README MLP on an emulated mesh.

    python -m models.mlp.main --mesh_shape="rows:2;cols:4" --layout="batch:rows;hidden:cols"
    python -m models.mlp.main --backend=gspmd     # or simd, or placement (the default)
    python -m models.mlp.main --gin_param="make_mesh_impl.backend = 'simd'"
    python -m models.mlp.main --mode=layout_report --layout="batch:rows"

Trains with plain SGD under tf.function, saves a checkpoint, then restores it on a
single device and checks that the eval loss is the same there. --backend overrides
make_mesh_impl's gin binding.
"""
import os
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
flags.DEFINE_string("backend", None, "Lowering: placement | simd | gspmd (default: the "
                    "gin binding of make_mesh_impl.backend, else placement).")
flags.DEFINE_enum("mode", "train", ["train", "layout_report"],
                  "train: train, save, restore. layout_report: print how the layout "
                  "splits each tensor, warnings, and the predicted cost; train nothing.")
flags.DEFINE_multi_string("gin_param", [], "Gin bindings, e.g. "
                          "\"make_mesh_impl.backend = 'gspmd'\".")


def print_layout_report(model, mesh_layout):
  """Prints the layout report and the cost model's per-processor cost of a train step
  under mesh_layout (a MeshLayout)."""
  from mesh_tf import analysis  # pylint: disable=g-import-not-at-top
  print("mesh %s, layout %s" % (mesh_layout.shape.to_string, mesh_layout.layout_rules))
  report = analysis.layout_report(model.graph, mesh_layout)
  print(report)
  if report.conflicts:
    return
  cost = analysis.estimate_cost(model.graph, mesh_layout.shape, mesh_layout.layout_rules,
                                fetches=[model.loss] + model.update_ops)
  print("Predicted per processor and train step: %.3g FLOPs, %d bytes of weights, "
        "%d bytes of activations (upper bound), %d bytes sent"
        % (cost.flops_per_processor, cost.variable_bytes_per_processor,
           cost.activation_bytes_per_processor, cost.comm_bytes_per_processor))
  print(analysis.format_report(cost.comm_records, mesh_layout.shape))


def main(argv):
  del argv
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import gin  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.mlp.model import MlpModel, synthetic_digits  # pylint: disable=g-import-not-at-top

  mesh_layout = mtf.shapes.MeshLayout(FLAGS.mesh_shape, FLAGS.layout)  # converted once
  mesh_size = mesh_layout.size
  devices = mtf.utils.configure_virtual_cpus(mesh_size)
  batch = FLAGS.batch_size
  images, labels = synthetic_digits(batch * FLAGS.train_steps, seed=0)
  eval_images, eval_labels = synthetic_digits(batch, seed=1)

  model = MlpModel(batch_size=batch, hidden_size=FLAGS.hidden_size,
                   learning_rate=FLAGS.learning_rate)
  if FLAGS.mode == "layout_report":
    print_layout_report(model, mesh_layout)
    return
  model_dir = FLAGS.model_dir or tempfile.mkdtemp(prefix="mtf_mlp_")
  gin.parse_config_files_and_bindings([], FLAGS.gin_param)
  backend = {} if FLAGS.backend is None else {"backend": FLAGS.backend}
  mesh_impl = mtf.make_mesh_impl(mesh_shape=mesh_layout.shape, devices=devices,
                                 layout=mesh_layout.layout_rules, **backend)
  print("mesh %s, layout %s, %d devices, %s" % (FLAGS.mesh_shape, FLAGS.layout, mesh_size,
                                                type(mesh_impl).__name__))
  train_step = model.make_train_step(mesh_impl, jit_compile=mesh_impl.needs_xla)
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
            % (step + 1, FLAGS.train_steps, loss, rate, eta), flush=True)

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
