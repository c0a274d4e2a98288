"""How the SIMD emulation scales with the number of cores (a measurement, not a test).

For the README's 2-layer MLP train step on 8, 64 and 512 emulated cores (meshes 2x4, 8x8,
16x32, layout batch:rows;hidden:cols) prints: lowering seconds (tracing the tf.function),
TF op count, median step seconds (timed in rounds alternating the three meshes, so the
load of a shared machine hits each alike), and each as a ratio to the 8-core run.

For scale: the original's placement lowering built 114,139 TF ops and took 188 s before
its first step at 512 devices. The SIMD program should keep the 8-core op count, build in
seconds, and step within 3x of the 8-core step.

    python -m benchmarks.simd_scaling [--steps 5] [--repeats 9]
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import mesh_tf as mtf  # pylint: disable=g-import-not-at-top
from benchmarks.common import machine_line, time_alternating  # pylint: disable=g-import-not-at-top
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


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=5, help="steps per timed block")
  parser.add_argument("--repeats", type=int, default=9,
                      help="rounds; each times one block of every mesh in turn")
  args = parser.parse_args()
  built = {cores: build(mesh_shape) for mesh_shape, cores in MESHES}
  # Alternating rounds, so load from other processes hits every mesh alike.
  step_s = time_alternating({c: b[2] for c, b in built.items()}, args.steps,
                            args.repeats)
  losses = {c: float(b[2]().numpy()) for c, b in built.items()}
  base = built[8][:2] + (step_s[8],)
  print(machine_line())
  print("%6s %11s %7s %9s %11s %10s %8s %10s" % (
      "cores", "lowering_s", "x8", "tf_ops", "x8", "step_s", "x8", "loss"))
  for cores, (lowering_s, ops, _) in built.items():
    print("%6d %11.2f %7.2f %9d %11.2f %10.4f %8.2f %10.4f" % (
        cores, lowering_s, lowering_s / base[0], ops, ops / base[1], step_s[cores],
        step_s[cores] / base[2], losses[cores]))


if __name__ == "__main__":
  main()
