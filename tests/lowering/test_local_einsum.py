"""The local einsum (lowering/local_einsum.py) equals np.einsum on every equation shape:
the ones TF's kernel transposes slowly go through explicit transposes + one matmul, those
already in matmul order with few rows through reshapes + one matmul, the others stay one
TF einsum op, and the operand order follows the output."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.lowering import local_einsum

SIZES = {"a": 2, "b": 3, "c": 4, "d": 5, "e": 3, "x": 2, "y": 3}

# (equation, TF op types the local einsum emits besides inputs)
CASES = [
    ("abc,cde->abde", {"Reshape", "MatMul"}),  # dense layer: already matmul order
    ("abc,dc->abd", {"Reshape", "MatMul"}),  # weight stored [out, in]
    ("abcd,aecd->abce", {"Einsum"}),  # attention logits: contracted last, TF's kernel
    ("abcd,adce->abce", {"Einsum"}),  # attention output
    ("abcd,abce->aecd", {"Transpose", "BatchMatMulV2"}),  # value gradient
    ("abcd,abce->adce", {"Transpose", "BatchMatMulV2"}),  # key gradient
    ("abc,abd->dc", {"Einsum"}),  # weight gradient: operands swapped, TF's kernel
    ("acb,cdb->adc", {"Einsum"}),
    ("xab,yb->xya", {"Einsum"}),
    ("bac,bcd->dab", {"Transpose", "BatchMatMulV2"}),  # contracted first in lhs
    ("ab,ab->ba", {"Einsum"}),  # broadcasting product: not a matmul
    ("ab,cd->abcd", {"Einsum"}),  # outer product in order
    ("ab,ab->", {"Einsum"}),
    ("aab,bc->ac", {"Einsum"}),  # repeated label: left to tf.einsum
    ("abc,cd->ad", {"Einsum"}),  # b summed inside one operand
]


def _value(term, seed, dtype=np.float32):
  rng = np.random.RandomState(seed)
  return rng.randn(*[SIZES[c] for c in term]).astype(dtype)


def _emitted(equation, x, y):
  fn = tf.function(lambda a, b: local_einsum.einsum(equation, a, b))
  graph = fn.get_concrete_function(tf.constant(x), tf.constant(y)).graph
  return {op.type for op in graph.get_operations()} - {"Placeholder", "Identity", "Const"}


@pytest.mark.parametrize("equation,ops", CASES, ids=[c[0] for c in CASES])
def test_equals_numpy_with_the_expected_kernel(equation, ops):
  lhs, rhs = equation.split("->")[0].split(",")
  x, y = _value(lhs, 0), _value(rhs, 1)
  got = local_einsum.einsum(equation, tf.constant(x), tf.constant(y))
  np.testing.assert_allclose(got.numpy(), np.einsum(equation, x, y), rtol=1e-5, atol=1e-5)
  assert _emitted(equation, x, y) == ops


def test_an_einsum_in_matmul_order_with_many_rows_stays_one_einsum():
  """Past SMALL_MATMUL_ROWS rows TF's einsum kernel is as fast as MatMul, and a training
  step keeps its sums."""
  rows = local_einsum.SMALL_MATMUL_ROWS
  for lead, ops in ((rows, {"MatMul"}), (rows + 1, {"Einsum"})):
    x = np.random.RandomState(0).randn(lead, 8).astype(np.float32)
    y = np.random.RandomState(1).randn(8, 5).astype(np.float32)
    got = local_einsum.einsum("ab,bc->ac", tf.constant(x), tf.constant(y))
    np.testing.assert_allclose(got.numpy(), x @ y, rtol=1e-5, atol=1e-5)
    assert _emitted("ab,bc->ac", x, y) == ops


def test_transposes_of_size_one_dims_are_reshapes():
  """With the heads dim cut to 1 per slice, the attention logits need no data movement:
  reshapes around one batch matmul."""
  x = np.random.RandomState(0).randn(2, 3, 1, 4).astype(np.float32)
  y = np.random.RandomState(1).randn(2, 5, 1, 4).astype(np.float32)
  equation = "abcd,aecd->abce"
  got = local_einsum.einsum(equation, tf.constant(x), tf.constant(y))
  np.testing.assert_allclose(got.numpy(), np.einsum(equation, x, y), rtol=1e-5, atol=1e-6)
  assert _emitted(equation, x, y) == {"Reshape", "BatchMatMulV2"}
  # The SIMD replay decides by labels only, so it keeps the one einsum here.
  assert local_einsum.two_operand_matmul(equation, x, y) is None


def test_integer_operands_stay_one_einsum():
  x, y = _value("abcd", 0, np.int32), _value("abce", 1, np.int32)
  assert local_einsum.two_operand_matmul("abcd,abce->adce", x, y) is None
  assert local_einsum.two_operand_matmul("abcd,abce->adce", x.astype(np.float32),
                                         y.astype(np.float32)) is not None


def test_operands_follow_the_output_order():
  eq, (first, second) = local_einsum.operands_in_output_order("abc,abd->dc", ("g", "x"))
  assert (eq, first, second) == ("abd,abc->dc", "x", "g")
  assert local_einsum.operands_in_output_order("abc,cd->abd", ("x", "w")) == (
      "abc,cd->abd", ("x", "w"))


def test_attention_einsum_through_mtf_matches_numpy():
  """mtf.einsum of [batch, length, heads, d_kv] queries and keys on a split mesh uses the
  matmul path per slice and still equals numpy."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  dims = {n: mtf.Dimension(n, s) for n, s in
          [("batch", 4), ("length", 3), ("heads", 2), ("d_kv", 5), ("memory", 3)]}
  qv, kv = np.random.RandomState(2).randn(4, 3, 2, 5), np.random.RandomState(3).randn(4, 3, 2, 5)
  q = mtf.import_tf_tensor(mesh, tf.constant(qv, tf.float32),
                           [dims["batch"], dims["length"], dims["heads"], dims["d_kv"]])
  k = mtf.import_tf_tensor(mesh, tf.constant(kv, tf.float32),
                           [dims["batch"], dims["memory"], dims["heads"], dims["d_kv"]])
  logits = mtf.einsum([q, k], output_shape=[dims["batch"], dims["length"], dims["heads"],
                                           dims["memory"]])
  impl = mtf.make_mesh_impl("placement", "b:2", "batch:b", ["", ""])
  lowering = mtf.Lowering(graph, {mesh: impl})
  got = lowering.export_to_tf_tensor(logits).numpy()
  np.testing.assert_allclose(got, np.einsum("blhk,bmhk->blhm", qv, kv), rtol=1e-5,
                             atol=1e-5)


# The plain products of CASES: in bfloat16 each is a matmul, whatever its order.
BF16_MATMULS = [e for e, ops in CASES
                if e not in ("ab,ab->ba", "ab,ab->", "aab,bc->ac", "abc,cd->ad")]


@pytest.mark.parametrize("equation", BF16_MATMULS)
def test_bfloat16_products_are_matmuls(equation):
  """TF's CPU einsum kernel is ~12x slower than MatMul in bfloat16."""
  lhs, rhs = equation.split("->")[0].split(",")
  x, y = (tf.cast(_value(t, s), tf.bfloat16) for t, s in ((lhs, 0), (rhs, 1)))
  got = local_einsum.einsum(equation, x, y)
  want = np.einsum(equation, tf.cast(x, tf.float32).numpy(), tf.cast(y, tf.float32).numpy())
  np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), want, rtol=2e-2, atol=5e-2)
  emitted = _emitted(equation, x.numpy(), y.numpy())
  assert "Einsum" not in emitted
  assert emitted & {"MatMul", "BatchMatMulV2"}
