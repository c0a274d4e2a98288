"""One program using every op family, lowered eagerly, inside tf.function, and with XLA.

The op tests run eagerly; this checks that graph-mode lowering (static slice shapes,
control dependencies, variable reads) and XLA compilation give the same numbers.
"""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import assert_close, random_array, random_ints

B = mtf.Dimension("batch", 16)
H = mtf.Dimension("hidden", 8)
L = mtf.Dimension("length", 4)
V = mtf.Dimension("vocab", 8)
DEVICES = ["/cpu:%d" % i for i in range(8)]


def _program():
  """A graph touching every op family; returns (graph, mesh, outputs)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, random_array([B, L, H], 0), [B, L, H], name="x")
  ids = mtf.import_tf_tensor(mesh, random_ints([B, L], 1, 0, 8), [B, L], name="ids")
  w = mtf.get_variable(mesh, "w", [H, V],
                       initializer=tf.constant_initializer(random_array([H, V], 2)))
  emb = mtf.get_variable(mesh, "emb", [V, H],
                         initializer=tf.constant_initializer(random_array([V, H], 3)))
  h = mtf.gelu(x) + mtf.gather(emb, ids, V)
  h = mtf.dropout(h, is_training=True, rate=0.25)
  h = mtf.shift(h, 1, B, wrap=False) + mtf.shift(h, -1, L, wrap=True)
  h = (mtf.concat([mtf.slice(h, 8, 8, "batch"), mtf.slice(h, 0, 8, "batch")], "batch") +
       mtf.pad(mtf.slice(h, 0, 8, "batch"), [8, 0], "batch"))
  merged = mtf.reshape(h, [B, mtf.Dimension("lh", 32)])
  h = mtf.reshape(mtf.tanh(merged), [B, L, H]) * mtf.cast(mtf.less(
      mtf.random_uniform(mesh, [B, H]), 0.9), tf.float32)
  logits = mtf.einsum([h, w], [B, L, V])
  probs = mtf.softmax(logits, V)
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(ids, V), V))
  loss += mtf.reduce_sum(mtf.cumsum(mtf.reduce_max(probs, reduced_dim=V), L)) * 0.01
  best, index = mtf.top_1(logits, V)
  stacked = mtf.stack(mtf.unstack(best, L), "length", axis=1)
  where = mtf.where(mtf.greater(stacked, 0.0), stacked, -stacked)
  grads = mtf.gradients([loss], [x, w, emb])
  return graph, mesh, [loss, probs, index, where] + grads


def _eager(impl):
  graph, mesh, outputs = _program()
  lowering = mtf.Lowering(graph, {mesh: impl})
  return [lowering.export_to_tf_tensor(t).numpy() for t in outputs]


def _in_function(impl, jit_compile):
  graph, mesh, outputs = _program()
  mtf.Lowering(graph, {mesh: impl})

  @tf.function(jit_compile=jit_compile)
  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(t) for t in outputs]
  return [t.numpy() for t in run()]


def test_graph_mode_and_xla_match_eager():
  reference = _eager(mtf.PlacementMeshImpl("", "", [""]))
  cases = {
      "tf.function on 2x4 (hidden split)": _in_function(mtf.PlacementMeshImpl(
          "rows:2;cols:4", "batch:rows;hidden:cols", DEVICES), False),
      "tf.function on 2x4 (vocab split)": _in_function(mtf.PlacementMeshImpl(
          "rows:2;cols:4", "batch:rows;vocab:cols", DEVICES), False),
      "tf.function on 8": _in_function(mtf.PlacementMeshImpl(
          "all:8", "batch:all", DEVICES), False),
      "XLA on one device": _in_function(mtf.PlacementMeshImpl("", "", [""]), True),
  }
  names = ["loss", "probs", "argmax", "where", "dx", "dw", "demb"]
  for case, values in cases.items():
    for name, got, want in zip(names, values, reference):
      assert_close(got, want, "%s: %s" % (case, name), rtol=1e-4, atol=1e-5)
  assert np.isfinite(reference[0]) and reference[0] > 0
