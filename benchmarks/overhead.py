"""mesh_tf's overhead on one device: a train step of the issue-5 Transformer LM
(models.transformer's Unitransformer, built from gin_configs/models/lm_cpu_small.gin)
through mesh_tf on `PlacementMeshImpl("", "", [""])`, against the same model written
directly in plain TF 2 (benchmarks/tf_transformer.py) starting from the same weights
and applying the same optimizer; both in tf.function, with and without XLA
(jit_compile), timed in alternating rounds in one run.

  python -m benchmarks.overhead [--size small --optimizer adafactor --steps 20 --repeats 7]
"""
from absl import app
from absl import flags
import numpy as np

from benchmarks import common  # sets TF's log level before TF is imported
import tensorflow as tf  # pylint: disable=g-bad-import-order

FLAGS = flags.FLAGS
common.define_flag(flags.DEFINE_integer, "steps", 20, "Train steps per timed block.")
common.define_flag(flags.DEFINE_integer, "repeats", 7,
                   "Timed blocks per variant (the median is reported).")
common.define_flag(flags.DEFINE_enum, "size", "small", list(common.TRANSFORMER_SIZES),
                   "Model size (see benchmarks.common.TRANSFORMER_SIZES); tiny is for "
                   "smoke tests.")
common.define_flag(flags.DEFINE_enum, "optimizer", "adafactor", ["adafactor", "sgd"],
                   "The update rule, the same on both sides.")

# Constant rates: both sides then do the same work every step (the trainer's default
# rates follow the global step, which only adds a few scalar ops).
LEARNING_RATE = 0.01
ADAFACTOR_DECAY_RATE = 0.99
GIN_MODEL_FILE = "models/lm_cpu_small.gin"


def size_bindings(size):
  """gin bindings giving the model the sizes of common.TRANSFORMER_SIZES[size]."""
  s = common.TRANSFORMER_SIZES[size]
  return ["num_layers = %d" % s["num_layers"], "d_model = %d" % s["d_model"],
          "d_ff = %d" % s["d_ff"], "num_heads = %d" % s["num_heads"],
          "d_kv = %d" % s["d_kv"], "dropout_rate = 0.0",
          "Unitransformer.max_length = %d" % s["length"]]


def make_optimizers(name, min_dim_size_to_factor=128):
  """(mtf optimizer, plain-TF updater) applying the same update rule."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from benchmarks import tf_transformer  # pylint: disable=g-import-not-at-top
  if name == "sgd":
    return (mtf.optimize.SgdOptimizer(LEARNING_RATE),
            tf_transformer.SgdUpdater(LEARNING_RATE))
  return (mtf.optimize.AdafactorOptimizer(
      learning_rate=LEARNING_RATE, decay_rate=ADAFACTOR_DECAY_RATE,
      min_dim_size_to_factor=min_dim_size_to_factor),
          tf_transformer.AdafactorUpdater(
              LEARNING_RATE, ADAFACTOR_DECAY_RATE,
              min_dim_size_to_factor=min_dim_size_to_factor))


def build_mtf_lm(size, optimizer):
  """The train-mode ModelGraph of the gin-configured Unitransformer LM at this size."""
  import gin  # pylint: disable=g-import-not-at-top
  from models.transformer import model_graph, utils  # pylint: disable=g-import-not-at-top
  from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
  from models.transformer.context import ModeKeys  # pylint: disable=g-import-not-at-top
  s = common.TRANSFORMER_SIZES[size]
  gin.clear_config()
  try:
    gin_setup.parse_gin([GIN_MODEL_FILE], size_bindings(size))
    model = utils.build_model(model_type="lm", input_vocab_size=s["vocab"],
                              output_vocab_size=s["vocab"])
    return model_graph.ModelGraph(model, s["batch"], s["length"], ["targets"],
                                  ModeKeys.TRAIN, utils.get_variable_dtype(), optimizer)
  finally:
    gin.clear_config()


def trainable_values(graph, lowering):
  """{mtf name: numpy value} of the graph's trainable variables under lowering."""
  return {v.name: lowering.export_to_tf_tensor(v.outputs[0]).numpy()
          for v in graph.graph.trainable_variables}


