"""Elementwise ops (mesh_tf/ops/elementwise.py) against plain TF, on every mesh/layout."""
import math

import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import (BATCH, CLASSES, HIDDEN, LENGTH, away_from_zero, check_against_tf,
                         random_array, random_ints)

X_SHAPE = [BATCH, LENGTH, HIDDEN]


def _tf_gelu(t):
  return 0.5 * t * (1.0 + tf.tanh(math.sqrt(2.0 / math.pi) * (t + 0.044715 * t ** 3)))


# (name, mtf fn, tf fn, input kind): "any" in [-2, 2), "positive" in [0.5, 2),
# "nonzero" with |x| >= 0.1 (for kinks at 0).
SMOOTH_UNARY = [
    ("identity", mtf.identity, tf.identity, "any"),
    ("negative", mtf.negative, tf.negative, "any"),
    ("exp", mtf.exp, tf.exp, "any"),
    ("log", mtf.log, tf.math.log, "positive"),
    ("sqrt", mtf.sqrt, tf.sqrt, "positive"),
    ("rsqrt", mtf.rsqrt, tf.math.rsqrt, "positive"),
    ("square", mtf.square, tf.square, "any"),
    ("reciprocal", mtf.reciprocal, tf.math.reciprocal, "positive"),
    ("sigmoid", mtf.sigmoid, tf.sigmoid, "any"),
    ("tanh", mtf.tanh, tf.tanh, "any"),
    ("sin", mtf.sin, tf.sin, "any"),
    ("cos", mtf.cos, tf.cos, "any"),
    ("abs", mtf.abs, tf.abs, "nonzero"),
    ("mtf_abs", mtf.mtf_abs, tf.abs, "nonzero"),
    ("relu", mtf.relu, tf.nn.relu, "nonzero"),
    ("squared_relu", mtf.squared_relu, lambda t: tf.square(tf.nn.relu(t)), "nonzero"),
    ("softplus", mtf.softplus, tf.nn.softplus, "any"),
    ("elu", mtf.elu, tf.nn.elu, "nonzero"),
    ("selu", mtf.selu, tf.nn.selu, "nonzero"),
    ("swish", mtf.swish, lambda t: t * tf.sigmoid(t), "any"),
    ("gelu", mtf.gelu, _tf_gelu, "any"),
    ("log1p", mtf.log1p, tf.math.log1p, "positive"),
    ("expm1", mtf.expm1, tf.math.expm1, "any"),
    ("leaky_relu", mtf.leaky_relu, lambda t: tf.nn.leaky_relu(t, 0.2), "nonzero"),
    ("leaky_relu_0.1", lambda x: mtf.leaky_relu(x, alpha=0.1),
     lambda t: tf.nn.leaky_relu(t, 0.1), "nonzero"),
]


def _unary_input(kind, seed):
  if kind == "positive":
    return random_array(X_SHAPE, seed, 0.5, 2.0)
  if kind == "nonzero":
    return away_from_zero(X_SHAPE, seed)
  return random_array(X_SHAPE, seed)


def test_smooth_unary_ops(mesh_impl):
  names = [row[0] for row in SMOOTH_UNARY]
  inputs = [(_unary_input(row[3], seed), X_SHAPE) for seed, row in enumerate(SMOOTH_UNARY)]
  check_against_tf(
      mesh_impl, inputs,
      lambda *xs: [row[1](x) for row, x in zip(SMOOTH_UNARY, xs)],
      lambda *ts: [row[2](t) for row, t in zip(SMOOTH_UNARY, ts)],
      labels=names, input_labels=names)


def test_piecewise_constant_unary_ops_forward(mesh_impl):
  # Values of x.5 would make round() ambiguous, so use quarter steps offset by 0.1.
  x = (random_ints(X_SHAPE, 0, -12, 12) * 0.25 + 0.1).astype(np.float32)
  ops = [(mtf.sign, tf.sign), (mtf.floor, tf.floor), (mtf.ceil, tf.math.ceil),
         (mtf.round, tf.round)]
  got, grads = check_against_tf(
      mesh_impl, [(x, X_SHAPE)], lambda a: [f(a) for f, _ in ops],
      lambda t: [f(t) for _, f in ops], grad=False,
      labels=["sign", "floor", "ceil", "round"])
  assert not grads


