"""mesh_tf's overhead on one device: the tiny Transformer LM train step through mesh_tf
versus the same model written directly in plain TF 2 (same sizes, weights and SGD
update), both in tf.function, with and without XLA, timed alternately in one run.

  python -m benchmarks.overhead [--steps 20 --repeats 7]
"""
from absl import app
from absl import flags

from benchmarks import common

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 20, "Train steps per timed block.")
flags.DEFINE_integer("repeats", 7, "Timed blocks per variant (the median is reported).")
flags.DEFINE_string("size", "small", "Model size: tiny (for smoke tests) or small.")



def main(_):
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.tiny_lm import config, mtf_model, tf_model  # pylint: disable=g-import-not-at-top
  c = config.TinyLmConfig(**common.LM_SIZES[FLAGS.size])
  batch = config.synthetic_batch(c)
  inputs, targets = batch[:, :-1], batch[:, 1:]
  fns = {}
  for xla in (False, True):
    tag = "xla" if xla else "no-xla"
    mtf_step = mtf_model.TinyLmModel(c).make_train_step(
        mtf.PlacementMeshImpl("", ""), jit_compile=xla)
    tf_step = tf_model.TfTinyLm(c).make_train_step(jit_compile=xla)
    fns["plain TF, " + tag] = lambda s=tf_step: s(inputs, targets)
    fns["mesh_tf, " + tag] = lambda s=mtf_step: s(inputs, targets)
  times = common.time_alternating(fns, FLAGS.steps, FLAGS.repeats)
  print(common.machine_line())
  print("tiny LM %s; %d steps x %d repeats, median per step" % (
      dict(c._asdict()), FLAGS.steps, FLAGS.repeats))
  rows = [["variant", "ms/step", "ratio to plain TF"]]
  for tag in ("no-xla", "xla"):
    base = times["plain TF, " + tag]
    for who in ("plain TF", "mesh_tf"):
      t = times["%s, %s" % (who, tag)]
      rows.append(["%s, %s" % (who, tag), "%.2f" % (1e3 * t), "%.3f" % (t / base)])
  common.print_table(rows)


if __name__ == "__main__":
  app.run(main)
