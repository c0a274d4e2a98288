"""The tiny Transformer LM on 8 virtual CPU devices under single, dp, mp and dp+mp
layouts and each backend: median step time (and its ratio to one device), bytes each
processor sends per step (communication accounting), and memory per processor (the
analytic cost model).

  python -m benchmarks.layouts [--steps 10 --repeats 5] [--devices 8|4]
"""
from absl import app
from absl import flags

from benchmarks import common

FLAGS = flags.FLAGS
common.define_flag(flags.DEFINE_integer, "steps", 10, "Train steps per timed block.")
common.define_flag(flags.DEFINE_integer, "repeats", 5,
                   "Timed blocks per variant (the median is reported).")
common.define_flag(flags.DEFINE_string, "size", "small",
                   "Model size: tiny (for smoke tests) or small.")
common.define_flag(flags.DEFINE_list, "backends", ["placement", "simd", "gspmd"],
                   "Backends to run (names of mtf.make_mesh_impl).")
common.define_flag(flags.DEFINE_enum, "devices", "8", ["8", "4"],
                   "Virtual CPUs the dp, mp and dp+mp meshes span (4 for smoke tests).")


def main(_):
  devices = common.set_up_virtual_cpus(8)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tf import analysis  # pylint: disable=g-import-not-at-top
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  c = config.TinyLmConfig(**dict(common.LM_SIZES[FLAGS.size], heads=8))
  batch = config.synthetic_batch(c)
  inputs, targets = tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])
  fns, info = {}, {}
  for backend in FLAGS.backends:
    for label, mesh_shape, layout in common.mesh_layouts(int(FLAGS.devices)):
      model = mtf_model.TinyLmModel(c)
      n = mtf.convert_to_shape(mesh_shape).size
      impl = mtf.make_mesh_impl(backend, mesh_shape, layout, devices[:n])
      step = model.make_train_step(impl, jit_compile=impl.needs_xla)
      key = "%s %s" % (backend, label)
      fns[key] = lambda s=step: s(inputs, targets)
      cost = analysis.estimate_cost(model.graph, mesh_shape, layout,
                                    fetches=[model.loss] + model.update_ops)
      info[key] = (cost, impl)
  times = common.time_alternating(fns, FLAGS.steps, FLAGS.repeats)
  print(common.machine_line())
  print("tiny LM %s on %s virtual CPU devices; %d steps x %d repeats, median per step"
        % (dict(c._asdict()), FLAGS.devices, FLAGS.steps, FLAGS.repeats))
  rows = [["backend layout", "ms/step", "vs single", "sent B/proc (emitted)",
           "sent B/proc (model)", "weights B/proc", "activations B/proc"]]
  for key, t in times.items():
    base = times[key.split()[0] + " single"]
    cost, impl = info[key]
    measured = analysis.total_bytes_per_processor(impl.comm_log)  # the one trace
    traced = "%.0f" % measured if impl.comm_log or key.endswith("single") else "n/a"
    rows.append([key, "%.1f" % (1e3 * t), "%.2f" % (t / base), traced,
                 "%.0f" % cost.comm_bytes_per_processor,
                 "%d" % cost.variable_bytes_per_processor,
                 "%d" % cost.activation_bytes_per_processor])
  common.print_table(rows)
  print("emitted = bytes of the collectives the backend emitted while tracing the step;"
        " n/a where the backend leaves collectives to XLA (GSPMD).")


if __name__ == "__main__":
  app.run(main)
