"""Measured memory of a train step per layout, beside mtf.analysis's prediction.

The model is the benchmarks' peer LM (benchmarks/step_time.py's sizes: vocab 2048,
d_model 256, d_ff 1024, 8 heads x d_kv 32, sequence 128, batch 32) built as the
library's gin-configured Transformer (models/transformer, as benchmarks/overhead.py
builds it) and trained with Adam, at 2 layers ("peer") and 8 layers ("deep"). Each
(model, backend, layout) runs in its own subprocess, with TF_CPU_ALLOCATOR_USE_BFC=true
set before TensorFlow starts, on 8 virtual CPUs; it trains two steps, resets the
allocator's statistics and reports the peak of a third. Columns:

- weights/slots per device: counted from the TF variables themselves (each
  processor's slice variable); "predicted" is mtf.analysis.predict_memory's per-device
  figure. They are equal by construction of the layout, and are what each device
  would hold on separate accelerators.
- held in process: the bytes of the distinct TF variables (replicas of a replicated
  slice share one variable on these CPU backends).
- measured peak: the allocator's peak during one step. All virtual CPU devices of a
  process share ONE allocator, so this is the whole process, and it counts each
  distinct buffer once: it is compared with the model's per-process peak
  (process_peak_bytes), not with 8 x the per-device peak.

`--processes=2` adds the memory per device group where it is real: the same steps as 2
multi-client SPMD processes (mesh_tf.cluster.multi_client, as `cluster_config.mode =
'spmd'` trains) of 4 virtual CPUs each, one row per process with its own allocator's
peak of one step, each device a replica (`program="per_device"`: MultiClientMeshImpl)
with its own slice variables and its own step function: nothing is shared between the
4 devices of a process, not even a replicated weight. (The trainer's default on CPUs,
one placement program per process, shares as the single-process backends do; these
rows measure the per-device program.) So the prediction for a process of k devices is
k x predict_memory's per-device figures (variables k x (weight_bytes + slot_bytes),
exactly; peak k x peak_bytes, which has every replica at its peak at once), not the
process_* figures, which price the sharing of the single-process backends.

With `--sharded_state` each SPMD layout runs twice, the second time with Adam's
`shard_optimizer_state=True` (issue 31, item 3): its rows add the ratios of each
process's peak and of the slot bytes per device to the unsharded run's.

Where the devices' work does not run in lockstep the process peak is not the
every-device-at-its-peak figure: under dp (and the dp halves of dp+mp) the devices meet
only in the gradient reductions, and how many of their independent slice computations
the TF executor runs at once (its inter-op threads; one SPMD replica thread per device)
sets how many activation peaks coincide (placement dp, toy LM: 0.38, 0.45, 0.76 of the
figure with 1, 2 (default, 2 cores) and 8 threads; the same with the speed layer's
function calls off). The "check" column therefore says "15%" (within 15% of that
figure), "bounds" (MemoryPrediction.process_peak_bounds: the process's variables plus
one device's activation peak <= measured <= 1.15 x that figure) or "NO".

  python -m benchmarks.memory [--models peer,deep --backends placement,simd]
      [--processes 2 [--sharded_state]]  (--backends= leaves out the single-process rows)

`--budget_search` adds issue 31's item 5: the largest LM whose predicted per-device
peak fits --budget_mib per device, for each layout, with and without
rematerialization, in float32, with Adam's state split over the data-parallel dims and
with bfloat16 activations, each confirmed by running one step of the found model.
"""
import json
import os
import subprocess
import sys

from absl import app
from absl import flags

from benchmarks import common

FLAGS = flags.FLAGS
common.define_flag(flags.DEFINE_list, "models", ["peer", "deep"], "Models (see MODELS).")
common.define_flag(flags.DEFINE_list, "backends", ["placement", "simd"],
                   "mesh_tf backends.")
common.define_flag(flags.DEFINE_list, "layouts", ["single", "dp", "mp", "dp+mp"],
                   "Layouts (see LAYOUTS).")
