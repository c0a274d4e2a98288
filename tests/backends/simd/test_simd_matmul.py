"""The SIMD emulation's einsum-as-batch-matmul agrees with tf.einsum, and declines the
equations it cannot do without a transpose."""
import numpy as np
import pytest
import tensorflow as tf

from mesh_tf.backends import simd_matmul

MESH = frozenset("ZY")
SIZES = {"Z": 2, "Y": 3, "a": 4, "b": 5, "c": 6, "d": 7, "e": 2}

# (equation, whether the matmul form applies)
CASES = [
    ("Zabc,Ycd->ZYabd", True),  # each operand split on its own mesh axis
    ("ZYabc,Zabd->Ydc", True),  # a fused SUM over Z, output transposed (rhs^T lhs^T)
    ("ZYabc,Ydc->Zabd", True),  # SUM over Y, rhs contracted last
    ("abc,Zdc->Zabd", True),
    ("Zabc,abd->Zdc", True),  # rhs^T lhs, as mp's softmax-weight gradient
    ("ZYabcd,ZYabce->ZYaecd", False),  # contracted dim b between batch and free dims
    ("Zab,Zbc->Zac", True),  # batch on both sides
    ("Zab,Zb->Za", True),  # matrix-vector
    ("Za,Yb->ZYab", True),  # outer product (nothing contracted)
    ("ab,bc->ac", False),  # no mesh label: plain tf.einsum
    ("Zaa,Zab->Zb", False),  # repeated label
]


def _value(term, seed):
  rng = np.random.RandomState(seed)
  return rng.randn(*[SIZES[c] for c in term]).astype(np.float32)


@pytest.mark.parametrize("equation,applies", CASES, ids=[c[0] for c in CASES])
def test_matches_tf_einsum_or_declines(equation, applies):
  lhs, rhs = equation.split("->")[0].split(",")
  x, y = _value(lhs, 0), _value(rhs, 1)
  got = simd_matmul.batched_matmul(equation, x, y, MESH)
  if not applies:
    assert got is None
    return
  assert got is not None
  np.testing.assert_allclose(got.numpy(), tf.einsum(equation, x, y).numpy(),
                             rtol=1e-5, atol=1e-5)


def test_declines_integer_operands():
  x = np.ones([2, 4, 5], np.int32)
  y = np.ones([2, 5, 6], np.int32)
  assert simd_matmul.batched_matmul("Zab,Zbc->Zac", x, y, MESH) is None
