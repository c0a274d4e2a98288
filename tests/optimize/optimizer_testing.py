"""Helpers for optimizer tests: run apply_grads for a few steps with fed gradients, and
reference optimizers written directly in TF on whole tensors."""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf

BATCH = mtf.Dimension("batch", 8)
HIDDEN = mtf.Dimension("hidden", 8)
CLASSES = mtf.Dimension("classes", 4)
LENGTH = mtf.Dimension("length", 6)

# (mesh shape, layout) cases the update tests run on: one device, 8 devices with hidden
# split, and the 2x4 mesh with both dims split.
CASES = [("", ""), ("all:8", "hidden:all"), ("rows:2;cols:4", "batch:rows;hidden:cols")]


def make_impl(mesh_shape, layout):
  """A PlacementMeshImpl on the first N virtual CPUs."""
  n = mtf.convert_to_shape(mesh_shape).size
  return mtf.PlacementMeshImpl(mesh_shape, layout, ["/cpu:%d" % i for i in range(n)])


def fresh_global_step():
  """Installs (and returns) a new global step at 0, so tests do not share one."""
  step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
  mtf.optimize.set_global_step(step)
  return step


def random_values(shape, seed, low=-1.0, high=1.0):
  sizes = mtf.convert_to_shape(shape).to_integer_list
  return np.random.RandomState(seed).uniform(low, high, size=sizes).astype(np.float32)


def run_optimizer(make_optimizer, var_specs, grads_per_step, impl, dtype=tf.float32):
  """Applies fed gradients for len(grads_per_step) steps; returns every variable's value.

  Args:
    make_optimizer: fn() -> an mtf Optimizer (called once, after the graph has a mesh).
    var_specs: list of (name, mtf shape, initial numpy value).
    grads_per_step: list (one per step) of lists of numpy gradients (or None).
    impl: the MeshImpl.
    dtype: the variables' dtype (a tf.DType or VariableDType).
  Returns:
    (dict name -> numpy value of every variable incl. slots, in the master dtype, the
    graph's all_variables, the update ops).
  """
  step = mtf.optimize.get_global_step()
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  variables = [mtf.get_variable(mesh, name, shape, dtype=dtype, initializer=value)
               for name, shape, value in var_specs]
  grads = [mtf.import_tf_tensor(mesh, tf.TensorSpec(v.shape.to_integer_list), v.shape,
                                name="grad_%d" % i) for i, v in enumerate(variables)]
  fed = list(grads)
  if any(g is None for g in grads_per_step[0]):
    fed = [None if g is None else x for g, x in zip(grads_per_step[0], grads)]
  ops = make_optimizer().apply_grads(fed, variables)
  for step_grads in grads_per_step:
    feeds = {x: g for x, g in zip(grads, step_grads) if g is not None}
    lowering = mtf.Lowering(graph, {mesh: impl}, feeds=feeds)
    for op in ops:
      lowering.lowered_operation(op)
    step.assign_add(1)
  values = {v.name: impl.variable_store[v.name].read_full().numpy()
            for v in graph.all_variables}
  return values, graph.all_variables, ops


def rms(x):
  return tf.sqrt(tf.reduce_mean(tf.square(x)))


def adafactor_reference(w, grads, factored_axes=None, beta1=0.0, clip=1.0, eps1=1e-30,
                        eps2=1e-3, param_scale=True, learning_rate=None):
  """Adafactor written in TF on whole tensors (defaults of the paper's Transformer).

  factored_axes: (row_axis, col_axis) = (axis of the largest dim, of the second
  largest), or None for a full second-moment slot. Returns (w, slots dict).
  """
  w = tf.constant(w)
  keep = dict(keepdims=True)
  state = {}
  m = tf.zeros_like(w)
  for t, g in enumerate(grads):
    g = tf.constant(g)
    decay = 1.0 - (t + 1.0) ** -0.8
    lr = min((t + 1.0) ** -0.5, 0.01) if learning_rate is None else learning_rate
    g2 = tf.square(g) + eps1
    if factored_axes:
      a0, a1 = factored_axes
      state["vr"] = decay * state.get("vr", 0.0) + (1 - decay) * tf.reduce_mean(
          g2, axis=a0, **keep)
      state["vc"] = decay * state.get("vc", 0.0) + (1 - decay) * tf.reduce_mean(
          g2, axis=a1, **keep)
      r = state["vr"] / tf.reduce_mean(state["vr"], axis=a1, **keep)
      x = g * tf.math.rsqrt(r) * tf.math.rsqrt(state["vc"])
    else:
      state["v"] = decay * state.get("v", 0.0) + (1 - decay) * g2
      x = g * tf.math.rsqrt(state["v"])
    if clip is not None:
      x = x / tf.maximum(1.0, rms(x) / clip)
    scale = tf.maximum(rms(w), eps2) * lr if param_scale else lr
    step = x * scale
    if beta1:
      m = beta1 * m + (1 - beta1) * step
      step = m
      state["m"] = m
    w = w - step
  if factored_axes:
    state["vr"] = tf.squeeze(state["vr"], axis=factored_axes[0])
    state["vc"] = tf.squeeze(state["vc"], axis=factored_axes[1])
  return w.numpy(), {k: v.numpy() for k, v in state.items()}
