"""direct_ops makes the same ops as the TF API inside a traced function, and calls the API
everywhere else (eagerly, under a tape, on Python numbers)."""
import numpy as np
import pytest
import tensorflow as tf

from mesh_tf.lowering import direct_ops

RNG = np.random.default_rng(0)
A = RNG.standard_normal((2, 3, 4)).astype(np.float32)
B = RNG.standard_normal((2, 3, 4)).astype(np.float32)
M = RNG.standard_normal((2, 4, 5)).astype(np.float32)

# (name, direct call, the TF API call it stands for, arguments)
CASES = [
    ("add", lambda a, b: direct_ops.binary(tf.add, a, b), tf.add, (A, B)),
    ("subtract", lambda a, b: direct_ops.binary(tf.subtract, a, b), tf.subtract, (A, B)),
    ("multiply", lambda a, b: direct_ops.binary(tf.multiply, a, b), tf.multiply, (A, B)),
    ("truediv", lambda a, b: direct_ops.binary(tf.math.truediv, a, b), tf.math.truediv,
     (A, B + 3.0)),
    ("maximum", lambda a, b: direct_ops.binary(tf.maximum, a, b), tf.maximum, (A, B)),
    ("less", lambda a, b: direct_ops.binary(tf.less, a, b), tf.less, (A, B)),
    ("int multiply", lambda a, b: direct_ops.binary(tf.multiply, a, b), tf.multiply,
     (np.arange(6, dtype=np.int32), np.arange(6, dtype=np.int32))),
    ("logical_and", lambda a, b: direct_ops.binary(tf.logical_and, a, b),
     tf.logical_and, (A > 0, B > 0)),
    ("broadcast", lambda a, b: direct_ops.binary(tf.add, a, b), tf.add, (A, B[:1, :, :1])),
    ("identity", direct_ops.identity, tf.identity, (A,)),
    ("reduce_sum", lambda a: direct_ops.reduce(tf.reduce_sum, a, [0, 2]),
     lambda a: tf.reduce_sum(a, axis=[0, 2]), (A,)),
    ("reduce_max", lambda a: direct_ops.reduce(tf.reduce_max, a, [1]),
     lambda a: tf.reduce_max(a, axis=[1]), (A,)),
    ("reduce_mean", lambda a: direct_ops.reduce(tf.reduce_mean, a, [2]),
     lambda a: tf.reduce_mean(a, axis=[2]), (A,)),
    ("transpose", lambda a: direct_ops.transpose(a, [2, 0, 1]),
     lambda a: tf.transpose(a, [2, 0, 1]), (A,)),
    ("reshape", lambda a: direct_ops.reshape(a, [6, -1]),
     lambda a: tf.reshape(a, [6, -1]), (A,)),
    ("einsum", lambda a, m: direct_ops.einsum("bij,bjk->bki", a, m),
     lambda a, m: tf.einsum("bij,bjk->bki", a, m), (A, M)),
    ("unary einsum", lambda a: direct_ops.einsum("bij->ji", a),
     lambda a: tf.einsum("bij->ji", a), (A,)),
    ("batch matmul", lambda a, b: direct_ops.matmul(a, b, adjoint_b=True),
     lambda a, b: tf.linalg.matmul(a, b, adjoint_b=True), (A, B)),
    ("matmul", lambda a, b: direct_ops.matmul(a, b, adjoint_a=True),
     lambda a, b: tf.linalg.matmul(a, b, adjoint_a=True), (A[0], B[0])),
    ("add_n", lambda a, b: direct_ops.add_n([a, b, a]), lambda a, b: tf.math.add_n([a, b, a]),
     (A, B)),
]


def _op_types(fn, args):
  graph = tf.function(fn, autograph=False).get_concrete_function(
      *[tf.TensorSpec(np.shape(a), tf.as_dtype(np.asarray(a).dtype)) for a in args]).graph
  return sorted(op.type for op in graph.get_operations() if op.type != "Placeholder")


@pytest.fixture(name="made_directly")
def _made_directly(monkeypatch):
  """A list of the op types direct_ops made itself (not through the TF API)."""
  made, make = [], direct_ops._make  # pylint: disable=protected-access

  def counting(graph, op_type, *rest):
    made.append(op_type)
    return make(graph, op_type, *rest)
  monkeypatch.setattr(direct_ops, "_make", counting)
  return made


@pytest.mark.parametrize("name,direct,api,args", CASES, ids=[c[0] for c in CASES])
def test_traced_ops_and_values_are_the_apis(name, direct, api, args, made_directly):
  del name
  want_types = _op_types(api, args)
  assert not made_directly
  assert _op_types(direct, args) == want_types
  assert made_directly and set(made_directly) <= set(want_types), made_directly
  tensors = [tf.constant(a) for a in args]
  want = api(*tensors).numpy()
  # a graph may evaluate in another order than eager ops (last-bit differences)
  np.testing.assert_allclose(tf.function(direct)(*tensors).numpy(), want, rtol=1e-6)
  del made_directly[:]
  np.testing.assert_array_equal(direct(*tensors).numpy(), want)  # eagerly: the API
  assert not made_directly


def test_ops_are_made_directly_only_in_a_graph_no_tape_watches():
  x = tf.constant(A)
  assert direct_ops.graph_for(x) is None  # eager

  @tf.function
  def traced(x):
    assert direct_ops.graph_for(x) is tf.compat.v1.get_default_graph()
    assert direct_ops.graph_for(x, tf.constant(1.0)) is not None
    with tf.GradientTape() as tape:
      tape.watch(x)
      assert direct_ops.graph_for(x) is None
      y = direct_ops.binary(tf.multiply, x, x)
    return tape.gradient(y, x)
  # the tape recorded the API's op: its gradient is 2x
  np.testing.assert_allclose(traced(x).numpy(), 2 * A, rtol=1e-6)