common.define_flag(flags.DEFINE_bool, "budget_search", False,
                   "Also run the item-5 budget search.")
common.define_flag(flags.DEFINE_integer, "budget_mib", 512,
                   "Per-device budget of the search (MiB).")
common.define_flag(flags.DEFINE_string, "budget_backend", "simd",
                   "Backend of the confirming runs.")
common.define_flag(flags.DEFINE_bool, "confirm", True,
                   "Run one step of each model the search found.")
common.define_flag(flags.DEFINE_integer, "max_width", 4096,
                   "Widest d_model the search tries.")
common.define_flag(flags.DEFINE_integer, "processes", 1,
                   "With 2 or more: also each process's peak when "
                   "the mesh runs as that many SPMD processes.")
common.define_flag(flags.DEFINE_bool, "sharded_state", False,
                   "With --processes: run each SPMD layout "
                   "also with Adam's shard_optimizer_state=True and print the ratios "
                   "sharded / unsharded.")
common.define_flag(flags.DEFINE_string, "worker", None,
                   "Internal: JSON of one measurement to run.")

MODELS = {
    "peer": dict(batch=32, length=128, vocab=2048, num_layers=2, d_model=256,
                 d_ff=1024, num_heads=8, d_kv=32),
    "deep": dict(batch=32, length=128, vocab=2048, num_layers=8, d_model=256,
                 d_ff=1024, num_heads=8, d_kv=32),
    # for tests: small, yet its activations (MiBs) dwarf the allocator's fixed costs
    "toy": dict(batch=16, length=64, vocab=256, num_layers=1, d_model=64, d_ff=256,
                num_heads=8, d_kv=8),
}

LAYOUTS = {
    "single": ("", ""),
    "dp": ("batch:8", "batch:batch"),
    "mp": ("model:8", "d_ff:model;heads:model;vocab:model"),
    "dp+mp": ("batch:2;model:4", "batch:batch;d_ff:model;heads:model;vocab:model"),
}

WARMUP_STEPS = 2
LEARNING_RATE = 0.001


def size_bindings(s, recompute_grads=False):
  """gin bindings of a Transformer LM of sizes s (a MODELS entry)."""
  out = ["num_layers = %d" % s["num_layers"], "d_model = %d" % s["d_model"],
         "d_ff = %d" % s["d_ff"], "num_heads = %d" % s["num_heads"],
         "d_kv = %d" % s["d_kv"], "dropout_rate = 0.0",
         "Unitransformer.max_length = %d" % s["length"]]
  if recompute_grads:
    out.append("transformer.LayerStack.recompute_grads = True")
  return out


def build_lm(s, recompute_grads=False, shard_optimizer_state=False, bf16=False):
  """The train-mode ModelGraph (Adam) of the Transformer LM of sizes s; optionally with
  rematerialization, Adam's state split over the data-parallel mesh dims, and
  gin_configs/bf16.gin's bfloat16 activations."""
  import gin  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models.transformer import model_graph, utils  # pylint: disable=g-import-not-at-top
  from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
  from models.transformer.context import ModeKeys  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    gin_setup.parse_gin(["models/lm_cpu_small.gin"] + (["bf16.gin"] if bf16 else []),
                        size_bindings(s, recompute_grads))
    model = utils.build_model(model_type="lm", input_vocab_size=s["vocab"],
                              output_vocab_size=s["vocab"])
    optimizer = mtf.optimize.AdamWeightDecayOptimizer(
        learning_rate=LEARNING_RATE, shard_optimizer_state=shard_optimizer_state)
    return model_graph.ModelGraph(model, s["batch"], s["length"], ["targets"],
                                  ModeKeys.TRAIN, utils.get_variable_dtype(), optimizer)
  finally:
    gin.clear_config()


def parameter_count(graph):
  """Trainable parameters of a ModelGraph."""
  return sum(v.shape.size for v in graph.graph.trainable_variables)


def fetches(graph):
  """The tensors and ops of one train step."""
  return [graph.loss] + graph.update_ops