def synthetic_targets(size, seed=0):
  """int32 [batch, length] token ids in [1, vocab), the last 1/8 of each row padding."""
  s = common.TRANSFORMER_SIZES[size]
  targets = np.random.RandomState(seed).randint(1, s["vocab"],
                                                size=(s["batch"], s["length"]))
  targets[:, s["length"] - s["length"] // 8:] = 0
  return targets.astype(np.int32)


class StepPair:
  """An mtf train step and a plain-TF one over the same initial weights.

  Attributes:
    mtf_step, tf_step: fn(targets) -> the loss before one update.
    graph: the mtf ModelGraph; mesh_impl: where its variables live.
    plain: the TfTransformerLm; updater: its update rule (holding its slots).
  """

  def __init__(self, size, optimizer_name, jit_compile=False, min_dim_size_to_factor=128):
    import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
    from benchmarks import tf_transformer  # pylint: disable=g-import-not-at-top
    from models import train_steps  # pylint: disable=g-import-not-at-top
    mtf_optimizer, self.updater = make_optimizers(optimizer_name, min_dim_size_to_factor)
    self.graph = graph = build_mtf_lm(size, mtf_optimizer)
    self.mesh_impl = mesh_impl = mtf.PlacementMeshImpl("", "", [""])
    weights = trainable_values(graph, graph.lowering(mesh_impl))
    self.plain = tf_transformer.TfTransformerLm(
        weights, common.TRANSFORMER_SIZES[size]["num_heads"], z_loss=graph.model.z_loss)
    self.tf_step = self.plain.make_train_step(self.updater, jit_compile=jit_compile)

    @tf.function(jit_compile=jit_compile)
    def mtf_step(targets):
      return train_steps.lower_train_step(
          graph.lowering(mesh_impl, {"targets": targets}), graph.loss, graph.update_ops)
    self.mtf_step = mtf_step


def traced_op_count(step, *args):
  """TF ops in the traced graph of a tf.function, nested function bodies included."""
  graph_def = step.get_concrete_function(*args).graph.as_graph_def()
  return len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)


def main(_):
  targets = tf.constant(synthetic_targets(FLAGS.size))
  fns, pairs = {}, {}
  for xla in (False, True):
    tag = "xla" if xla else "no-xla"
    pair = StepPair(FLAGS.size, FLAGS.optimizer, xla)
    pairs[tag] = pair
    fns["plain TF, " + tag] = lambda s=pair.tf_step: s(targets)
    fns["mesh_tf, " + tag] = lambda s=pair.mtf_step: s(targets)
  times = common.time_alternating(fns, FLAGS.steps, FLAGS.repeats)
  print(common.machine_line())
  print("Unitransformer LM (%s + %s) %s, %s, one device; %d steps x %d repeats, median "
        "per step" % (GIN_MODEL_FILE, FLAGS.size, common.TRANSFORMER_SIZES[FLAGS.size],
                      FLAGS.optimizer, FLAGS.steps, FLAGS.repeats))
  rows = [["variant", "ms/step", "ratio to plain TF", "TF ops"]]
  for tag in ("no-xla", "xla"):
    base = times["plain TF, " + tag]
    pair = pairs[tag]
    for who, step in (("plain TF", pair.tf_step), ("mesh_tf", pair.mtf_step)):
      t = times["%s, %s" % (who, tag)]
      rows.append(["%s, %s" % (who, tag), "%.2f" % (1e3 * t), "%.3f" % (t / base),
                   "%d" % traced_op_count(step, targets)])
  common.print_table(rows)
  # Both sides took the same number of steps from the same weights on the same batch.
  for tag, pair in pairs.items():
    print("loss after %d steps, %s: mesh_tf %.6f, plain TF %.6f" % (
        1 + FLAGS.steps * FLAGS.repeats, tag, float(pair.mtf_step(targets)),
        float(pair.tf_step(targets))))


if __name__ == "__main__":
  app.run(main)
