"""The original library's side of benchmarks/simd_scaling.py: how long mesh-tensorflow
0.1.21 (TF 2.12, TF1 graph mode) takes to build the peer LM's train step on a placement
mesh, and how many TF ops that builds.

Runs in the original's own virtual environment, e.g.

  /tmp/tf212/bin/python benchmarks/original_simd_build.py --mesh "rows:8;cols:8"

and prints one JSON line: {"devices", "mesh", "layout", "tf_ops", "build_s", "loss",
"machine"}. The model is written here by hand as an mtf graph with the einsums of the
port's models/tiny_lm/mtf_model.py (this file does not import the port): embedding,
per layer an RMS-normed attention block (q, k, v of [d_model, heads, d_kv], a causal
bias, softmax over the memory, o of [heads, d_kv, d_model]) and an RMS-normed ReLU
feed-forward block, a final norm, a softmax projection and the mean cross entropy; plain
SGD. Two differences from the port, both the original's own ops: the embedding lookup
is mtf.gather (a one-hot einsum in the original) and the cross entropy is
mtf.layers.softmax_cross_entropy_with_logits on integer targets.

The mesh is the original's PlacementMeshImpl with one device string "" per processor,
as the original's own tests build it: every processor's ops go into one TF graph on the
default device. "build_s" is the time from an empty graph to the lowered loss and
update ops (mtf graph, gradients, lowering; variables are created but not initialized);
"tf_ops" is the number of ops in that TF graph. With --run_step the step also runs once
in a Session, from the same weights and data as the port (reimplemented generators of
models/tiny_lm/config.py), and "loss" is the loss before the update.
"""
import argparse
import json
import os
import platform
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()

import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
from mesh_tensorflow import placement_mesh_impl  # pylint: disable=g-import-not-at-top


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--mesh", default="rows:8;cols:8")
  p.add_argument("--layout", default="batch:rows;heads:cols;d_ff:cols;vocab:cols")
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--length", type=int, default=128)
  p.add_argument("--vocab", type=int, default=2048)
  p.add_argument("--d_model", type=int, default=256)
  p.add_argument("--heads", type=int, default=32)
  p.add_argument("--d_kv", type=int, default=8)
  p.add_argument("--d_ff", type=int, default=1024)
  p.add_argument("--num_layers", type=int, default=2)
  p.add_argument("--learning_rate", type=float, default=0.05)
  p.add_argument("--run_step", action="store_true",
                 help="also run the step once and report the loss before the update")
  return p.parse_args(argv)


def weight_shapes(a):
  """{name: [(dim name, size)]} in creation order, as the port's tiny_lm config."""
  shapes = {"embedding": [("vocab", a.vocab), ("d_model", a.d_model)]}
  for i in range(a.num_layers):
    p = "layer_%d/" % i
    shapes[p + "attn_scale"] = [("d_model", a.d_model)]
    for w in "qkv":
      shapes[p + w] = [("d_model", a.d_model), ("heads", a.heads), ("d_kv", a.d_kv)]
    shapes[p + "o"] = [("heads", a.heads), ("d_kv", a.d_kv), ("d_model", a.d_model)]
    shapes[p + "ffn_scale"] = [("d_model", a.d_model)]
    shapes[p + "wi"] = [("d_model", a.d_model), ("d_ff", a.d_ff)]
    shapes[p + "wo"] = [("d_ff", a.d_ff), ("d_model", a.d_model)]
  shapes["final_scale"] = [("d_model", a.d_model)]
  shapes["softmax"] = [("d_model", a.d_model), ("vocab", a.vocab)]
  return shapes


def initial_weights(a, seed=0):
  """Scales of ones; other weights normal / sqrt(fan-in), drawn in creation order from
  one RandomState (the fan-in of an "o" weight is heads * d_kv)."""
  rng = np.random.RandomState(seed)
  out = {}
  for name, dims in weight_shapes(a).items():
    sizes = [s for _, s in dims]
    if name.endswith("scale"):
      out[name] = np.ones(sizes, np.float32)
    else:
      fan_in = sizes[0] * sizes[1] if name.endswith("/o") else sizes[0]
      out[name] = (rng.randn(*sizes) / np.sqrt(fan_in)).astype(np.float32)
  return out