def variable_bytes(mesh_impl, trainable_names):
  """Bytes of the TF variables of a mesh: ([weights, slots] each processor's slice
  variables hold, [weights, slots] of the distinct TF variables of the process)."""
  per_device, held = [0, 0], [0, 0]
  for name, lv in mesh_impl.variable_store.items():
    kind = 0 if name in trainable_names else 1
    if hasattr(lv, "slice_variables"):  # placement: one per processor, replicas shared
      distinct = {id(v): v for v in lv.slice_variables}.values()
      per_device[kind] += _nbytes(lv.slice_variables[0])
      held[kind] += sum(_nbytes(v) for v in distinct)
    else:  # SIMD emulation: one variable of the distinct slices, [extents..., slice]
      k = len(lv.extents)
      slice_elements = 1
      for d in lv.variable.shape.as_list()[k:]:
        slice_elements *= d
      per_device[kind] += slice_elements * lv.variable.dtype.size
      held[kind] += _nbytes(lv.variable)
  return per_device, held


def _nbytes(v):
  return v.shape.num_elements() * v.dtype.size


def run_worker(spec):
  """Trains in this process (the env var set) and returns the measured figures."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if spec.get("inter_op_threads"):  # the executor's threads (default: one per core)
    tf.config.threading.set_inter_op_parallelism_threads(spec["inter_op_threads"])
  if spec.get("intra_op_threads"):  # threads within one kernel (default: one per core)
    tf.config.threading.set_intra_op_parallelism_threads(spec["intra_op_threads"])
  devices = common.set_up_virtual_cpus(8)
  import numpy as np  # pylint: disable=g-import-not-at-top
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  from models import train_steps  # pylint: disable=g-import-not-at-top
  s = spec["sizes"]
  graph = build_lm(s, spec.get("recompute_grads", False),
                   spec.get("shard_optimizer_state", False), spec.get("bf16", False))
  mesh_shape, rules = spec["mesh_shape"], spec["rules"]
  n = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.make_mesh_impl(spec["backend"], mesh_shape, rules, devices[:max(n, 1)])
  targets = np.random.RandomState(0).randint(1, s["vocab"], size=(s["batch"], s["length"]))
  targets = tf.constant(targets.astype(np.int32))
  graph.lowering(impl)  # variables, eagerly

  @tf.function
  def step(t):
    return train_steps.lower_train_step(graph.lowering(impl, {"targets": t}),
                                        graph.loss, graph.update_ops)
  for _ in range(spec.get("warmup", WARMUP_STEPS)):
    loss = float(step(targets))
  before = tf.config.experimental.get_memory_info("CPU:0")["current"]
  tf.config.experimental.reset_memory_stats("CPU:0")
  loss = float(step(targets))
  peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  names = {v.name for v in graph.graph.trainable_variables}
  per_device, held = variable_bytes(impl, names)
  return dict(peak=peak, current=before, loss=loss, weights=per_device[0],
              slots=per_device[1], held_weights=held[0], held_slots=held[1])


def spmd_variable_bytes(replicas, trainable_names):
  """([weights, slots] of one replica, [weights, slots] of all this process's
  replicas) of a multi_client.ReplicaSet: each replica has its own slice variables."""
  per_device, held = [0, 0], [0, 0]
  for r, impl in enumerate(replicas.impls):
    for name, lv in impl.variable_store.items():
      kind = 0 if name in trainable_names else 1
      held[kind] += _nbytes(lv.variable)
      if r == 0:
        per_device[kind] += _nbytes(lv.variable)
  return per_device, held


def run_spmd_worker(spec):
  """One SPMD process (task spec["task"] of spec["cluster"]): trains with the others
  on its own replicas and returns its figures, as run_worker does."""
  from mesh_tf.cluster import multi_client  # pylint: disable=g-import-not-at-top
  if spec.get("inter_op_threads"):  # the executor's threads (default: one per core)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.threading.set_inter_op_parallelism_threads(spec["inter_op_threads"])
  replicas = multi_client.ReplicaSet(spec["mesh_shape"], spec["rules"], spec["cluster"],
                                     spec["task"],  # before TF makes its devices
                                     program="per_device")
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tf.cluster import input_share  # pylint: disable=g-import-not-at-top
  from mesh_tf.cluster import spmd_training  # pylint: disable=g-import-not-at-top
  s = spec["sizes"]
  graph = build_lm(s, shard_optimizer_state=spec.get("shard_optimizer_state", False))
  begin, end = input_share.batch_rows(replicas.impls[0],
                                      graph.placeholders["targets"].shape)
  targets = np.random.RandomState(0).randint(1, s["vocab"], size=(s["batch"], s["length"]))
  batch = {"targets": tf.constant(targets[begin:end].astype(np.int32))}  # its rows only
  trainer = spmd_training.SpmdTrainer(graph, replicas)
  for _ in range(spec.get("warmup", WARMUP_STEPS)):
    loss = trainer.step(batch)
  before = tf.config.experimental.get_memory_info("CPU:0")["current"]
  tf.config.experimental.reset_memory_stats("CPU:0")
  loss = trainer.step(batch)
  peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  names = {v.name for v in graph.graph.trainable_variables}
  per_device, held = spmd_variable_bytes(replicas, names)
  trainer.agree_max(0)  # every process is past the measured step before any exits
  replicas.monitor.stop()
  return dict(task=spec["task"], devices=len(replicas.impls), rows=[begin, end],
              peak=peak, current=before, loss=loss, weights=per_device[0],
              slots=per_device[1], held_weights=held[0], held_slots=held[1])


# oneDNN's kernels keep buffers outside TF's allocator, so its peak misses them: on an
# AMD EPYC host the bf16 toy LM's measured peak came out 15-27% under the prediction
# with oneDNN on, and 3-11% with it off. Off, the measurement counts every buffer.
COUNT_EVERY_BUFFER = {"TF_ENABLE_ONEDNN_OPTS": "0"}


def measure(sizes, backend, layout, recompute_grads=False, timeout=1800,
            warmup=WARMUP_STEPS, inter_op_threads=None, shard_optimizer_state=False,
            bf16=False, intra_op_threads=None):
  """Runs run_worker in a fresh subprocess with the BFC allocator; returns its dict
  (peak and current bytes, the loss, and variable_bytes's figures). inter_op_threads:
  the TF executor's thread pool, intra_op_threads: the pool within a kernel (None:
  TF's defaults, one per core); shard_optimizer_state and bf16 select build_lm's
  variants."""
  mesh_shape, rules = LAYOUTS[layout] if isinstance(layout, str) else layout
  spec = dict(sizes=sizes, backend=backend, mesh_shape=mesh_shape, rules=rules,
              recompute_grads=recompute_grads, warmup=warmup,
              inter_op_threads=inter_op_threads, intra_op_threads=intra_op_threads,
              shard_optimizer_state=shard_optimizer_state, bf16=bf16)
  env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="2",
             **COUNT_EVERY_BUFFER)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.memory", "--worker", json.dumps(spec)],
      capture_output=True, text=True, timeout=timeout, env=env, cwd=root)
  if result.returncode != 0:
    raise RuntimeError("memory worker failed (%s %s %s): %s" % (
        backend, mesh_shape, rules, result.stderr[-3000:]))
  return json.loads(result.stdout.strip().splitlines()[-1])


def measure_spmd(sizes, layout, processes=2, timeout=1800, warmup=WARMUP_STEPS,
                 shard_optimizer_state=False, inter_op_threads=None):
  """Runs run_spmd_worker in `processes` fresh SPMD processes (BFC allocator, free
  loopback ports, every process killed at the end); returns their dicts, by task.
  With shard_optimizer_state, Adam's slots are split over the data-parallel mesh dims;
  inter_op_threads: each process's TF executor threads (None: TF's default)."""
  from mesh_tf.cluster import local  # pylint: disable=g-import-not-at-top
  mesh_shape, rules = LAYOUTS[layout] if isinstance(layout, str) else layout
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = common.subprocess_env(TF_CPU_ALLOCATOR_USE_BFC="true", **COUNT_EVERY_BUFFER)
  cluster = ",".join("localhost:%d" % p for p in local.free_ports(processes))
  procs = []
  try:
    for task in range(processes):
      spec = dict(sizes=sizes, mesh_shape=mesh_shape, rules=rules, cluster=cluster,
                  task=task, warmup=warmup,
                  shard_optimizer_state=shard_optimizer_state,
                  inter_op_threads=inter_op_threads)
      procs.append(subprocess.Popen(
          [sys.executable, "-m", "benchmarks.memory", "--worker", json.dumps(spec)],
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root))
    outputs = [p.communicate(timeout=timeout) for p in procs]
  finally:
    local.stop(procs)
  for task, ((out, err), p) in enumerate(zip(outputs, procs)):
    if p.returncode != 0:
      raise RuntimeError("spmd memory worker %d of %d failed (%s %s): %s" % (
          task, processes, mesh_shape, rules, err[-3000:]))
  return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


def spmd_process_prediction(p, devices):
  """(variable bytes, peak bytes) predicted for one SPMD process of `devices` devices
  from MemoryPrediction p: devices x the per-device figures (see the docstring)."""
  return devices * (p.weight_bytes + p.slot_bytes), devices * p.peak_bytes


def predict(graph, layout):
  """mtf.analysis's MemoryPrediction of the step of graph under a LAYOUTS entry."""
  from mesh_tf import analysis  # pylint: disable=g-import-not-at-top
  mesh_shape, rules = LAYOUTS[layout] if isinstance(layout, str) else layout
  return analysis.predict_memory(graph.graph, mesh_shape, rules, fetches=fetches(graph))


