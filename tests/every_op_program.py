"""One mtf program touching every op family of the foundation, for comparing lowerings
(backends, eager vs tf.function vs XLA).

Dims are sized so that every layout of the SIMD tests divides them (up to a 16x32 mesh).
"""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf

B = mtf.Dimension("batch", 32)
L = mtf.Dimension("length", 4)
H = mtf.Dimension("hidden", 16)
V = mtf.Dimension("vocab", 32)
OUTPUT_NAMES = ["loss", "probs", "argmax", "where", "range_sum", "dx", "dw", "demb",
                "w_after_update"]


def _array(shape, seed):
  return np.random.RandomState(seed).uniform(-2, 2, size=shape).astype(np.float32)


def build_program():
  """Returns (graph, mesh, outputs, update_op)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, _array([32, 4, 16], 0), [B, L, H], name="x")
  ids = mtf.import_tf_tensor(
      mesh, np.random.RandomState(1).randint(0, 32, size=[32, 4]).astype(np.int32), [B, L],
      name="ids")
  w = mtf.get_variable(mesh, "w", [H, V], initializer=tf.constant_initializer(
      _array([16, 32], 2)))
  emb = mtf.get_variable(mesh, "emb", [V, H], initializer=tf.constant_initializer(
      _array([32, 16], 3)))
  h = mtf.gelu(x) + mtf.gather(emb, ids, V)
  h = mtf.dropout(h, is_training=True, rate=0.25)
  h = mtf.shift(h, 1, B, wrap=False) + mtf.shift(h, -1, L, wrap=True)
  h = (mtf.concat([mtf.slice(h, 16, 16, "batch"), mtf.slice(h, 0, 16, "batch")], "batch")
       + mtf.pad(mtf.slice(h, 0, 16, "batch"), [16, 0], "batch"))
  merged = mtf.reshape(h, [B, mtf.Dimension("lh", 64)])
  h = mtf.reshape(mtf.tanh(merged), [B, L, H]) * mtf.cast(mtf.less(
      mtf.random_uniform(mesh, [B, H]), 0.9), tf.float32)
  logits = mtf.einsum([h, w], [B, L, V])
  probs = mtf.softmax(logits, V)
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(ids, V), V))
  loss += mtf.reduce_sum(mtf.cumsum(mtf.reduce_max(probs, reduced_dim=V), L)) * 0.01
  index, best = mtf.top_1(logits, V)
  stacked = mtf.stack(mtf.unstack(best, L), "length", axis=1)
  where = mtf.where(mtf.greater(stacked, 0.0), stacked, -stacked)
  range_sum = mtf.reduce_sum(mtf.cast(mtf.range(mesh, B, tf.int32), tf.float32) *
                             mtf.reduce_min(x, reduced_dim=L), output_shape=[H])
  dx, dw, demb = mtf.gradients([loss], [x, w, emb])
  update = mtf.assign(w, w - dw * 0.1)
  return graph, mesh, [loss, probs, index, where, range_sum, dx, dw, demb], update


def run_eager(impl):
  """Numpy values of OUTPUT_NAMES, lowered eagerly."""
  impl.next_random_step()  # as run_in_function does
  graph, mesh, outputs, update = build_program()
  lowering = mtf.Lowering(graph, {mesh: impl})
  values = [lowering.export_to_tf_tensor(t).numpy() for t in outputs]
  lowering.lowered_operation(update)
  return values + [impl.variable_store["w"].read_full().numpy()]


def run_in_function(impl, jit_compile=False):
  """Numpy values of OUTPUT_NAMES, lowered inside one tf.function."""
  graph, mesh, outputs, update = build_program()
  mtf.Lowering(graph, {mesh: impl})
  # Creates the random-step variable eagerly: a variable made during the first trace
  # would make tf.function trace twice.
  impl.next_random_step()

  @tf.function(autograph=False, jit_compile=jit_compile)
  def step():
    lowering = mtf.Lowering(graph, {mesh: impl})
    values = [lowering.export_to_tf_tensor(t) for t in outputs]
    with tf.control_dependencies(values):
      lowering.lowered_operation(update)
    return values
  values = [t.numpy() for t in step()]
  return values + [impl.variable_store["w"].read_full().numpy()]