def test_piecewise_constant_unary_ops_have_no_gradient():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  for fn in (mtf.sign, mtf.floor, mtf.ceil, mtf.round):
    assert mtf.gradients([mtf.reduce_sum(fn(x))], [x]) == [None]


def test_cast(mesh_impl):
  x = random_array(X_SHAPE, 1, -5.0, 5.0)
  n = random_ints(X_SHAPE, 2, -5, 5)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (n, X_SHAPE)],
      lambda a, b: [mtf.cast(a, tf.int32), mtf.to_int32(a), mtf.cast(a, tf.float64),
                    mtf.cast(mtf.to_bfloat16(a), tf.float32), mtf.to_float(b),
                    mtf.cast(b, tf.bool), mtf.cast(a, tf.float32)],
      lambda a, b: [tf.cast(a, tf.int32), tf.cast(a, tf.int32), tf.cast(a, tf.float64),
                    tf.cast(tf.cast(a, tf.bfloat16), tf.float32), tf.cast(b, tf.float32),
                    tf.cast(b, tf.bool), a],
      labels=["cast_int32", "to_int32", "cast_float64", "via_bfloat16", "to_float",
              "cast_bool", "cast_same"],
      input_labels=["float x", "int x"])


# ---------------------------------------------------------------------- binary ops
DIFFERENTIABLE_BINARY = [
    ("add", mtf.add, tf.add),
    ("sub", mtf.sub, tf.subtract),
    ("multiply", mtf.multiply, tf.multiply),
    ("divide", mtf.divide, tf.math.truediv),
    ("minimum", mtf.minimum, tf.minimum),
    ("maximum", mtf.maximum, tf.maximum),
    ("pow", mtf.pow, tf.pow),
    ("mtf_pow", mtf.mtf_pow, tf.pow),
]


def _binary_inputs(n_ops, b_shape):
  """Pairs of positive inputs (so divide and pow are smooth), one pair per op."""
  inputs = []
  for k in range(n_ops):
    inputs.append((random_array(X_SHAPE, 2 * k, 0.5, 2.0), X_SHAPE))
    inputs.append((random_array(b_shape, 2 * k + 1, 0.5, 2.0), b_shape))
  return inputs


def _check_binary(mesh_impl, b_shape, tf_b):
  """Every differentiable binary op with a [batch, length, hidden] first input."""
  names = [row[0] for row in DIFFERENTIABLE_BINARY]
  check_against_tf(
      mesh_impl, _binary_inputs(len(names), b_shape),
      lambda *xs: [row[1](xs[2 * k], xs[2 * k + 1])
                   for k, row in enumerate(DIFFERENTIABLE_BINARY)],
      lambda *ts: [row[2](ts[2 * k], tf_b(ts[2 * k + 1]))
                   for k, row in enumerate(DIFFERENTIABLE_BINARY)],
      labels=names, input_labels=[n + s for n in names for s in ("/x1", "/x2")])


def test_binary_ops_same_shape(mesh_impl):
  _check_binary(mesh_impl, X_SHAPE, lambda t: t)


def test_binary_ops_broadcast_reordered_dims(mesh_impl):
  # x2 is [hidden, batch]: broadcast by name against [batch, length, hidden].
  _check_binary(mesh_impl, [HIDDEN, BATCH],
                lambda t: tf.expand_dims(tf.transpose(t), 1))


def test_binary_ops_broadcast_subset_dims(mesh_impl):
  # x2 is [hidden] only.
  _check_binary(mesh_impl, [HIDDEN], lambda t: t)


def test_broadcast_to_union_of_dims(mesh_impl):
  # Neither input's dims contain the other's: the output is their union, in order of
  # first appearance ([batch, hidden, length]).
  a_shape, b_shape = [BATCH, HIDDEN], [LENGTH, HIDDEN]
  got, _ = check_against_tf(
      mesh_impl, [(random_array(a_shape, 0), a_shape), (random_array(b_shape, 1), b_shape)],
      lambda a, b: [a * b, a - b, mtf.add(a, b, output_shape=[LENGTH, HIDDEN, BATCH]),
                    mtf.multiply(a, b, output_shape=[CLASSES, HIDDEN, LENGTH, BATCH])],
      lambda a, b: [a[:, :, None] * tf.transpose(b)[None],
                    a[:, :, None] - tf.transpose(b)[None],
                    tf.transpose(a)[None] + b[:, :, None],
                    tf.broadcast_to(tf.einsum("bh,lh->hlb", a, b), [4, 8, 3, 8])],
      labels=["multiply", "sub", "add with output_shape",
              "multiply with output_shape adding a dim"])
  assert got[0].shape == (8, 8, 3)


