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
With --cpsat_site, the original's memory objective is also solved with OR-tools CP-SAT
(the original's solver) to compare its time with the exhaustive search.
"""
import itertools
import json
import os
import subprocess
import sys
import tempfile
import pathlib
import re
import time

from absl import app
from absl import flags

from benchmarks import common

FLAGS = flags.FLAGS
common.define_flag(flags.DEFINE_list, "cases", ["mlp8", "lm8", "tiny512", "paper512"],
                   "Cases to run.")
common.define_flag(flags.DEFINE_integer, "max_mesh_dims", 3,
                   "Most mesh dims of a searched mesh shape.")
common.define_flag(flags.DEFINE_string, "cpsat_site", "",
                   "A directory with OR-tools installed (pip install --target DIR "
                   "ortools; it pins protobuf < 6.34, so not in the TF venv). When set, "
                   "the original's memory objective on each case's chosen mesh is also "
                   "solved with CP-SAT, in a subprocess, and timed against the "
                   "exhaustive LayoutOptimizer.")
common.define_flag(flags.DEFINE_string, "cpsat_solve", "",
                   "Internal: solve this exported problem with "
                   "CP-SAT and print the result (run with cpsat_site on the path).")

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
  from models.transformer import model_graph, utils  # pylint: disable=g-import-not-at-top
  from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
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


def emitted_bytes(mesh_shape, rules, make_lowering, loss, update_ops, feeds,
                   backend="placement"):
  """Bytes per device the backend sends tracing one train step (variables are created
  outside the trace, as the trainer does)."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tf import analysis  # pylint: disable=g-import-not-at-top
  from models import train_steps  # pylint: disable=g-import-not-at-top
  n = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.make_mesh_impl(backend, mesh_shape, rules,
                            ["/cpu:%d" % i for i in range(n)])
  lowerings = []

  @tf.function
  def step(*args):
    lowering = make_lowering(impl, *args)
    lowerings.append(lowering)
    return train_steps.lower_train_step(lowering, loss, update_ops)
  make_lowering(impl)
  step.get_concrete_function(*feeds)
  return analysis.total_bytes_per_processor(lowerings[-1].comm_records)


def _row(label, c, emitted, seconds=None):
  p = c.prediction
  return [label, c.mesh_shape or "[]", c.layout_rules or "(none)",
          "%.3f" % (1e3 * p.step_time), "%.3f" % (1e3 * p.compute_time),
          "%.3f" % (1e3 * p.comm_time), "%.4g" % p.comm_bytes,
          "n/a" if emitted is None else "%.4g" % emitted,
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

  def emitted(c):
    if make_lowering is None:
      return None
    return emitted_bytes(c.mesh_shape, c.layout_rules, make_lowering, loss, update_ops, feeds)
  rows = [["layout", "mesh", "rules", "step ms", "compute ms", "comm ms",
           "pred B/dev", "emit B/dev", "peak B/dev", "fits", "search s"]]
  rows.append(_row("auto", chosen, emitted(chosen), report.search_seconds))
  rows.append(_row("best hand: " + best_name, best, emitted(best)))
  for name, h in hand:
    if name == "paper 16x32" and best_name != name:
      rows.append(_row(name, h, None))
  common.print_table(rows)
  print("searched %d layouts of %d mesh shapes in %.1f s; runner-ups:" % (
      len(report.candidates), report.num_mesh_shapes, report.search_seconds))
  for c, why in report.runner_ups[:3]:
    print("  %s | %s: %s" % (c.mesh_shape, c.layout_rules, why))
  if FLAGS.cpsat_site:
    compare_with_cpsat(title, graph, fetches, report.mesh_shape)
  return report


def export_memory_problem(graph, fetches, mesh_shape, path):
  """Writes the memory-objective problem of a graph on a mesh as JSON; returns the
  exhaustive LayoutOptimizer's (rules, peak bytes, seconds)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from mesh_tf.auto_mtf import layout_optimizer, memory_estimator  # pylint: disable=g-import-not-at-top
  est = memory_estimator.MemoryEstimator(graph, mesh_shape, fetches)
  opt = layout_optimizer.LayoutOptimizer(est)
  start = time.perf_counter()
  rules = opt.solve()
  seconds = time.perf_counter() - start
  v, g = est.get_layout_validator(), est.get_graph_interface()
  mesh = v.mesh_dimension_name_to_size
  peak_model = opt._peak  # pylint: disable=protected-access
  with open(path, "w") as f:
    json.dump(dict(
        mesh=mesh,
        valid=[[d, m] for d in sorted(v.splittable_mtf_dimension_names) for m in mesh
               if v.is_valid_assignment(d, m)],
        cliques=sorted({tuple(sorted(g.get_operation_mtf_dimension_names(n)))
                        for n in g.get_all_operation_names()}),
        shapes=peak_model._shapes,  # pylint: disable=protected-access
        held=np.unique(peak_model._held, axis=0).tolist()), f)  # pylint: disable=protected-access
  return rules, opt.evaluate_layout(rules), seconds


def cpsat_solve(path):
  """CP-SAT model of the exported problem: booleans x[dim, mesh dim] (at most one mesh
  dim per dim, at most one dim of an op per mesh dim), one boolean per local layout of
  each tensor shape tied to x, and peak >= bytes held at every step; minimize peak."""
  from ortools.sat.python import cp_model  # pylint: disable=g-import-not-at-top
  p = json.load(open(path))
  start = time.perf_counter()
  mesh, names = p["mesh"], list(p["mesh"])
  model = cp_model.CpModel()
  x = {(d, m): model.NewBoolVar("x[%s:%s]" % (d, m)) for d, m in p["valid"]}
  for d in {d for d, _ in x}:
    model.Add(sum(x[(d, m)] for m in names if (d, m) in x) <= 1)
  for clique in p["cliques"]:
    for m in names:
      vs = [x[(d, m)] for d in clique if (d, m) in x]
      if len(vs) > 1:
        model.Add(sum(vs) <= 1)
  shape_terms = []
  for i, shape in enumerate(p["shapes"]):
    sizes = dict(shape)
    split = [d for d, _ in shape if any((d, m) in x for m in names)]
    options = []
    for choice in itertools.product([None] + names, repeat=len(split)):
      used = [c for c in choice if c is not None]
      if len(used) != len(set(used)) or any(
          c is not None and (d, c) not in x for d, c in zip(split, choice)):
        continue
      n = 1
      for d, s in shape:
        c = choice[split.index(d)] if d in split else None
        n *= -(-s // mesh[c]) if c else s
      options.append((choice, n))
    zs = [model.NewBoolVar("z%d_%d" % (i, k)) for k in range(len(options))]
    model.AddExactlyOne(zs)
    for j, d in enumerate(split):
      for m in names:
        if (d, m) in x:
          model.Add(x[(d, m)] == sum(z for z, (c, _) in zip(zs, options) if c[j] == m))
    shape_terms.append([(z, n) for z, (_, n) in zip(zs, options)])
  peak = model.NewIntVar(0, 1 << 50, "peak")
  for row in p["held"]:
    model.Add(sum(int(w) * n * z for w, terms in zip(row, shape_terms) if w
                  for z, n in terms) <= peak)
  model.Minimize(peak)
  build = time.perf_counter() - start
  solver = cp_model.CpSolver()
  solver.parameters.num_workers = 2
  status = solver.Solve(model)
  print(json.dumps(dict(status=solver.StatusName(status), peak=solver.ObjectiveValue(),
                        build_s=build, solve_s=solver.WallTime(),
                        variables=len(model.Proto().variables))))


def compare_with_cpsat(title, graph, fetches, mesh_shape):
  """Prints exhaustive vs CP-SAT times and peaks of the memory objective on a mesh."""
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "problem.json")
    rules, peak, seconds = export_memory_problem(graph, fetches, mesh_shape, path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [FLAGS.cpsat_site, str(pathlib.Path(__file__).resolve().parents[1])]))
    out = subprocess.run([sys.executable, "-m", "benchmarks.auto_layout",
                          "--cpsat_solve=" + path], env=env, capture_output=True,
                         text=True, check=True).stdout
  r = json.loads(out.strip().splitlines()[-1])
  print("memory objective on %s, %s: exhaustive %.3f s (peak %d, %s); CP-SAT %s in "
        "%.2f s build + %.2f s solve, %d variables (peak %d)" % (
            mesh_shape, title, seconds, peak, rules, r["status"], r["build_s"],
            r["solve_s"], r["variables"], r["peak"]))


def main(_):
  if FLAGS.cpsat_solve:
    cpsat_solve(FLAGS.cpsat_solve)
    return
  common.set_up_virtual_cpus(8)
  print(common.machine_line())
  for key in FLAGS.cases:
    run_case(key)


if __name__ == "__main__":
  app.run(main)
