"""Within one traced step the SIMD emulation traces a slice function once per distinct
(code, closure values, slice dtypes and shapes) and replays that trace for later calls
(backends/slice_fn_key.py); calls that differ in any of those, or whose trace has a
random op, are traced again."""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.backends import simd_vectorize, slice_fn_key

SHAPE = mtf.convert_to_shape("batch:4;hidden:6")
FULL = np.arange(24, dtype=np.float32).reshape(4, 6) / 10.0


def _scaled(factor, axes):
  return lambda t: tf.reduce_sum(t * factor, axis=axes)


def _uses_size_of(shape):
  return lambda s: s + 0 * len(shape.dims)


def _key(fn, *args):
  return slice_fn_key.call_key(fn, args, set(range(len(args))), 1)


def test_closures_of_one_code_share_a_key_only_with_equal_values():
  t = tf.zeros([2, 4, 6])
  assert _key(_scaled(2.0, [1]), t) == _key(_scaled(2.0, [1]), t)
  assert _key(_scaled(2.0, [1]), t) != _key(_scaled(3.0, [1]), t)
  assert _key(_scaled(2.0, [1]), t) != _key(_scaled(2.0, [0]), t)
  assert _key(_scaled(2.0, [1]), t) != _key(_scaled(2.0, (1,)), t)  # list vs tuple
  assert _key(_scaled(0.0, [1]), t) != _key(_scaled(-0.0, [1]), t)  # signs of zero
  assert _key(_scaled(1, [1]), t) != _key(_scaled(True, [1]), t)
  # the leading (mesh) axes do not count; the slice's shape and dtype do
  assert _key(_scaled(2.0, [1]), t) == _key(_scaled(2.0, [1]), tf.zeros([8, 4, 6]))
  assert _key(_scaled(2.0, [1]), t) != _key(_scaled(2.0, [1]), tf.zeros([2, 4, 7]))
  assert _key(_scaled(2.0, [1]), t) != _key(_scaled(2.0, [1]), tf.zeros([2, 4, 6],
                                                                         tf.float64))
  # mtf shapes compare by value; other objects and tensors by identity
  a, b = mtf.convert_to_shape("x:2;y:3"), mtf.convert_to_shape("x:2;y:3")
  assert _key(_uses_size_of(a), t) == _key(_uses_size_of(b), t)
  assert _key(_uses_size_of(a), t) != _key(_uses_size_of(mtf.convert_to_shape("x:2")), t)
  captures = lambda o: (lambda s: (o, s)[1])
  assert _key(captures(object()), t) != _key(captures(object()), t)
  c1, c2 = tf.constant(1.0), tf.constant(1.0)
  assert _key(captures(c1), t) != _key(captures(c2), t)
  assert _key(captures(c1), t) == _key(captures(c1), t)
  # a closure over a dict has no value key: the function stands only for itself
  d = {"k": 1}
  reads = lambda: (lambda s: s * d["k"])
  f = reads()
  assert _key(f, t) == _key(f, t) and _key(f, t) != _key(reads(), t)


def _applies(tf_fn):
  return lambda s: tf_fn(s, s)


def test_a_module_level_function_in_a_closure_is_keyed_by_identity():
  """tf.math.multiply and its dispatch wrappers exist once: the function itself is the
  key (equal for equal closures over it, different for another function), without
  looking through its own closure."""
  t = tf.zeros([2, 4, 6])
  assert _key(_applies(tf.math.multiply), t) == _key(_applies(tf.math.multiply), t)
  assert _key(_applies(tf.math.multiply), t) != _key(_applies(tf.math.add), t)
  parts = slice_fn_key.function_key(_applies(tf.math.multiply))[2]
  assert parts[0] == slice_fn_key._Identity(tf.math.multiply)  # pylint: disable=protected-access
  # a function made in a local scope is still looked through
  assert _key(_applies(_scaled(2.0, [1])), t) == _key(_applies(_scaled(2.0, [1])), t)
  assert _key(_applies(_scaled(2.0, [1])), t) != _key(_applies(_scaled(3.0, [1])), t)


def _simd_import(impl, x):
  return impl.import_tf_tensor(mtf.import_tf_tensor(mtf.Mesh(mtf.Graph(), "m"), FULL, SHAPE),
                               x)


def test_equal_calls_reuse_one_trace_and_compute_the_same_as_placement():
  simd = mtf.SimdMeshImpl("a:4", "batch:a")
  placement = mtf.PlacementMeshImpl("a:4", "batch:a")
  factors = (2.0, 2.0, 3.0)

  @tf.function(autograph=False)  # autograph would wrap each closure anew
  def simd_step(x):
    laid = _simd_import(simd, x)
    return [simd.slicewise(_scaled(f, [1]), laid).all_slices[0] for f in factors]
  before = simd_vectorize.stats["trace_reused"]
  outs = simd_step(tf.constant(FULL))
  assert simd_vectorize.stats["trace_reused"] == before + 1  # the second 2.0
  laid = placement.LaidOutTensor(placement.make_slices(tf.constant(FULL), SHAPE))
  for got, f in zip(outs, factors):
    want = placement.slicewise(_scaled(f, [1]), laid).tensor_list
    np.testing.assert_allclose(got.numpy().reshape(-1), np.concatenate(want), rtol=1e-6)
    np.testing.assert_allclose(got.numpy().reshape(-1), (FULL * f).sum(1), rtol=1e-6)


def test_a_trace_with_a_random_op_is_not_reused():
  simd = mtf.SimdMeshImpl("a:4", "batch:a")
  noise = lambda t: t + tf.random.uniform(tf.shape(t))

  @tf.function(autograph=False)  # autograph would wrap each closure anew
  def step(x):
    laid = _simd_import(simd, x)
    return [simd.slicewise(noise, laid).all_slices[0] for _ in range(2)]
  before = simd_vectorize.stats["trace_reused"]
  first, second = step(tf.constant(np.zeros_like(FULL)))
  assert simd_vectorize.stats["trace_reused"] == before
  assert not np.allclose(first.numpy(), second.numpy())


def test_a_traced_graph_is_freed_with_its_traces():
  import gc  # pylint: disable=g-import-not-at-top
  import weakref  # pylint: disable=g-import-not-at-top
  simd = mtf.SimdMeshImpl("a:4", "batch:a")

  def trace():
    @tf.function(autograph=False)
    def step(x):
      laid = _simd_import(simd, x)
      offset = tf.reduce_sum(x)  # a tensor of this graph, captured by the closures
      return [simd.slicewise(lambda t: t + offset, laid).all_slices[0] for _ in range(2)]
    return weakref.ref(step.get_concrete_function(tf.constant(FULL)).graph)
  graph = trace()
  gc.collect()
  assert graph() is None