def _mib(x):
  return "%.1f" % (x / 2.0 ** 20)


TOLERANCE = 0.15  # issue 31, item 1: measured within 15% of the prediction


def verdict(measured, prediction, replicas=None):
  """How a measured process peak meets MemoryPrediction `prediction` (replicas: the
  SPMD replicas of the process, None for the single-process backends): "15%" when
  within TOLERANCE of the every-device-at-its-peak figure; else "bounds" when between
  the bounds of MemoryPrediction.process_peak_bounds (the upper one with TOLERANCE);
  else "NO"."""
  lower, upper = prediction.process_peak_bounds(replicas)
  if abs(measured / upper - 1) <= TOLERANCE:
    return "15%"
  if lower <= measured <= (1 + TOLERANCE) * upper:
    return "bounds"
  return "NO"


def measured_rows(models, backends, layouts):
  """Table rows (header first) of measured vs predicted memory; also returns the
  largest |measured/predicted - 1| of the process peaks."""
  rows = [["model", "params", "backend", "layout", "weights/dev MiB", "pred",
           "slots/dev MiB", "pred", "held in process MiB", "pred", "measured peak MiB",
           "pred process peak MiB", "ratio", "pred peak/dev MiB", "lower bound MiB",
           "check"]]
  worst = 0.0
  for model in models:
    graph = build_lm(MODELS[model])
    params = parameter_count(graph)
    for layout in layouts:
      p = predict(graph, layout)
      for backend in backends:
        m = measure(MODELS[model], backend, layout)
        ratio = m["peak"] / p.process_peak_bytes
        worst = max(worst, abs(ratio - 1))
        rows.append([model, "%.2fM" % (params / 1e6), backend, layout,
                     _mib(m["weights"]), _mib(p.weight_bytes), _mib(m["slots"]),
                     _mib(p.slot_bytes), _mib(m["held_weights"] + m["held_slots"]),
                     _mib(p.process_weight_bytes + p.process_slot_bytes),
                     _mib(m["peak"]), _mib(p.process_peak_bytes), "%.3f" % ratio,
                     _mib(p.peak_bytes), _mib(p.process_peak_bounds()[0]),
                     verdict(m["peak"], p)])
        print("  " + " | ".join(rows[-1]), flush=True)
  return rows, worst


