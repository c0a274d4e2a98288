"""Helpers for layer tests: build a layer, lower it, read its weights back and compare
forward values and gradients (w.r.t. inputs and weights) with plain TF on one device."""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import RTOL, ATOL, assert_close, dims, new_mesh, to_numpy

# (mesh shape, layout) pairs for layers too slow for all eight conftest cases: one
# device, data+model parallel on [2,4], and model parallel on [8].
FOCUSED_CASES = [("", ""), ("rows:2;cols:4", "batch:rows;hidden:cols"),
                 ("all:8", "hidden:all")]
FOCUSED_IDS = ["single", "2x4/batch:rows;hidden:cols", "8/hidden:all"]


def _as_list(x):
  return list(x) if isinstance(x, (list, tuple)) else [x]


def variable_values(graph, mesh_impl):
  """{variable name: full numpy value} of every variable of graph on mesh_impl."""
  return {v.name: mesh_impl.variable_store[v.name].read_full().numpy()
          for v in graph.all_variables}


def check_layer(mesh_impl, inputs, build, reference, grad=True, rtol=RTOL, atol=ATOL,
                seed=4321):
  """Checks an mtf layer against a TF reference, forward and gradient.

  Args:
    mesh_impl: the MeshImpl to lower on.
    inputs: list of (numpy array, mtf shape) pairs imported with import_tf_tensor.
    build: fn(*mtf inputs) -> an mtf Tensor or list of them (creates the variables).
    reference: fn(tf inputs list, {variable name: tf.Tensor}) -> the same values.
    grad: also compare gradients w.r.t. float inputs and trainable variables.
  Returns:
    (list of mtf outputs as numpy, {variable name: numpy value}).
  """
  graph, mesh = new_mesh()
  xs = [mtf.import_tf_tensor(mesh, value, shape) for value, shape in inputs]
  ys = _as_list(build(*xs))
  trainable = list(graph.trainable_variables)
  float_xs = [i for i, x in enumerate(xs) if x.dtype.is_floating]
  float_ys = [i for i, y in enumerate(ys) if y.dtype.is_floating]
  rng = np.random.RandomState(seed)
  weights = {i: rng.normal(size=dims(ys[i].shape)).astype(np.float32) for i in float_ys}
  wrt = [xs[i] for i in float_xs] + [v.outputs[0] for v in trainable]
  mtf_grads = []
  if grad:
    mtf_grads = mtf.gradients(
        [ys[i] for i in float_ys], wrt,
        grad_ys=[mtf.import_tf_tensor(mesh, weights[i], ys[i].shape) for i in float_ys])
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  params = variable_values(graph, mesh_impl)
  got = [lowering.export_to_tf_tensor(y).numpy() for y in ys]
  got_grads = [None if g is None else lowering.export_to_tf_tensor(g).numpy()
               for g in mtf_grads]

  tf_xs = [tf.constant(value) for value, _ in inputs]
  tf_params = {name: tf.constant(value) for name, value in params.items()}
  watched = [tf_xs[i] for i in float_xs] + [tf_params[v.name] for v in trainable]
  with tf.GradientTape() as tape:
    tape.watch(watched)
    ref = _as_list(reference(tf_xs, tf_params))
    if grad:
      loss = tf.add_n([tf.reduce_sum(tf.cast(ref[i], tf.float32) * weights[i])
                       for i in float_ys])
  assert len(ref) == len(ys), "reference gave %d outputs, layer %d" % (len(ref), len(ys))
  for k, (value, r) in enumerate(zip(got, ref)):
    assert_close(value, to_numpy(r), "forward of output %d" % k, rtol=rtol, atol=atol)
  if grad:
    names = ["input %d" % i for i in float_xs] + [v.name for v in trainable]
    ref_grads = tape.gradient(loss, watched,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
    for name, g, r in zip(names, got_grads, ref_grads):
      r = to_numpy(r)
      if g is None:
        assert not np.any(r), "gradient w.r.t. %s: mtf gave None, TF nonzero" % name
        continue
      assert_close(g, r, "gradient w.r.t. %s" % name, rtol=rtol, atol=atol)
  return got, params
