"""Optimizer state split over data parallelism: bytes per device and bytes sent.

    python -m benchmarks.sharded_state [--steps=3] [--size=readme|tiny]
        [--optimizers=adam,adafactor] [--layouts=dp,dp+mp] [--devices=8|4]

Builds the README LM's shape (2 layers, d_model 64, d_ff 256, 4 heads of 16, vocab
256; "tiny", for smoke tests: 1 layer, d_model 16, d_ff 32, 4 heads of 4, vocab 32)
with Adam and with Adafactor, with and without `shard_optimizer_state`, on 8
virtual CPUs (placement backend) under dp (`all:8`) and dp+mp (`batch:2;model:4`);
--devices=4, for smoke tests, uses 4 of them (`batch:4`, `batch:2;model:2`).
For each it prints the most optimizer-state bytes any device holds (counted from the
backend's tf.Variables), the cost model's prediction per processor, the bytes each
processor sends in one traced train step (measured, and predicted), and the largest
loss difference between the sharded and the unsharded run over a few steps.
"""
import argparse
import collections

from mesh_tf import utils

utils.configure_virtual_cpus(8, size_thread_pools=False)

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

import mesh_tf as mtf  # pylint: disable=g-import-not-at-top,wrong-import-position
from mesh_tf import analysis  # pylint: disable=g-import-not-at-top,wrong-import-position
from models.transformer import model_graph, transformer, transformer_layers  # pylint: disable=g-import-not-at-top,wrong-import-position
from models.transformer.context import ModeKeys  # pylint: disable=g-import-not-at-top,wrong-import-position


def layouts(devices):
  """{name: (mesh shape, layout rules)} of the meshes over that many devices."""
  return {
      "dp": ("batch:%d" % devices, "batch:batch"),
      "dp+mp": ("batch:2;model:%d" % (devices // 2),
                "batch:batch;heads:model;d_ff:model;vocab:model"),
  }


LAYOUTS = layouts(8)
OPTIMIZERS = {
    "adam": lambda shard: mtf.optimize.AdamWeightDecayOptimizer(
        1e-3, shard_optimizer_state=shard),
    "adafactor": lambda shard: mtf.optimize.AdafactorOptimizer(
        shard_optimizer_state=shard),
}
BATCH, LENGTH = 8, 16
SIZES = {"readme": dict(layers=2, d_model=64, d_ff=256, heads=4, d_kv=16, vocab=256),
         "tiny": dict(layers=1, d_model=16, d_ff=32, heads=4, d_kv=4, vocab=32)}


def _graph(mesh_shape, rules, optimizer, size):
  layers = []
  for i in range(size["layers"]):
    block = [transformer_layers.SelfAttention(num_heads=size["heads"],
                                              key_value_size=size["d_kv"]),
             transformer_layers.DenseReluDense(hidden_size=size["d_ff"])]
    for j, layer in enumerate(block):
      layer.set_name("block_%03d/layer_%03d" % (i, j))
    layers += block
  model = transformer.Unitransformer(
      layer_stack=transformer.LayerStack(layers), d_model=size["d_model"],
      input_vocab_size=size["vocab"], output_vocab_size=size["vocab"],
      autoregressive=True, max_length=LENGTH, vocab_divisor=8,
      layout=rules, mesh_shape=mesh_shape)
  tf.random.set_seed(1)  # the same initial values in both runs
  return model_graph.ModelGraph(model, BATCH, LENGTH, ["targets"], ModeKeys.TRAIN,
                                mtf.VariableDType(tf.float32), optimizer=optimizer)


def _max_slot_bytes(g, impl):
  per_device = collections.Counter()
  for v in g.graph.all_variables:
    if v.trainable:
      continue
    for sv in {id(s): s for s in impl.variable_store[v.name].slice_variables}.values():
      per_device[sv.device] += sv.shape.num_elements() * sv.dtype.size
  return max(per_device.values())


def _run(mesh_shape, rules, name, shard, batches, size):
  g = _graph(mesh_shape, rules, OPTIMIZERS[name](shard), size)
  devices = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.PlacementMeshImpl(mesh_shape, rules,
                               ["/cpu:%d" % i for i in range(devices)])
  step = tf.Variable(0, dtype=tf.int64)
  mtf.optimize.set_global_step(step)
  g.lowering(impl)
  lowerings = []

  @tf.function
  def train_step(targets):
    lowering = g.lowering(impl, {"targets": targets})
    lowerings.append(lowering)
    loss = lowering.export_to_tf_tensor(g.loss)
    with tf.control_dependencies([loss]):
      for op in g.update_ops:
        lowering.lowered_operation(op)
    return loss
  losses = []
  for b in batches:
    losses.append(float(train_step(tf.constant(b)).numpy()))
    step.assign_add(1)
  predicted = analysis.estimate_cost(g.graph, mesh_shape, rules,
                                     fetches=[g.loss] + g.update_ops)
  return dict(
      slot_bytes=_max_slot_bytes(g, impl),
      predicted_slot_bytes=predicted.optimizer_bytes_per_processor,
      sent=analysis.total_bytes_per_processor(lowerings[0].comm_records),
      predicted_sent=predicted.comm_bytes_per_processor,
      losses=np.array(losses))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--size", choices=sorted(SIZES), default="readme")
  parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
  parser.add_argument("--layouts", default=",".join(LAYOUTS))
  parser.add_argument("--devices", type=int, choices=[8, 4], default=8,
                      help="virtual CPUs the meshes span (4 for smoke tests)")
  args = parser.parse_args(argv)
  for flag, known in (("optimizers", OPTIMIZERS), ("layouts", LAYOUTS)):
    unknown = set(getattr(args, flag).split(",")) - set(known)
    if unknown:
      parser.error("--%s: unknown %s (known: %s)" % (flag, ", ".join(sorted(unknown)),
                                                    ", ".join(known)))
  size = SIZES[args.size]
  rng = np.random.RandomState(0)
  batches = [rng.randint(1, size["vocab"], size=(BATCH, LENGTH)).astype(np.int32)
             for _ in range(args.steps)]
  print("%-9s %-6s %-8s %12s %10s %12s %12s %14s" % (
      "optimizer", "layout", "sharded", "slot B/dev", "predicted", "sent B/proc",
      "predicted", "max |dloss|"))
  for name in args.optimizers.split(","):
    for layout in args.layouts.split(","):
      mesh = layouts(args.devices)[layout]
      base = _run(*mesh, name, False, batches, size)
      for shard in (False, True):
        r = base if not shard else _run(*mesh, name, True, batches, size)
        print("%-9s %-6s %-8s %12d %10d %12.0f %12.0f %14.2e" % (
            name, layout, shard, r["slot_bytes"], r["predicted_slot_bytes"], r["sent"],
            r["predicted_sent"], np.max(np.abs(r["losses"] - base["losses"]))))
      print("%-9s %-6s slot bytes per device, unsharded / sharded: %.2fx" % (
          name, layout, base["slot_bytes"] / r["slot_bytes"]))


if __name__ == "__main__":
  main()
