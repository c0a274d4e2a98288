"""Every op family and its gradient under SIMD emulation equals one device.

The program of every_op_program.py (imports, variables, elementwise, einsum, reductions,
reshape, slicing, shifts, gather/one_hot, cumsum, top_1, random/dropout, gradients and an
assign) runs on the six meshes of the SIMD issue with several layouts each, and is
compared with PlacementMeshImpl on a single device. 64- and 512-core meshes are marked
slow (they still run in CI).
"""
import numpy as np
import pytest

import mesh_tf as mtf
from every_op_program import OUTPUT_NAMES, run_eager, run_in_function

SCRAMBLE_SEED = 7

CASES = [
    ("a:8", "batch:a"),
    ("a:8", "hidden:a"),
    ("rows:2;cols:4", "batch:rows;hidden:cols"),
    ("rows:2;cols:4", "batch:rows;vocab:cols"),
    ("rows:2;cols:4", "length:cols"),
    ("x:2;y:2;z:2", "batch:x;hidden:y;vocab:z"),
    ("x:2;y:2;z:2", "batch:z;length:x;hidden:y"),
]
SLOW_CASES = [
    ("rows:8;cols:8", "batch:rows;hidden:cols"),
    ("rows:8;cols:8", "vocab:rows;batch:cols"),
    ("x:8;y:8;z:8", "batch:x;hidden:y;vocab:z"),
    ("rows:16;cols:32", "batch:rows;vocab:cols"),
]


@pytest.fixture(scope="module")
def reference():
  return run_eager(mtf.PlacementMeshImpl("", "", [""]))


def _scrambled(mesh_shape):
  n = mtf.convert_to_shape(mesh_shape).size
  return list(np.random.RandomState(SCRAMBLE_SEED).permutation(n))


def _check(values, reference, what):
  for name, got, want in zip(OUTPUT_NAMES, values, reference):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                               err_msg="%s: %s" % (what, name))
  assert len(values) == len(reference) == len(OUTPUT_NAMES)


def _case_id(case):
  return "%s/%s" % case


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_eager_matches_single_device(case, reference):
  mesh_shape, layout = case
  impl = mtf.SimdMeshImpl(mesh_shape, layout, logical_to_physical=_scrambled(mesh_shape))
  _check(run_eager(impl), reference, "eager " + _case_id(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES, ids=_case_id)
def test_eager_matches_single_device_large(case, reference):
  mesh_shape, layout = case
  _check(run_eager(mtf.SimdMeshImpl(mesh_shape, layout)), reference,
         "eager " + _case_id(case))


def test_tf_function_matches_single_device(reference):
  case = ("x:2;y:2;z:2", "batch:x;hidden:y;vocab:z")
  impl = mtf.SimdMeshImpl(*case, logical_to_physical=_scrambled(case[0]))
  _check(run_in_function(impl), reference, "tf.function " + _case_id(case))


@pytest.mark.slow
def test_tf_function_matches_single_device_512_cores(reference):
  case = ("rows:16;cols:32", "batch:rows;vocab:cols")
  _check(run_in_function(mtf.SimdMeshImpl(*case)), reference,
         "tf.function " + _case_id(case))
