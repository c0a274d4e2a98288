"""Helpers for op tests: build a small graph, lower it on a mesh, compare with plain TF.

The reference for every op is the same computation written with TF ops on one device.
Gradients are those of sum_i reduce_sum(y_i * w_i) for fixed random weights w_i: taken with
tf.GradientTape on the TF side, and on the mtf side with mtf.gradients(ys, xs, grad_ys=w),
which is the same vector-Jacobian product without building the loss ops.
"""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf

RTOL = 1e-5
ATOL = 1e-6

# Dims every test may use. "batch" and "hidden" are split by some cases of the mesh/layout
# table in conftest.py; "length" and "classes" never are.
BATCH = mtf.Dimension("batch", 8)
HIDDEN = mtf.Dimension("hidden", 8)
LENGTH = mtf.Dimension("length", 3)
CLASSES = mtf.Dimension("classes", 4)


def backend_mesh_impl(backend, mesh_shape, layout):
  """A fresh MeshImpl of backend ("placement", "simd", "gspmd") on the first virtual CPUs."""
  n = mtf.convert_to_shape(mesh_shape).size
  return mtf.make_mesh_impl(backend, mesh_shape, layout,
                            ["/cpu:%d" % i for i in range(n)] if n > 1 else [""])


def traced_train_step(model, impl, feeds):
  """(graph, Lowering) of the train step of model (models/train_steps' protocol) traced
  once in a tf.function on impl with feeds; the variables are made eagerly first."""
  from models import train_steps  # pylint: disable=g-import-not-at-top
  lowerings = []

  @tf.function
  def step(*args):
    lowerings.append(model.lowering(impl, *args))
    return train_steps.lower_train_step(lowerings[-1], model.loss, model.update_ops)
  model.lowering(impl)
  return step.get_concrete_function(*feeds).graph, lowerings[-1]


def batch_to_import():
  """(an [8, 8] int batch, its mtf Shape batch x length, a stand-in mtf Tensor of that
  shape named "inputs"): what the process-share import tests feed import_tf_tensor."""
  shape = mtf.Shape([mtf.Dimension("batch", 8), mtf.Dimension("length", 8)])
  holder = type("T", (), {"shape": shape, "name": "inputs"})()
  return tf.reshape(tf.range(64), [8, 8]), shape, holder


def counts_added(counter, run):
  """{key: how much run() added to collections.Counter counter}, nonzero ones only."""
  before = dict(counter)
  run()
  return {k: v - before.get(k, 0) for k, v in counter.items() if v != before.get(k, 0)}


def new_mesh():
  """A fresh (graph, mesh) pair."""
  graph = mtf.Graph()
  return graph, mtf.Mesh(graph, "m")


def dims(shape):
  """Integer sizes of a Shape, a list of Dimensions or a shape string."""
  return mtf.convert_to_shape(shape).to_integer_list


def random_array(shape, seed, low=-2.0, high=2.0, dtype=np.float32):
  """Uniform values in [low, high) of an mtf shape, reproducible from seed."""
  rng = np.random.RandomState(seed)
  return rng.uniform(low, high, size=dims(shape)).astype(dtype)


def away_from_zero(shape, seed, low=0.1, high=2.0):
  """Values with low <= |x| < high and random signs (safe for abs, relu, sign)."""
  rng = np.random.RandomState(seed)
  size = dims(shape)
  mag = rng.uniform(low, high, size=size)
  return (mag * rng.choice([-1.0, 1.0], size=size)).astype(np.float32)


def random_ints(shape, seed, low, high, dtype=np.int32):
  """Integers in [low, high) of an mtf shape."""
  return np.random.RandomState(seed).randint(low, high, size=dims(shape)).astype(dtype)


def lower_and_export(graph, mesh, impl, tensors):
  """Lowers graph eagerly on impl and returns the full numpy value of each tensor."""
  lowering = mtf.Lowering(graph, {mesh: impl})
  return [lowering.export_to_tf_tensor(t).numpy() for t in tensors]


def assert_simd_replays_like_one_device(build, simd_impls):
  """build() -> (graph, mesh, tensors), built afresh per backend. The tensors' values on
  each SIMD emulation equal one device's, and the emulation's replay needed no
  tf.vectorized_map fallback."""
  from mesh_tf.backends import simd_vectorize  # pylint: disable=g-import-not-at-top
  before = dict(simd_vectorize.stats)
  values = []
  for impl in [mtf.PlacementMeshImpl("", "", [""])] + list(simd_impls):
    graph, mesh, tensors = build()
    values.append(lower_and_export(graph, mesh, impl, tensors))
  for simd_values in values[1:]:
    for got, want in zip(simd_values, values[0]):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  fallbacks = {k: v - before.get(k, 0) for k, v in simd_vectorize.stats.items()
               if k.startswith("fallback:")}
  assert not any(fallbacks.values()), fallbacks


