"""How the SIMD emulation scales with the number of cores (a measurement, not a test).

For the README's 2-layer MLP train step on 8, 64 and 512 emulated cores (meshes 2x4, 8x8,
16x32, layout batch:rows;hidden:cols) prints: lowering seconds (tracing the tf.function),
TF op count, median step seconds (timed in rounds alternating the three meshes, so the
load of a shared machine hits each alike), and each as a ratio to the 8-core run.

For scale: the original's placement lowering built 114,139 TF ops and took 188 s before
its first step at 512 devices. The SIMD program should keep the 8-core op count, build in
seconds, and step within 3x of the 8-core step.

The same for the peer LM of benchmarks/step_time.py (models.tiny_lm: vocab 2048, d_model
256, d_ff 1024, 2 layers, sequence 128, batch 32, SGD) with 32 heads of d_kv 8, so that
heads divide a 32-way split: layout batch:rows;heads:cols;d_ff:cols;vocab:cols on the
same meshes (batch 16 / 4 / 2 per row). Its "build_s" is the whole build (mtf graph,
variables, lowering and trace) and "loss" the loss before the first update. As the
reference, the original library (mesh-tensorflow 0.1.21, TF 2.12) builds the same LM on
its placement mesh of 64 devices (benchmarks/original_simd_build.py, run by the
--original_python interpreter; skipped, with a line saying why, where that is missing or
in a smoke run of under 3 rounds).
The goal: the 8-core op count at 512 cores, a build in seconds, and the 512-core step
within 1.5x of the 8-core step.

    python -m benchmarks.simd_scaling [--model mlp|lm|both] [--steps 5] [--repeats 9]
        [--original_python /tmp/tf212/bin/python] [--lm_length 128] [--lm_vocab 2048]
        [--lm_d_model 256] [--lm_d_ff 1024]
"""
import argparse
import json
import os
import subprocess
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
from benchmarks.common import machine_line, print_table, time_alternating  # pylint: disable=g-import-not-at-top
from models.mlp.model import MlpModel, synthetic_digits  # pylint: disable=g-import-not-at-top

MESHES = [("rows:2;cols:4", 8), ("rows:8;cols:8", 64), ("rows:16;cols:32", 512)]
LAYOUT = "batch:rows;hidden:cols"
BATCH = 32


def build(mesh_shape):
  """(lowering seconds, op count, step callable) for one mesh."""
  model = MlpModel(batch_size=BATCH)
  impl = mtf.SimdMeshImpl(mesh_shape, LAYOUT)
  train_step = model.make_train_step(impl)
  images, labels = synthetic_digits(BATCH)
  images, labels = tf.constant(images), tf.constant(labels)
  start = time.perf_counter()
  concrete = train_step.get_concrete_function(images, labels)
  lowering_s = time.perf_counter() - start
  ops = len(concrete.graph.get_operations())
  return lowering_s, ops, lambda: train_step(images, labels)


LM_LAYOUT = "batch:rows;heads:cols;d_ff:cols;vocab:cols"
LM_SIZES = dict(batch=32, length=128, vocab=2048, d_model=256, heads=32, d_kv=8,
                d_ff=1024, num_layers=2, learning_rate=0.05)
ORIGINAL_MESH = ("rows:8;cols:8", 64)
ORIGINAL_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               "original_simd_build.py")


def lm_config(sizes):
  from models.tiny_lm import config  # pylint: disable=g-import-not-at-top
  return config.TinyLmConfig(**sizes)


def build_lm(mesh_shape, c, weights, batch):
  """(build seconds, op count, step callable, first loss) of the LM on one mesh; the
  build is the mtf graph, the variables, the lowering and the trace."""
  from models.tiny_lm import mtf_model  # pylint: disable=g-import-not-at-top
  inputs, targets = tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])
  start = time.perf_counter()
  model = mtf_model.TinyLmModel(c, weights)
  train_step = model.make_train_step(mtf.SimdMeshImpl(mesh_shape, LM_LAYOUT))
  concrete = train_step.get_concrete_function(inputs, targets)
  build_s = time.perf_counter() - start
  ops = len(concrete.graph.get_operations())
  step = lambda: train_step(inputs, targets)
  first_loss = float(step().numpy())  # the loss before the first update
  return build_s, ops, step, first_loss


def original_reference(python, mesh_shape, sizes):
  """The original's placement build of the LM: (dict from its JSON line, None) or
  (None, why it was skipped)."""
  if not python:
    return None, "no --original_python given"
  if not os.path.exists(python):
    return None, "%s not found (make it with: python3.10 -m venv /tmp/tf212 && " \
        "/tmp/tf212/bin/pip install tensorflow-cpu==2.12.* mesh-tensorflow==0.1.21 " \
        "gin-config)" % python
  flags = ["--mesh", mesh_shape, "--layout", LM_LAYOUT, "--run_step"] + [
      "--%s=%s" % (k, v) for k, v in sizes.items()]
  try:
    result = subprocess.run([python, ORIGINAL_SCRIPT] + flags, capture_output=True,
                            text=True, timeout=1800, check=False)
  except subprocess.TimeoutExpired:
    return None, "the original's build did not finish in 1800 s"
  lines = [l for l in result.stdout.splitlines() if l.startswith("{")]
  if result.returncode or not lines:
    tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
    return None, "the original's build failed (exit %d): %s" % (result.returncode,
                                                                 tail[0])
  return json.loads(lines[-1]), None