def test_python_scalar_operands(mesh_impl):
  x = random_array(X_SHAPE, 3, 0.5, 2.0)
  ops = [
      ("x + 1.5", lambda a: a + 1.5, lambda t: t + 1.5),
      ("1.5 + x", lambda a: 1.5 + a, lambda t: 1.5 + t),
      ("x - 0.25", lambda a: a - 0.25, lambda t: t - 0.25),
      ("3 - x", lambda a: 3.0 - a, lambda t: 3.0 - t),
      ("x * 2", lambda a: a * 2.0, lambda t: t * 2.0),
      ("2 * x", lambda a: 2.0 * a, lambda t: 2.0 * t),
      ("x / 4", lambda a: a / 4.0, lambda t: t / 4.0),
      ("4 / x", lambda a: 4.0 / a, lambda t: 4.0 / t),
      ("x ** 3", lambda a: a ** 3.0, lambda t: t ** 3.0),
      ("x ** 0.5", lambda a: a ** 0.5, lambda t: t ** 0.5),
      ("2 ** x", lambda a: 2.0 ** a, lambda t: 2.0 ** t),
      ("-x", lambda a: -a, lambda t: -t),
      ("abs(-x)", lambda a: abs(-a), lambda t: tf.abs(-t)),
      ("minimum(x, 1)", lambda a: mtf.minimum(a, 1.0), lambda t: tf.minimum(t, 1.0)),
      ("maximum(1, x)", lambda a: mtf.maximum(1.0, a), lambda t: tf.maximum(1.0, t)),
  ]
  names = [o[0] for o in ops]
  check_against_tf(
      mesh_impl, [(x, X_SHAPE)] * len(ops),
      lambda *xs: [o[1](a) for o, a in zip(ops, xs)],
      lambda *ts: [o[2](t) for o, t in zip(ops, ts)],
      labels=names, input_labels=names)


def test_floordiv_and_mod_forward(mesh_impl):
  a = random_ints(X_SHAPE, 4, -20, 20)
  b = random_ints([HIDDEN], 5, 1, 6)
  fa = random_array(X_SHAPE, 6, -5.0, 5.0)
  fb = random_array([HIDDEN, BATCH], 7, 0.5, 2.0)
  check_against_tf(
      mesh_impl, [(a, X_SHAPE), (b, [HIDDEN]), (fa, X_SHAPE), (fb, [HIDDEN, BATCH])],
      lambda a, b, fa, fb: [mtf.floordiv(a, b), mtf.mod(a, b), a // 3, a % 4, 7 // b,
                            17 % b, mtf.floordiv(fa, fb), mtf.mod(fa, fb)],
      lambda a, b, fa, fb: [
          tf.math.floordiv(a, b), tf.math.floormod(a, b), a // 3, a % 4, 7 // b, 17 % b,
          tf.math.floordiv(fa, tf.transpose(fb)[:, None]),
          tf.math.floormod(fa, tf.transpose(fb)[:, None])],
      grad=False,
      labels=["floordiv", "mod", "x // 3", "x % 4", "7 // b", "17 % b", "float floordiv",
              "float mod"])


def test_comparisons(mesh_impl):
  # Small integer values, so that ties (equal elements) occur often.
  a = random_ints(X_SHAPE, 8, 0, 3).astype(np.float32)
  b = random_ints([HIDDEN, BATCH], 9, 0, 3).astype(np.float32)
  bt = lambda t: tf.transpose(t)[:, None]
  ops = [("less", mtf.less, tf.less), ("greater", mtf.greater, tf.greater),
         ("less_equal", mtf.less_equal, tf.less_equal),
         ("greater_equal", mtf.greater_equal, tf.greater_equal),
         ("equal", mtf.equal, tf.equal), ("not_equal", mtf.not_equal, tf.not_equal)]
  got, _ = check_against_tf(
      mesh_impl, [(a, X_SHAPE), (b, [HIDDEN, BATCH])],
      lambda x, y: [f(x, y) for _, f, _ in ops] + [mtf.greater(x, 1.0),
                                                    mtf.equal(x, 2.0)],
      lambda x, y: [f(x, bt(y)) for _, _, f in ops] + [x > 1.0, tf.equal(x, 2.0)],
      labels=[o[0] for o in ops] + ["greater than scalar", "equal to scalar"])
  assert got[0].dtype == np.bool_
  assert got[4].any() and not got[4].all()


