"""Random tensors whose values do not depend on the layout.

A tensor of up to WHOLE_DRAW_ELEMENTS elements is drawn whole by TF's stateless
generator, keyed by (op seed, step counter), and cut to the layout: one op, however many
processors. A larger one is a hash of (op seed, step counter, each element's global
index), computed by every processor for its own slice. Either way any mesh gives the
same numbers without communication. The step counter (`MeshImpl.next_random_step`)
advances each time a random op runs, so a step under tf.function draws fresh noise on
every call; a while loop numbers its body's draws from it instead and advances it once,
after the loop (ops/control_flow.py).
"""
import zlib

import tensorflow as tf

from mesh_tf.errors import ShapeError
from mesh_tf.graph import Operation
from mesh_tf.ops import elementwise as ew
from mesh_tf.shapes import convert_to_shape


_M1, _M2 = 0x85EBCA6B, 0xC2B2AE35  # the murmur3 finalizer constants


def _xorshift(x, n):
  return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(n, tf.uint32)))


def _mix32(x):
  """A 32-bit avalanche mixer (murmur3's finalizer) on a uint32 tensor."""
  x = _xorshift(x, 16) * tf.constant(_M1, tf.uint32)
  x = _xorshift(x, 13) * tf.constant(_M2, tf.uint32)
  return _xorshift(x, 16)


def op_key(seed, step):
  """Two uint32 words mixing an op's seed with the run counter (computed once per op)."""
  seed_lo = tf.constant(seed & 0xFFFFFFFF, tf.uint32)
  seed_hi = tf.constant((seed >> 32) & 0xFFFFFFFF, tf.uint32)
  k1 = _mix32(tf.bitwise.bitwise_xor(seed_lo, _mix32(tf.cast(step, tf.uint32) + seed_hi)))
  return tf.stack([k1, _mix32(k1 + tf.constant(0x9E3779B9, tf.uint32))])


def _bits_to_unit(bits):
  """Uniform [0, 1) float32 from uniform uint32 bits (their top 24)."""
  return tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32)), tf.float32) * (
      1.0 / (1 << 24))


def _box_muller(u1, u2, params):
  """Normal values from two independent uniform [0, 1) streams."""
  z = tf.sqrt(-2.0 * tf.math.log(1.0 - u1)) * tf.cos(6.283185307179586 * u2)
  return params["mean"] + params["stddev"] * z


def hash_uniform(key, flat_index):
  """Uniform [0, 1) float32 from an op key and int64 global indices below 2**32."""
  h = _mix32(tf.bitwise.bitwise_xor(tf.cast(flat_index, tf.uint32), key[0]))
  return _bits_to_unit(_mix32(h + key[1]))


def global_flat_index(slice_shape, begin, full_shape):
  """int64 row-major index in the full tensor of every element of a slice."""
  strides, s = [], 1
  for n in reversed(full_shape):
    strides.insert(0, s)
    s *= n
  index = tf.zeros(slice_shape, tf.int64)
  for axis, n in enumerate(slice_shape):
    shape = [1] * len(slice_shape)
    shape[axis] = n
    pos = tf.range(n, dtype=tf.int64) + tf.cast(begin[axis], tf.int64)
    index += tf.reshape(pos * strides[axis], shape)
  return index


# Gumbel noise is -log(-log(u)) of u uniform in [GUMBEL_TINY, 1): finite at both ends.
GUMBEL_TINY = 1e-9


def _gumbel_of_uniform(u):
  return -tf.math.log(-tf.math.log(GUMBEL_TINY + u * (1.0 - GUMBEL_TINY)))


def gumbel(shape, dtype=tf.float32, seed=None):
  """Standard Gumbel noise of a full shape (TF's stateful generator); inside mesh_tf,
  random_gumbel draws the same distribution layout-independently."""
  return tf.cast(_gumbel_of_uniform(tf.random.uniform(shape, seed=seed)), dtype)


# Samplers the counter-based generator reproduces: fn -> (distribution, kwargs defaults).
_COUNTER_BASED = {
    tf.random.uniform: ("uniform", {"minval": 0.0, "maxval": 1.0}),
    tf.random.normal: ("normal", {"mean": 0.0, "stddev": 1.0}),
    tf.compat.v1.random_uniform: ("uniform", {"minval": 0.0, "maxval": 1.0}),
    tf.compat.v1.random_normal: ("normal", {"mean": 0.0, "stddev": 1.0}),
    gumbel: ("gumbel", {}),
}

# Tensors up to this many elements are drawn whole and cut (a few KB to 256 KB of
# float32, less work than a hash of every element on each processor's slice).
WHOLE_DRAW_ELEMENTS = 1 << 16


def _draw_whole(dist, params, key, full_shape):
  """float32 values of the full shape from TF's stateless Philox generator seeded by
  key: its raw uint32 bits (identical on CPU, GPU and under XLA; TF's own float and
  normal conversions are not), made floats as hash_uniform makes its hashes."""
  seed = tf.bitcast(key, tf.int32)
  shape = ([2] if dist == "normal" else []) + list(full_shape)
  bits = tf.random.stateless_uniform(shape, seed, minval=None, maxval=None,
                                     dtype=tf.uint32, alg="philox")
  u = _bits_to_unit(bits)
  if dist == "normal":
    return _box_muller(u[0], u[1], params)
  if dist == "gumbel":
    return _gumbel_of_uniform(u)
  return params["minval"] + u * (params["maxval"] - params["minval"])


