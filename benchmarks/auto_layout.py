"""Automatic layout (`mtf.auto_mtf.choose_layout`) per model and device count: search
time, the chosen mesh shape and rules, predicted step time and bytes each device sends
(and, on 8 emulated CPUs, the bytes the placement backend actually sends), against the
best hand-written layout of gin_configs/layouts/ (and, at 512 cores, the paper's 16x32
layout).

  python -m benchmarks.auto_layout [--cases=mlp8,lm8,paper512]

Cases:
- mlp8: the README MLP on 8 CPUs (cpu_host profile).
- lm8: the `make train` Transformer LM (lm_cpu_small.gin, batch 16 x 64) on 8 CPUs.
- tiny512: the 4.9B-parameter LM of benchmarks/memory_report.py (models.tiny_lm: f32
  activations, SGD) on 512 TPU v2 cores.
- paper512: the same sizes as models.transformer's Unitransformer with bfloat16
  activations and Adafactor, as the paper trained, on 512 TPU v2 cores.
Measured bytes need the devices, so only the 8-device cases have them.
"""
import pathlib
import re
import time

from absl import app
from absl import flags

from benchmarks import common

FLAGS = flags.FLAGS
flags.DEFINE_list("cases", ["mlp8", "lm8", "tiny512", "paper512"], "Cases to run.")
flags.DEFINE_integer("max_mesh_dims", 3, "Most mesh dims of a searched mesh shape.")

LAYOUTS_DIR = pathlib.Path(__file__).resolve().parents[1] / "gin_configs" / "layouts"
PAPER_16X32 = ("rows:16;cols:32", "batch:rows;d_ff:cols;heads:cols;vocab:cols")
# memory_report.py's largest configuration: 6 layers, d_model 1024, d_kv 128,
# vocab 32768, batch 512 x length 256, d_ff 262144, 512 heads.
PAPER_SIZES = dict(batch=512, length=256, vocab=32768, d_model=1024, heads=512, d_kv=128,
                   d_ff=262144, num_layers=6)


def hand_written_layouts(num_devices):
  """[(gin file, mesh shape, rules)] of gin_configs/layouts/ for num_devices or 1."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  out = []
  for path in sorted(LAYOUTS_DIR.glob("*.gin")):
    text = path.read_text()
    mesh = re.search(r"utils\.run\.mesh_shape\s*=\s*'([^']*)'", text).group(1)
    rules = re.search(r"utils\.run\.layout_rules\s*=\s*'([^']*)'", text).group(1)
    if mtf.convert_to_shape(mesh).size in (1, num_devices):
      out.append((path.name, mesh, rules))
  return out


def _mlp():
  from models.mlp import model as mlp  # pylint: disable=g-import-not-at-top
  m = mlp.MlpModel(batch_size=32, hidden_size=64)
  images, labels = mlp.synthetic_digits(32)
  return m.graph, m.loss, m.update_ops, m.lowering, (images, labels)


def _make_train_lm():
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import overhead  # pylint: disable=g-import-not-at-top
  g = overhead.build_mtf_lm("small", mtf.optimize.AdafactorOptimizer())

  def make_lowering(impl, t=None):
    return g.lowering(impl, None if t is None else {"targets": t})
  return (g.graph, g.loss, g.update_ops, make_lowering,
          (tf.constant(overhead.synthetic_targets("small")),))


def _tiny_lm_512():
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  c = config.TinyLmConfig(**PAPER_SIZES)
  m = mtf_model.TinyLmModel(c, weights={n: None for n in config.weight_shapes(c)})
  return m.graph, m.loss, m.update_ops, None, None


def _paper_transformer_512():
  """The Unitransformer LM at PAPER_SIZES, bfloat16 activations, Adafactor."""
  import gin  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.transformer import gin_setup, model_graph, utils  # pylint: disable=g-import-not-at-top
  from models.transformer.context import ModeKeys  # pylint: disable=g-import-not-at-top
  s = PAPER_SIZES
  gin.clear_config()
  try:
    gin_setup.parse_gin(["models/lm_cpu_small.gin"], [
        "num_layers = %d" % s["num_layers"], "d_model = %d" % s["d_model"],
        "d_ff = %d" % s["d_ff"], "num_heads = %d" % s["heads"],
        "d_kv = %d" % s["d_kv"], "dropout_rate = 0.0",
        "Unitransformer.max_length = %d" % s["length"],
        "get_variable_dtype.activation_dtype = 'bfloat16'"])
    model = utils.build_model(model_type="lm", input_vocab_size=s["vocab"],
                              output_vocab_size=s["vocab"])
    g = model_graph.ModelGraph(model, s["batch"], s["length"], ["targets"],
                               ModeKeys.TRAIN, utils.get_variable_dtype(),
                               mtf.optimize.AdafactorOptimizer())
  finally:
    gin.clear_config()
  return g.graph, g.loss, g.update_ops, None, None


CASES = {
    "mlp8": ("README MLP", _mlp, 8, "cpu_host"),
    "lm8": ("make-train LM", _make_train_lm, 8, "cpu_host"),
    "tiny512": ("tiny_lm 4.9B f32 SGD", _tiny_lm_512, 512, "tpu_v2"),
    "paper512": ("Transformer 4.9B bf16 Adafactor", _paper_transformer_512, 512,
                 "tpu_v2"),
}


def _measure(mesh_shape, rules, make_lowering, loss, update_ops, feeds):
  """Bytes per device the placement backend sends tracing one train step."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tf import analysis  # pylint: disable=g-import-not-at-top
  from models import train_steps  # pylint: disable=g-import-not-at-top
  n = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.PlacementMeshImpl(mesh_shape, rules, ["/cpu:%d" % i for i in range(n)])
  lowerings = []

  @tf.function
  def step(*args):
    lowering = make_lowering(impl, *args)
    lowerings.append(lowering)
    return train_steps.lower_train_step(lowering, loss, update_ops)
  make_lowering(impl)
  step.get_concrete_function(*feeds)
  return analysis.total_bytes_per_processor(lowerings[-1].comm_records)