def assert_close(actual, expected, what, rtol=RTOL, atol=ATOL, exact=False):
  """Checks one value against its reference (shape, dtype kind and numbers)."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.shape == expected.shape, "%s: shape %s, expected %s" % (
      what, actual.shape, expected.shape)
  if exact or not np.issubdtype(expected.dtype, np.floating):
    np.testing.assert_array_equal(actual, expected, err_msg=what)
  else:
    # A split dim sums its partial results in another order; in float32 that moves each
    # element by a few ulps of the largest summand, not of the element itself, so the
    # absolute tolerance grows with the tensor's largest magnitude (8 float32 ulps).
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    atol = max(atol, 8 * np.finfo(np.float32).eps * scale)
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                               rtol=rtol, atol=atol, err_msg=what)


def to_numpy(x):
  """A numpy value of a tf.Tensor, tf.IndexedSlices (from tf.gather) or array."""
  if isinstance(x, (tf.Tensor, tf.IndexedSlices, tf.Variable)):
    return tf.convert_to_tensor(x).numpy()
  return np.asarray(x)


def _as_list(x):
  return list(x) if isinstance(x, (list, tuple)) else [x]


def _is_float(dtype):
  return tf.as_dtype(dtype).is_floating


def check_against_tf(mesh_impl, inputs, mtf_fn, tf_fn, grad=True, labels=None,
                     input_labels=None, rtol=RTOL, atol=ATOL, pass_mesh=False, seed=1234):
  """Checks mtf_fn on mesh_impl against tf_fn on one device, forward and gradient.

  Args:
    mesh_impl: the MeshImpl to lower on.
    inputs: list of (numpy array, mtf shape) pairs, imported with import_tf_tensor.
    mtf_fn: fn(*mtf Tensors) -> an mtf Tensor or a list of them.
    tf_fn: fn(*tf.Tensors) -> the same values as tf.Tensors, dims in the mtf order.
    grad: whether to compare gradients w.r.t. the float inputs too.
    rtol / atol: tolerances for outputs and gradients.
    labels / input_labels: names of the outputs / inputs for failure messages.
    pass_mesh: call mtf_fn(mesh, *xs) (for ops that create tensors from nothing).
  Returns:
    (mtf outputs, mtf gradients) as numpy arrays (gradients: None where mtf gave None).
  """
  graph, mesh = new_mesh()
  xs = [mtf.import_tf_tensor(mesh, value, shape) for value, shape in inputs]
  ys = _as_list(mtf_fn(mesh, *xs) if pass_mesh else mtf_fn(*xs))
  labels = labels or ["output %d" % i for i in range(len(ys))]
  input_labels = input_labels or ["input %d" % i for i in range(len(xs))]
  float_ys = [i for i, y in enumerate(ys) if _is_float(y.dtype)]
  float_xs = [i for i, x in enumerate(xs) if _is_float(x.dtype)]
  grad = grad and bool(float_ys) and bool(float_xs)
  rng = np.random.RandomState(seed)
  weights = {i: rng.normal(size=dims(ys[i].shape)).astype(ys[i].dtype.as_numpy_dtype)
             for i in float_ys}

  mtf_grads = []
  if grad:
    # d/dx of sum_i reduce_sum(y_i * w_i) is the vector-Jacobian product with grad_ys=w.
    mtf_grads = mtf.gradients(
        [ys[i] for i in float_ys], [xs[i] for i in float_xs],
        grad_ys=[mtf.import_tf_tensor(mesh, weights[i], ys[i].shape) for i in float_ys])
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  got = [lowering.export_to_tf_tensor(y).numpy() for y in ys]
  got_grads = [None if g is None else lowering.export_to_tf_tensor(g).numpy()
               for g in mtf_grads]

  tf_xs = [tf.constant(value) for value, _ in inputs]
  with tf.GradientTape() as tape:
    for i in float_xs:
      tape.watch(tf_xs[i])
    ref = _as_list(tf_fn(*tf_xs))
    if grad:
      ref_loss = tf.add_n([tf.cast(tf.reduce_sum(ref[i] * weights[i]), tf.float32)
                           for i in float_ys])
  assert len(ref) == len(ys), "tf_fn gave %d outputs, mtf_fn %d" % (len(ref), len(ys))
  for y, value, r, label in zip(ys, got, ref, labels):
    assert value.dtype == y.dtype.as_numpy_dtype, "%s: dtype %s, mtf says %s" % (
        label, value.dtype, y.dtype.name)
    assert_close(value, to_numpy(r), "forward of %s" % label, rtol=rtol, atol=atol)
  if grad:
    ref_grads = tape.gradient(ref_loss, [tf_xs[i] for i in float_xs],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
    for i, g, r in zip(float_xs, got_grads, ref_grads):
      what = "gradient w.r.t. %s" % input_labels[i]
      r = to_numpy(r)
      if g is None:
        assert not np.any(r), "%s: mtf gave None, TF gave nonzero values" % what
        continue
      assert_close(g, r, what, rtol=rtol, atol=atol)
  return got, got_grads
