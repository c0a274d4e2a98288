"""Rematerialization and bfloat16 activations: measured memory and step time of a train
step, each as a ratio to its baseline measured in the same run.

remat: an 8-block LM (attention + ReLU feed-forward blocks, toy widths and long
sequences, so activations dominate) with and without LayerStack(recompute_grads=True).
bf16: the README LM (gin_configs/models/lm_cpu_small.gin, readme_lm.gin's 16 x 64 batch,
byte vocabulary) with float32 activations, bfloat16 activations over float32 variables
(gin_configs/bf16.gin), and bfloat16 slices too, on the README's batch:2,model:4 mesh.

Both on placement, SIMD emulation and GSPMD (XLA), SGD steps under tf.function. Memory is
the CPU allocator's (TF_CPU_ALLOCATOR_USE_BFC=true, set here before TF starts; one
allocator serves all virtual devices): "activations" is the step's peak less what was
resident before it and less the weights' bytes (a bound on the gradients).

  python -m benchmarks.remat_bf16 [--parts remat,bf16] [--size small] [--steps 5]
      [--bf16_model 4]
"""
import os

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from benchmarks import common  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=wrong-import-position,g-bad-import-order

FLAGS = flags.FLAGS
common.define_flag(flags.DEFINE_list, "parts", ["remat", "bf16"],
                   "Which comparisons to run.")
common.define_flag(flags.DEFINE_list, "backends", ["placement", "simd", "gspmd"],
                   "Backends to run on.")
common.define_flag(flags.DEFINE_enum, "size", "small",
                   ["tiny", "small"], "tiny is for smoke tests.")
common.define_flag(flags.DEFINE_integer, "steps", 5, "Train steps per timed block.")
common.define_flag(flags.DEFINE_integer, "repeats", 3,
                   "Timed blocks per variant (the median is reported).")
common.define_flag(flags.DEFINE_integer, "bf16_model", 4,
                   "The bf16 mesh's model dim: batch:2;model:N (2 for smoke tests).")

MIB = 2.0 ** 20
REMAT_SIZES = {
    "tiny": dict(num_blocks=2, batch=2, length=16, d_model=8, heads=2, d_kv=4, d_ff=16,
                 vocab=16),
    "small": dict(num_blocks=8, batch=8, length=128, d_model=32, heads=4, d_kv=8,
                  d_ff=128, vocab=64),
}
README_SIZES = {
    "tiny": dict(num_blocks=1, batch=4, length=8, d_model=8, heads=4, d_kv=2, d_ff=16,
                 vocab=16),
    "small": dict(num_blocks=2, batch=16, length=64, d_model=64, heads=4, d_kv=16,
                  d_ff=256, vocab=259),
}
REMAT_MESH = {"placement": ("", ""), "simd": ("b:2", "batch:b"), "gspmd": ("b:2", "batch:b")}
README_MESH = ("batch:2;model:4", "batch:batch;d_ff:model;heads:model;vocab:model")
DTYPES = {
    "float32": (tf.float32, tf.float32, tf.float32),
    "bf16 activations": (tf.float32, tf.float32, tf.bfloat16),
    "bf16 act+slices": (tf.float32, tf.bfloat16, tf.bfloat16),
}


def build_lm(sizes, variable_dtype, recompute_grads=False):
  """The ModelGraph (SGD training step) of a Unitransformer LM of the given sizes."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from models.transformer import model_graph, transformer, transformer_layers
  from models.transformer.context import ModeKeys  # pylint: disable=g-import-not-at-top
  layers = []
  for b in range(sizes["num_blocks"]):
    attention = transformer_layers.SelfAttention(num_heads=sizes["heads"],
                                                 key_value_size=sizes["d_kv"])
    ffn = transformer_layers.DenseReluDense(hidden_size=sizes["d_ff"])
    attention.set_name("block_%03d/layer_000" % b)
    ffn.set_name("block_%03d/layer_001" % b)
    layers += [attention, ffn]
  model = transformer.Unitransformer(
      layer_stack=transformer.LayerStack(layers, recompute_grads=recompute_grads),
      d_model=sizes["d_model"], input_vocab_size=sizes["vocab"],
      output_vocab_size=sizes["vocab"], autoregressive=True, max_length=sizes["length"])
  return model_graph.ModelGraph(model, sizes["batch"], sizes["length"], ["targets"],
                                ModeKeys.TRAIN, mtf.VariableDType(*variable_dtype),
                                optimizer=mtf.optimize.SgdOptimizer(0.01))


def _in_use():
  return tf.config.experimental.get_memory_info("CPU:0")["current"]


def prepare(graph, backend, mesh_shape, layout, sizes):
  """(step fn of no arguments, weight bytes): variables created, the step traced."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models import train_steps  # pylint: disable=g-import-not-at-top
  n = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.make_mesh_impl(backend, mesh_shape, layout,
                            ["/cpu:%d" % i for i in range(n)] if n > 1 else [""])
  before = _in_use()
  tf.random.set_seed(0)
  graph.lowering(impl)
  weight_bytes = _in_use() - before
  targets = tf.constant(np.random.RandomState(0).randint(
      1, sizes["vocab"], size=(sizes["batch"], sizes["length"])).astype(np.int32))

  @tf.function(jit_compile=impl.needs_xla)
  def step(t):
    return train_steps.lower_train_step(graph.lowering(impl, {"targets": t}), graph.loss,
                                        graph.update_ops)
  return (lambda: step(targets)), weight_bytes