def _row(label, c, measured, seconds=None):
  p = c.prediction
  return [label, c.mesh_shape or "[]", c.layout_rules or "(none)",
          "%.3f" % (1e3 * p.step_time), "%.3f" % (1e3 * p.compute_time),
          "%.3f" % (1e3 * p.comm_time), "%.4g" % p.comm_bytes,
          "n/a" if measured is None else "%.4g" % measured,
          "%.3g" % c.peak_memory, "yes" if c.fits else "NO",
          "" if seconds is None else "%.1f" % seconds]


def run_case(key):
  """Prints the table of one case; returns the report."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tf import auto_mtf  # pylint: disable=g-import-not-at-top
  title, build, devices, profile = CASES[key]
  start = time.perf_counter()
  graph, loss, update_ops, make_lowering, feeds = build()
  build_s = time.perf_counter() - start
  fetches = [loss] + update_ops
  params = sum(v.shape.size for v in graph.trainable_variables)
  try:
    _, _, report = auto_mtf.choose_layout(graph, fetches, devices, profile=profile,
                                          max_mesh_dims=FLAGS.max_mesh_dims)
  except auto_mtf.SolverError as e:
    print("\n%s: %s\nSearching again without a memory cap:" % (title, e))
    _, _, report = auto_mtf.choose_layout(graph, fetches, devices, profile=profile,
                                          memory_cap=float("inf"),
                                          max_mesh_dims=FLAGS.max_mesh_dims)
    report = report._replace(memory_cap=auto_mtf.hardware_profile(profile).memory_bytes)
  cap = report.memory_cap
  print("\n== %s (%.3gB parameters) on %d devices, profile %s, memory cap %.3g B; "
        "graph built in %.1f s" % (title, params / 1e9, devices, profile, cap, build_s))
  chosen = report.chosen._replace(fits=report.chosen.peak_memory <= cap)
  search = auto_mtf.LayoutSearch(graph, fetches, profile)
  hand = []
  for name, mesh, rules in hand_written_layouts(devices):
    try:
      hand.append((name, search.score(mesh, rules, cap)))
    except mtf.LayoutError as e:
      print("%s does not apply: %s" % (name, str(e).split(" -- ")[0]))
  if devices == 512:
    hand.append(("paper 16x32", search.score(*PAPER_16X32, memory_cap=cap)))
  fitting = [h for h in hand if h[1].fits] or hand
  best_name, best = min(fitting, key=lambda h: h[1].prediction.step_time)

  def measured(c):
    if make_lowering is None:
      return None
    return _measure(c.mesh_shape, c.layout_rules, make_lowering, loss, update_ops, feeds)
  rows = [["layout", "mesh", "rules", "step ms", "compute ms", "comm ms",
           "pred B/dev", "meas B/dev", "peak B/dev", "fits", "search s"]]
  rows.append(_row("auto", chosen, measured(chosen), report.search_seconds))
  rows.append(_row("best hand: " + best_name, best, measured(best)))
  for name, h in hand:
    if name == "paper 16x32" and best_name != name:
      rows.append(_row(name, h, None))
  common.print_table(rows)
  print("searched %d layouts of %d mesh shapes in %.1f s; runner-ups:" % (
      len(report.candidates), report.num_mesh_shapes, report.search_seconds))
  for c, why in report.runner_ups[:3]:
    print("  %s | %s: %s" % (c.mesh_shape, c.layout_rules, why))
  return report


def main(_):
  common.set_up_virtual_cpus(8)
  print(common.machine_line())
  for key in FLAGS.cases:
    run_case(key)


if __name__ == "__main__":
  app.run(main)