def run_mlp(steps, repeats):
  built = {cores: build(mesh_shape) for mesh_shape, cores in MESHES}
  # Alternating rounds, so load from other processes hits every mesh alike.
  step_s = time_alternating({c: b[2] for c, b in built.items()}, steps, repeats)
  losses = {c: float(b[2]().numpy()) for c, b in built.items()}
  base = built[8][:2] + (step_s[8],)
  print("%6s %11s %7s %9s %11s %10s %8s %10s" % (
      "cores", "lowering_s", "x8", "tf_ops", "x8", "step_s", "x8", "loss"))
  for cores, (lowering_s, ops, _) in built.items():
    print("%6d %11.2f %7.2f %9d %11.2f %10.4f %8.2f %10.4f" % (
        cores, lowering_s, lowering_s / base[0], ops, ops / base[1], step_s[cores],
        step_s[cores] / base[2], losses[cores]))


def run_lm(steps, repeats, original_python, sizes):
  """The LM table: one row per mesh, then the original's placement build at 64."""
  from models.tiny_lm import config  # pylint: disable=g-import-not-at-top
  c = lm_config(sizes)
  weights, batch = config.initial_weights(c), config.synthetic_batch(c)
  built = {}
  for mesh_shape, cores in MESHES:
    built[cores] = build_lm(mesh_shape, c, weights, batch) + (mesh_shape,)
  step_s = time_alternating({k: b[2] for k, b in built.items()}, steps, repeats)
  print("LM %s; layout %s; %d steps per block, median of %d alternating "
        "rounds" % (", ".join("%s %s" % kv for kv in sizes.items()), LM_LAYOUT, steps,
                    repeats))
  if repeats < 3:
    reference, why = None, ("a smoke run (--repeats < 3); the original's %d-device build "
                            "takes minutes" % ORIGINAL_MESH[1])
  else:
    reference, why = original_reference(original_python, ORIGINAL_MESH[0], sizes)
  base = built[8]
  rows = [["model", "cores", "mesh", "build_s", "x8", "tf_ops", "x8", "step_s", "x8",
           "first_loss"]]
  mesh_name = lambda m: "x".join(d.split(":")[1] for d in m.split(";"))
  for cores, (build_s, ops, _, loss, mesh_shape) in built.items():
    rows.append(["lm-simd", "%d" % cores, mesh_name(mesh_shape), "%.2f" % build_s,
                 "%.2f" % (build_s / base[0]), "%d" % ops, "%.2f" % (ops / base[1]),
                 "%.4f" % step_s[cores], "%.2f" % (step_s[cores] / step_s[8]),
                 "%.5f" % loss])
  if reference is not None:
    loss = reference.get("loss")
    rows.append(["lm-original-placement", "%d" % reference["devices"],
                 mesh_name(reference["mesh"]), "%.2f" % reference["build_s"],
                 "%.2f" % (reference["build_s"] / base[0]), "%d" % reference["tf_ops"],
                 "%.2f" % (reference["tf_ops"] / base[1]), "-", "-",
                 "-" if loss is None else "%.5f" % loss])
  print_table(rows)
  if reference is None:
    print("reference skipped: %s" % why)
  else:
    port = built[ORIGINAL_MESH[1]]
    print("reference (%s): at %d cores the original's placement build has %.0fx the "
          "TF ops and takes %.0fx the build time of the SIMD build" % (
              reference["machine"], ORIGINAL_MESH[1], reference["tf_ops"] / port[1],
              reference["build_s"] / port[0]))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="both", choices=["mlp", "lm", "both"])
  parser.add_argument("--steps", type=int, default=None,
                      help="steps per timed block (default: MLP 5, LM 1)")
  parser.add_argument("--repeats", type=int, default=None,
                      help="rounds; each times one block of every mesh in turn "
                      "(default: MLP 9, LM 7)")
  parser.add_argument("--original_python", default="/tmp/tf212/bin/python",
                      help="interpreter of the original's venv for the LM reference "
                      "('' skips it)")
  parser.add_argument("--lm_length", type=int, default=LM_SIZES["length"],
                      help="the LM's sequence length (smaller for a smoke run)")
  for dim in ("vocab", "d_model", "d_ff"):
    parser.add_argument("--lm_" + dim, type=int, default=LM_SIZES[dim],
                        help="the LM's %s (smaller for a smoke run)" % dim)
  args = parser.parse_args()
  print(machine_line())
  if args.model in ("mlp", "both"):
    run_mlp(args.steps or 5, args.repeats or 9)
  if args.model in ("lm", "both"):
    run_lm(args.steps or 1, args.repeats or 7, args.original_python,
           dict(LM_SIZES, length=args.lm_length, vocab=args.lm_vocab,
                d_model=args.lm_d_model, d_ff=args.lm_d_ff))


if __name__ == "__main__":
  main()