def measure_memory(step, weight_bytes):
  """(peak bytes of one step, its activation part) after a warm-up step."""
  step().numpy()
  tf.config.experimental.reset_memory_stats("CPU:0")
  resident = _in_use()
  step().numpy()
  peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  return peak, peak - resident - weight_bytes


def run_remat(backends):
  """Rows of the rematerialization comparison."""
  sizes = REMAT_SIZES[FLAGS.size]
  rows = [["backend", "act MiB", "act MiB remat", "act ratio", "step ms", "step ms remat",
           "time ratio", "loss", "loss remat"]]
  for backend in backends:
    mesh_shape, layout = REMAT_MESH[backend]
    steps, memory, losses = {}, {}, {}
    for remat in (False, True):
      graph = build_lm(sizes, DTYPES["float32"], recompute_grads=remat)
      steps[remat], weight_bytes = prepare(graph, backend, mesh_shape, layout, sizes)
      losses[remat] = float(steps[remat]())  # the first step's loss, same weights
      memory[remat] = measure_memory(steps[remat], weight_bytes)[1]
    times = common.time_alternating(steps, FLAGS.steps, FLAGS.repeats)
    rows.append([backend, "%.1f" % (memory[False] / MIB), "%.1f" % (memory[True] / MIB),
                 "%.3f" % (memory[True] / memory[False]), "%.1f" % (times[False] * 1e3),
                 "%.1f" % (times[True] * 1e3), "%.2f" % (times[True] / times[False]),
                 "%.6f" % losses[False], "%.6f" % losses[True]])
  return rows


def _bf16_mesh():
  """README_MESH (at the default --bf16_model) or the same with a smaller model dim."""
  return "batch:2;model:%d" % FLAGS.bf16_model, README_MESH[1]


def run_bf16(backends):
  """Rows of the bfloat16 comparison (ratios to float32 on the same backend)."""
  sizes = README_SIZES[FLAGS.size]
  rows = [["backend", "dtypes", "peak MiB", "act MiB", "peak ratio", "step ms",
           "time ratio", "first loss"]]
  for backend in backends:
    steps, memory, losses = {}, {}, {}
    for name, dtype in DTYPES.items():
      graph = build_lm(sizes, dtype)
      steps[name], weight_bytes = prepare(graph, backend, *_bf16_mesh(), sizes)
      losses[name] = float(steps[name]())
      memory[name] = measure_memory(steps[name], weight_bytes)
    times = common.time_alternating(steps, FLAGS.steps, FLAGS.repeats)
    for name in DTYPES:
      rows.append([backend, name, "%.1f" % (memory[name][0] / MIB),
                   "%.1f" % (memory[name][1] / MIB),
                   "%.3f" % (memory[name][0] / memory["float32"][0]),
                   "%.1f" % (times[name] * 1e3),
                   "%.2f" % (times[name] / times["float32"]), "%.4f" % losses[name]])
  return rows


def main(_):
  common.set_up_virtual_cpus(8)
  print(common.machine_line())
  if "remat" in FLAGS.parts:
    print("\nrecompute_grads: %s, steps %d x %d" % (REMAT_SIZES[FLAGS.size], FLAGS.steps,
                                                      FLAGS.repeats))
    common.print_table(run_remat(FLAGS.backends))
  if "bf16" in FLAGS.parts:
    print("\nbfloat16 on %s: %s" % (_bf16_mesh()[0], README_SIZES[FLAGS.size]))
    common.print_table(run_bf16(FLAGS.backends))


if __name__ == "__main__":
  app.run(main)