def test_python_numbers_and_mixed_dtypes_go_through_the_api():
  @tf.function
  def traced(x):
    return (direct_ops.binary(tf.multiply, x, 2.0),
            direct_ops.binary(tf.add, tf.cast(x, tf.int32), tf.constant(1)))
  doubled, plus_one = traced(tf.constant(A))
  np.testing.assert_allclose(doubled.numpy(), 2 * A)
  np.testing.assert_array_equal(plus_one.numpy(), A.astype(np.int32) + 1)


def test_a_shape_mismatch_fails_when_traced_as_the_api_does():
  @tf.function
  def traced(x, y):
    return direct_ops.binary(tf.add, x, y)
  with pytest.raises(ValueError, match="Dimensions must be equal|Incompatible shapes"):
    traced.get_concrete_function(tf.TensorSpec([2, 3]), tf.TensorSpec([4]))


def test_variable_reads_and_writes(made_directly):
  v = tf.Variable(np.ones((2, 3), np.float32))

  @tf.function
  def step(delta):
    before = direct_ops.read_variable(v)
    with tf.control_dependencies([before]):
      write = direct_ops.write_variable("assign_sub", v, delta)
    with tf.control_dependencies([write]):
      after = direct_ops.read_variable(v)
    with tf.control_dependencies([after]):
      direct_ops.write_variable("assign_add", v, delta * 3.0)
    return before, after
  delta = tf.constant(np.full((2, 3), 0.5, np.float32))
  before, after = step(delta)
  np.testing.assert_allclose(before.numpy(), 1.0)
  np.testing.assert_allclose(after.numpy(), 0.5)
  np.testing.assert_allclose(v.numpy(), 2.0)
  concrete = step.get_concrete_function(delta)
  assert any(w is v for w in concrete.variables)  # the reads watched it
  types = [op.type for op in concrete.graph.get_operations()]
  assert types.count("ReadVariableOp") == 2 and "AssignSubVariableOp" in types
  assert made_directly.count("ReadVariableOp") == 2, made_directly
  assert {"AssignSubVariableOp", "AssignAddVariableOp"} <= set(made_directly)

  @tf.function
  def assign(value):
    direct_ops.write_variable("assign", v, value)
  assign(tf.zeros([2, 3]))
  np.testing.assert_allclose(v.numpy(), 0.0)


def test_a_read_is_placed_as_the_apis_outside_the_callers_device_scope():
  v = tf.Variable(np.ones((2, 3), np.float32))

  @tf.function
  def reads():
    with tf.device("/cpu:1"):
      return direct_ops.read_variable(v), v.value()
  direct, api = [op for op in reads.get_concrete_function().graph.get_operations()
                 if op.type == "ReadVariableOp"]
  assert direct.device == api.device, (direct.device, api.device)


def test_a_write_of_the_wrong_shape_or_dtype_gets_the_apis_error():
  v = tf.Variable(np.ones((2, 3), np.float32), name="weights")

  @tf.function
  def wrong_shape(value):
    direct_ops.write_variable("assign", v, value)
  with pytest.raises(ValueError, match="Shape mismatch"):
    wrong_shape.get_concrete_function(tf.TensorSpec([3, 2]))

  @tf.function
  def wrong_dtype(value):
    direct_ops.write_variable("assign_add", v, value)
  with pytest.raises((TypeError, ValueError)):
    wrong_dtype.get_concrete_function(tf.TensorSpec([2, 3], tf.int32))


@pytest.mark.parametrize("value", [np.arange(6, dtype=np.int32).reshape(2, 3),
                                   np.linspace(0, 1, 4).astype(np.float32),
                                   np.array([True, False])], ids=["int32", "float32", "bool"])
def test_numpy_constants(value, made_directly):
  traced = tf.function(lambda: direct_ops.constant(value))
  got = traced()
  assert made_directly == ["Const"]
  assert got.dtype == tf.as_dtype(value.dtype)
  np.testing.assert_array_equal(got.numpy(), value)


def test_like_remakes_an_op_with_other_inputs_and_attrs(made_directly):
  @tf.function
  def traced(x, y):
    summed = tf.reduce_sum(x, axis=1, keepdims=True)  # a Sum op to copy
    op = summed.op
    del made_directly[:]
    again = direct_ops.like(op, {"input": y, "reduction_indices": np.array([0], np.int32)},
                            {"keep_dims": False})
    assert made_directly == ["Const", "Sum"], made_directly
    # inputs whose dtypes would change the op's types: not made here
    assert direct_ops.like(op, {"input": tf.cast(y, tf.float64),
                                "reduction_indices": np.array([0], np.int32)}, {}) is None
    # a Python number is not a tensor of this graph
    assert direct_ops.like(op, {"input": y, "reduction_indices": 0}, {}) is None
    cast = tf.cast(x, tf.float64).op  # DstT is a type attr: changing it changes outputs
    assert direct_ops.like(cast, {"x": x}, {"DstT": tf.int32}) is None
    return again[0]
  x, y = tf.constant(A[0]), tf.constant(B[0])
  np.testing.assert_allclose(traced(x, y).numpy(), B[0].sum(0), rtol=1e-6)