def test_logical_ops(mesh_impl):
  a = random_ints(X_SHAPE, 10, 0, 2).astype(bool)
  b = random_ints([HIDDEN], 11, 0, 2).astype(bool)
  check_against_tf(
      mesh_impl, [(a, X_SHAPE), (b, [HIDDEN])],
      lambda x, y: [mtf.logical_not(x), mtf.logical_and(x, y), mtf.logical_or(x, y),
                    mtf.logical_not(y)],
      lambda x, y: [tf.logical_not(x), tf.logical_and(x, y), tf.logical_or(x, y),
                    tf.logical_not(y)],
      labels=["logical_not", "logical_and", "logical_or", "logical_not of [hidden]"])


def test_where(mesh_impl):
  cond = random_ints([BATCH, HIDDEN], 12, 0, 2).astype(bool)
  a = random_array(X_SHAPE, 13)
  b = random_array([HIDDEN], 14)
  c = random_array([LENGTH, BATCH], 15)
  # where(cond, x, ...) is [batch, length, hidden] (the shape of x contains the others);
  # with [hidden] and [length, batch] it is the union [batch, hidden, length].
  bhl = lambda t: tf.broadcast_to(t, [8, 8, 3])
  check_against_tf(
      mesh_impl, [(cond, [BATCH, HIDDEN]), (a, X_SHAPE), (b, [HIDDEN]),
                  (c, [LENGTH, BATCH])],
      lambda k, x, y, z: [mtf.where(k, x, y), mtf.where(k, y, z),
                          mtf.where(k, x, 0.5), mtf.where(k, -1.0, z)],
      lambda k, x, y, z: [
          tf.where(k[:, None, :], x, tf.broadcast_to(y, [8, 3, 8])),
          tf.where(bhl(k[:, :, None]), bhl(y[None, :, None]),
                   bhl(tf.transpose(z)[:, None, :])),
          tf.where(tf.broadcast_to(k[:, None, :], [8, 3, 8]), x, 0.5),
          tf.where(bhl(k[:, :, None]), -1.0, bhl(tf.transpose(z)[:, None, :]))],
      labels=["where(c, x, [hidden])", "where(c, [hidden], [length, batch])",
              "where(c, x, 0.5)", "where(c, -1, [length, batch])"],
      input_labels=["cond", "x", "[hidden]", "[length, batch]"])


def test_add_n_and_ones_zeros_like(mesh_impl):
  a, b, c = (random_array(s, i) for i, s in enumerate([X_SHAPE, [HIDDEN], [BATCH]]))
  check_against_tf(
      mesh_impl, [(a, X_SHAPE), (b, [HIDDEN]), (c, [BATCH])],
      lambda x, y, z: [mtf.add_n([x, y, z]), mtf.ones_like(x), mtf.zeros_like(y)],
      lambda x, y, z: [x + y + z[:, None, None], tf.ones_like(x), tf.zeros_like(y)],
      labels=["add_n", "ones_like", "zeros_like"])


def test_binary_op_with_broadcasting_forward(mesh_impl):
  # A user-supplied TF function broadcast by name; it has no gradient.
  y, z = random_array([HIDDEN], 3), random_array([BATCH], 4)
  check_against_tf(
      mesh_impl, [(z, [BATCH]), (y, [HIDDEN])],
      lambda a, b: [mtf.binary_op_with_broadcasting(tf.math.squared_difference, a, b),
                    mtf.binary_op_with_broadcasting(tf.math.squared_difference, a, 0.5)],
      lambda a, b: [tf.math.squared_difference(a[:, None], b),
                    tf.math.squared_difference(a, 0.5)], grad=False)