def spmd_rows(models, layouts, processes, sharded_state=False):
  """Table rows (header first) of each SPMD process's measured memory vs predicted;
  also returns the largest |measured/predicted - 1| of the process peaks. With
  sharded_state each layout runs again with Adam's shard_optimizer_state=True, and its
  rows add the ratios of its peak and slot bytes to the unsharded run's (same task)."""
  rows = [["model", "layout", "Adam state", "processes x devices", "task", "batch rows",
           "weights/dev MiB", "pred", "slots/dev MiB", "pred", "held in process MiB",
           "pred", "measured peak MiB", "pred process peak MiB", "ratio",
           "lower bound MiB", "check", "peak sharded/full", "slots/dev sharded/full"]]
  worst = 0.0
  for model in models:
    for layout in layouts:
      full = {}
      for sharded in (False, True) if sharded_state else (False,):
        graph = build_lm(MODELS[model], shard_optimizer_state=sharded)
        p = predict(graph, layout)
        devices = mtf_size(LAYOUTS[layout][0]) // processes
        held, peak = spmd_process_prediction(p, devices)
        for m in measure_spmd(MODELS[model], layout, processes,
                              shard_optimizer_state=sharded):
          ratio = m["peak"] / peak
          worst = max(worst, abs(ratio - 1))
          if sharded:
            f = full[m["task"]]
            versus = ["%.3f" % (m["peak"] / f["peak"]), "%.3f" % (m["slots"] / f["slots"])]
          else:
            full[m["task"]] = m
            versus = ["-", "-"]
          rows.append([model, layout, "sharded" if sharded else "full",
                       "%dx%d" % (processes, m["devices"]),
                       str(m["task"]), "[%d, %d)" % tuple(m["rows"]), _mib(m["weights"]),
                       _mib(p.weight_bytes), _mib(m["slots"]), _mib(p.slot_bytes),
                       _mib(m["held_weights"] + m["held_slots"]), _mib(held),
                       _mib(m["peak"]), _mib(peak), "%.3f" % ratio,
                       _mib(p.process_peak_bounds(devices)[0]),
                       verdict(m["peak"], p, devices)] + versus)
          print("  " + " | ".join(rows[-1]), flush=True)
  return rows, worst