def synthetic_batch(a, seed=0):
  """[batch, length + 1] token ids: each row counts up from a random start by 1-3."""
  rng = np.random.RandomState(seed)
  start = rng.randint(0, a.vocab, size=[a.batch, 1])
  step = rng.randint(1, 4, size=[a.batch, 1])
  return ((start + step * np.arange(a.length + 1)[None, :]) % a.vocab).astype(np.int32)


def _rms_norm(x, scale, dim):
  return x * mtf.rsqrt(mtf.reduce_mean(mtf.square(x), reduced_dim=dim) + 1e-6) * scale


def build(a, weights, batch):
  """The mtf graph of one SGD step on `batch`; returns (graph, mesh, loss, update ops)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  dims = {}

  def dim(name, size):
    dims.setdefault(name, mtf.Dimension(name, size))
    return dims[name]
  b, length = dim("batch", a.batch), dim("length", a.length)
  memory = dim("memory_length", a.length)
  d_model, vocab = dim("d_model", a.d_model), dim("vocab", a.vocab)
  v = {}
  for name, shape in weight_shapes(a).items():
    v[name] = mtf.get_variable(mesh, name, [dim(n, s) for n, s in shape],
                               initializer=tf.constant_initializer(weights[name]))
  inputs = mtf.import_tf_tensor(mesh, tf.constant(batch[:, :-1]), mtf.Shape([b, length]))
  targets = mtf.import_tf_tensor(mesh, tf.constant(batch[:, 1:]), mtf.Shape([b, length]))
  x = mtf.gather(v["embedding"], inputs, vocab)
  causal = mtf.cast(mtf.less(mtf.range(mesh, length, tf.int32),
                             mtf.range(mesh, memory, tf.int32)), tf.float32) * -1e9
  for i in range(a.num_layers):
    p = "layer_%d/" % i
    h = _rms_norm(x, v[p + "attn_scale"], d_model)
    q = mtf.einsum([h, v[p + "q"]], reduced_dims=[d_model])
    k = mtf.rename_dimension(mtf.einsum([h, v[p + "k"]], reduced_dims=[d_model]),
                             "length", "memory_length")
    val = mtf.rename_dimension(mtf.einsum([h, v[p + "v"]], reduced_dims=[d_model]),
                               "length", "memory_length")
    d_kv = q.shape.get_dim_by_name("d_kv")
    logits = mtf.einsum([q, k], reduced_dims=[d_kv]) + causal
    weights_ = mtf.softmax(logits, memory)
    attn = mtf.einsum([weights_, val], reduced_dims=[memory])
    x += mtf.einsum([attn, v[p + "o"]], output_shape=x.shape)
    h = _rms_norm(x, v[p + "ffn_scale"], d_model)
    x += mtf.einsum([mtf.relu(mtf.einsum([h, v[p + "wi"]], reduced_dims=[d_model])),
                     v[p + "wo"]], output_shape=x.shape)
  x = _rms_norm(x, v["final_scale"], d_model)
  logits = mtf.einsum([x, v["softmax"]], reduced_dims=[d_model])
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(
      logits, targets, vocab))
  names = list(v)
  grads = mtf.gradients([loss], [v[n] for n in names])
  updates = [mtf.assign(v[n], v[n] - g * a.learning_rate)
             for n, g in zip(names, grads)]
  return graph, mesh, loss, updates


def main(argv=None):
  a = parse_args(argv)
  weights, batch = initial_weights(a), synthetic_batch(a)
  mesh_shape = mtf.convert_to_shape(a.mesh)
  devices = [""] * mesh_shape.size
  with tf.Graph().as_default() as tf_graph:
    start = time.perf_counter()
    graph, mesh, loss, updates = build(a, weights, batch)
    impl = placement_mesh_impl.PlacementMeshImpl(mesh_shape, a.layout, devices)
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    tf_updates = tf.group([lowering.lowered_operation(op) for op in updates])
    build_s = time.perf_counter() - start
    tf_ops = len(tf_graph.get_operations())
    result = {"devices": mesh_shape.size, "mesh": a.mesh, "layout": a.layout,
              "tf_ops": tf_ops, "build_s": round(build_s, 3), "loss": None}
    if a.run_step:
      with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(lowering.copy_masters_to_slices())
        result["loss"] = float(sess.run([tf_loss, tf_updates])[0])
  result["machine"] = "%s, %d CPUs, Python %s, TensorFlow %s, mesh-tensorflow %s" % (
      platform.machine(), os.cpu_count(), platform.python_version(), tf.__version__,
      "0.1.21")
  print(json.dumps(result))


if __name__ == "__main__":
  main()