def _hash_slice(dist, params, key, index):
  """float32 values of the elements at the int64 global indices index."""
  if dist == "normal":
    return _box_muller(hash_uniform(key, 2 * index), hash_uniform(key, 2 * index + 1),
                       params)
  u = hash_uniform(key, index)
  if dist == "gumbel":
    return _gumbel_of_uniform(u)
  return params["minval"] + u * (params["maxval"] - params["minval"])


class RandomOperation(Operation):
  """Random values of `shape` drawn as `tf_fn(shape, **kwargs)` would draw them.

  tf.random.uniform, tf.random.normal and `gumbel` use the layout-independent
  counter-based generators of the module docstring (kwargs: minval, maxval / mean,
  stddev, dtype, seed). Any other sampler is called on the full shape by
  `MeshImpl.random` and the result cut to the layout."""

  def __init__(self, mesh, shape, tf_fn, **kwargs):
    kwargs = dict(kwargs)
    name = kwargs.pop("name", None)
    dtype = tf.as_dtype(kwargs.get("dtype", tf.float32))
    known = _COUNTER_BASED.get(tf_fn)
    super().__init__([], mesh=mesh,
                     name=name or "random_" + (known[0] if known else "values"))
    self._tf_fn, self._kwargs = tf_fn, kwargs
    self._distribution = known[0] if known else None
    self.draws_random_steps = bool(known)  # Lowering creates the counter eagerly
    if known:
      extra = set(kwargs) - set(known[1]) - {"dtype", "seed"}
      if extra:
        raise ShapeError("random op %r: %s takes no argument(s) %s" % (
            self.name, getattr(tf_fn, "__name__", tf_fn), sorted(extra)), op=self.name)
      self._params = {k: kwargs.get(k, v) for k, v in known[1].items()}
    seed = kwargs.get("seed")
    self._seed = zlib.crc32(self.name.encode()) if seed is None else int(seed)
    self._add_output(convert_to_shape(shape), dtype)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    y = self.outputs[0]
    if self._distribution is None:
      lowering.set_tensor_lowering(y, impl.random(y.shape, self._tf_fn, self._kwargs))
      return
    sizes = impl.slice_shape(y.shape)
    full = y.shape.to_integer_list
    if 2 * y.shape.size >= 2 ** 32:
      raise ShapeError("random op %r: %s has 2**31 elements or more, beyond the index "
                       "range of the counter-based generator" % (self.name, y.shape),
                       op=self.name)
    key = op_key(self._seed, impl.next_random_step())
    dist, params = self._distribution, self._params
    if y.shape.size <= WHOLE_DRAW_ELEMENTS:
      whole = tf.cast(_draw_whole(dist, params, key, full), y.dtype)
      lowering.set_tensor_lowering(y, impl.import_tf_tensor(y, whole))
      return

    def fn(begin):
      index = global_flat_index(sizes, begin, full)
      return tf.cast(_hash_slice(dist, params, key, index), y.dtype)
    lowering.set_tensor_lowering(y, impl.slicewise(fn, impl.laid_out_slice_begin(y.shape)))


def random_uniform(mesh, shape, **kwargs):
  """Uniform random values in [minval, maxval) (kwargs of tf.random.uniform: minval=0,
  maxval=1, dtype=float32, seed, name)."""
  return RandomOperation(mesh, shape, tf.random.uniform, **kwargs).outputs[0]


def random_gumbel(mesh, shape, **kwargs):
  """Standard Gumbel noise, -log(-log(u)) of u uniform in [GUMBEL_TINY, 1) (kwargs:
  dtype, seed, name)."""
  return RandomOperation(mesh, shape, gumbel, **kwargs).outputs[0]


def random_normal(mesh, shape, **kwargs):
  """Normally distributed random values (kwargs of tf.random.normal: mean=0, stddev=1,
  dtype=float32, seed, name)."""
  return RandomOperation(mesh, shape, tf.random.normal, **kwargs).outputs[0]


def dropout(x, is_training=True, keep_prob=None, rate=None, noise_shape=None, name=None):
  """Zeroes elements with probability rate (= 1 - keep_prob) and scales the rest up.

  As in the original, `dropout(x, keep_prob)` (a float second argument) also works.
  """
  if not isinstance(is_training, bool) and isinstance(is_training, (int, float)):
    keep_prob, is_training = is_training, True
  if (keep_prob is None) == (rate is None):
    raise ShapeError("dropout of %s: give exactly one of keep_prob and rate" % x.name,
                     tensor=x.name)
  if keep_prob is None:
    keep_prob = 1.0 - rate
  if not is_training or keep_prob == 1.0:
    return x
  noise_shape = convert_to_shape(noise_shape) if noise_shape is not None else x.shape
  extra = [d for d in noise_shape.dims if d not in x.shape.dims]
  if extra:
    raise ShapeError("dropout of %s %s: noise_shape dims %s are not dims of x" % (
        x.name, x.shape, [str(d) for d in extra]), tensor=x.name)
  return ew.multiply(x, dropout_scale(x.mesh, noise_shape, keep_prob, x.dtype),
                     name=name or "dropout")


def dropout_scale(mesh, noise_shape, keep_prob, dtype):
  """What dropout multiplies by: 1 / keep_prob with probability keep_prob, else 0, drawn
  per element of noise_shape."""
  keep = ew.cast(ew.less(random_uniform(mesh, noise_shape, dtype=dtype), keep_prob), dtype)
  return keep * (1.0 / keep_prob)