def mtf_size(mesh_shape):
  """Number of processors of a mesh shape string."""
  import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
  return mtf.convert_to_shape(mesh_shape).size


# The budget search's family: batch 8 x 128 tokens, 4 layers, 8 heads, d_ff = 4 d_model.
def family_sizes(d_model):
  """Sizes of the budget search's LM of width d_model (a multiple of 64)."""
  return dict(batch=8, length=128, vocab=2048, num_layers=4, d_model=d_model,
              d_ff=4 * d_model, num_heads=8, d_kv=d_model // 8)


def largest_fitting(budget, layout, recompute_grads, cache, max_width=4096, **variant):
  """(d_model, ModelGraph, MemoryPrediction) of the widest family LM whose predicted
  per-device peak fits budget bytes under layout (bisection over multiples of 64; the
  peak grows with the width), or None when even the narrowest does not fit."""
  def fits(width):
    key = (width, recompute_grads, tuple(sorted(variant.items())))
    if key not in cache:
      cache[key] = build_lm(family_sizes(width), recompute_grads, **variant)
    p = predict(cache[key], layout)
    return p.peak_bytes <= budget, p
  lo, hi = 0, max_width // 64  # in units of 64: lo fits (0: none yet), hi + 1 does not
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if fits(64 * mid)[0]:
      lo = mid
    else:
      hi = mid - 1
  if lo == 0:
    return None
  return 64 * lo, cache[(64 * lo, recompute_grads, tuple(sorted(variant.items())))], \
      fits(64 * lo)[1]


# The budget search's variants (issue 31, items 3 and 4): build_lm's keyword arguments.
BUDGET_VARIANTS = (("float32", {}), ("sharded Adam", dict(shard_optimizer_state=True)),
                   ("bf16 act.", dict(bf16=True)))


def print_budget_search(budget, backend, confirm):
  """Prints the largest LM per layout and variant (with and without
  rematerialization) whose predicted per-device peak fits budget, and the measured
  peak of one step of it. A variant that finds the same model with the same
  prediction as the float32 row (sharded Adam where no mesh dim splits the batch)
  reuses that row's run."""
  print("\nLargest LM whose train step fits %d MiB per device (%d MiB over 8 devices): "
        "4 layers, 8 heads, d_ff = 4 d_model, vocab 2048, batch 8 x 128, Adam; "
        "searched with mtf.analysis.predict_memory, confirmed by one step on %s"
        % (budget >> 20, 8 * budget >> 20, backend))
  rows = [["layout", "remat", "variant", "d_model", "params", "pred peak/dev MiB",
           "pred process MiB", "measured process MiB", "ratio"]]
  cache = {}
  for remat in (False, True):
    for layout in FLAGS.layouts:
      runs = {}
      for name, variant in BUDGET_VARIANTS:
        found = largest_fitting(budget, layout, remat, cache, FLAGS.max_width, **variant)
        if found is None:
          rows.append([layout, "yes" if remat else "no", name] + ["-"] * 6)
          continue
        width, graph, p = found
        measured, ratio = "-", "-"
        if confirm:
          key = (width, p.peak_bytes, p.process_peak_bytes)
          same = runs.get(key)
          if same is None:
            m = measure(family_sizes(width), backend, layout, remat, warmup=1, **variant)
            same = runs[key] = (_mib(m["peak"]),
                                "%.3f" % (m["peak"] / p.process_peak_bytes), name)
          measured, ratio = same[0], same[1]
          if same[2] != name:
            ratio += " (= %s)" % same[2]
        rows.append([layout, "yes" if remat else "no", name, str(width),
                     "%.1fM" % (parameter_count(graph) / 1e6), _mib(p.peak_bytes),
                     _mib(p.process_peak_bytes), measured, ratio])
        print("  " + " | ".join(rows[-1]), flush=True)
  common.print_table(rows)


def print_checks(rows):
  """Prints how many rows of a table (header first) meet the prediction how."""
  column = rows[0].index("check")
  counts = {v: sum(r[column] == v for r in rows[1:]) for v in ("15%", "bounds", "NO")}
  print("check: %(15%)d rows within 15%% of the every-device-at-its-peak prediction, "
        "%(bounds)d more between the bounds (one device's activation peak over the "
        "variables <= measured <= 1.15 x that prediction), %(NO)d outside both" % counts)


def main(_):
  if FLAGS.worker:
    spec = json.loads(FLAGS.worker)
    print(json.dumps(run_spmd_worker(spec) if "cluster" in spec else run_worker(spec)),
          flush=True)
    return
  print(common.machine_line())
  print("Transformer LM + Adam, 8 virtual CPUs, one subprocess per row; peak of step %d"
        % (WARMUP_STEPS + 1))
  if FLAGS.models and FLAGS.backends:
    rows, worst = measured_rows(FLAGS.models, FLAGS.backends, FLAGS.layouts)
    common.print_table(rows)
    print("largest |measured / predicted - 1| of the process peaks: %.3f" % worst)
    print_checks(rows)
  if FLAGS.models and FLAGS.processes > 1:
    n = FLAGS.processes
    layouts = [l for l in FLAGS.layouts if mtf_size(LAYOUTS[l][0]) % n == 0
               and mtf_size(LAYOUTS[l][0]) > n]
    print("\nThe same steps as %d SPMD processes (mesh_tf.cluster.multi_client, one "
          "replica per virtual CPU, 8 / %d per process); one row per process, its own "
          "allocator's peak vs (devices per process) x the per-device prediction" % (n, n))
    rows, worst = spmd_rows(FLAGS.models, layouts, n, FLAGS.sharded_state)
    common.print_table(rows)
    print("largest |measured / predicted - 1| of the SPMD process peaks: %.3f" % worst)
    print_checks(rows)
  if FLAGS.budget_search:
    print_budget_search(FLAGS.budget_mib << 20, FLAGS.budget_backend, FLAGS.confirm)


if __name__ == "__main__":
  app.run(main)
