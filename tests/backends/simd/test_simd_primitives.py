"""SIMD emulation primitives against PlacementMeshImpl, processor by processor.

The emulated cores are numbered physically; a scrambled logical-to-physical map makes
sure every primitive reads each logical processor's slice from the right physical core.
"""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.backends import simd_vectorize

MESH = "a:2;b:4"
SCRAMBLED = [5, 2, 7, 0, 3, 6, 1, 4]  # l2p: logical pnum -> physical core
B, H, L = mtf.Dimension("batch", 8), mtf.Dimension("hidden", 8), mtf.Dimension("length", 4)
SHAPE = mtf.Shape([B, L, H])
VALUE = np.random.RandomState(0).randn(8, 4, 8).astype(np.float32)


def _pair(layout, l2p=SCRAMBLED, mesh=MESH):
  simd = mtf.SimdMeshImpl(mesh, layout, logical_to_physical=l2p)
  placement = mtf.PlacementMeshImpl(mesh, layout)
  return simd, placement


def _per_processor(impl, laid):
  """numpy slices indexed by logical pnum."""
  if isinstance(impl, mtf.SimdMeshImpl):
    stacked = laid.all_slices[0].numpy()
    return [stacked[impl.l2p(p)] for p in range(impl.size)]
  return [t.numpy() for t in laid.all_slices]


def _import(impl, value=VALUE, shape=SHAPE):
  graph = mtf.Graph()
  x = mtf.import_tf_tensor(mtf.Mesh(graph, "m"), value, shape)
  return x, impl.import_tf_tensor(x, tf.constant(value))


def _assert_same(simd, placement, fn, what):
  got = _per_processor(simd, fn(simd))
  want = _per_processor(placement, fn(placement))
  assert len(got) == len(want) == simd.size
  for p, (g, w) in enumerate(zip(got, want)):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6,
                               err_msg="%s, logical processor %d" % (what, p))


@pytest.mark.parametrize("layout", ["", "batch:a", "hidden:b", "batch:b;hidden:a",
                                    "length:b;hidden:a"])
def test_import_export_roundtrip_and_slices(layout):
  simd, placement = _pair(layout)
  _assert_same(simd, placement, lambda impl: _import(impl)[1], "import " + layout)
  x, laid = _import(simd)
  np.testing.assert_array_equal(simd.export_to_tf_tensor(x, laid).numpy(), VALUE)


@pytest.mark.parametrize("axes", [[0], [1], [0, 1]])
@pytest.mark.parametrize("reduction", ["SUM", "MAX", "MIN"])
def test_allreduce(axes, reduction):
  simd, placement = _pair("batch:a;hidden:b")
  _assert_same(simd, placement, lambda impl: impl.allreduce(_import(impl)[1], axes,
                                                            reduction),
               "allreduce %s over %s" % (reduction, axes))


@pytest.mark.parametrize("mesh_axis,concat_axis", [(0, 0), (1, 2), (1, 1)])
def test_allconcat(mesh_axis, concat_axis):
  simd, placement = _pair("batch:a;hidden:b")
  _assert_same(simd, placement, lambda impl: impl.allconcat(_import(impl)[1], mesh_axis,
                                                            concat_axis),
               "allconcat over %d on %d" % (mesh_axis, concat_axis))


@pytest.mark.parametrize("mesh_axis,split_axis,concat_axis", [(1, 1, 2), (1, 0, 0),
                                                              (0, 2, 0)])
def test_alltoall(mesh_axis, split_axis, concat_axis):
  simd, placement = _pair("batch:a;hidden:b")
  _assert_same(simd, placement, lambda impl: impl.alltoall(
      _import(impl)[1], mesh_axis, split_axis, concat_axis),
               "alltoall %d %d %d" % (mesh_axis, split_axis, concat_axis))


@pytest.mark.parametrize("offset,wrap", [(1, True), (-1, True), (1, False), (-2, False)])
def test_shift_by_n_processors(offset, wrap):
  simd, placement = _pair("hidden:b")
  _assert_same(simd, placement, lambda impl: impl.shift_by_n_processors(
      _import(impl)[1], 1, offset, wrap), "shift %d wrap=%s" % (offset, wrap))


def test_allsplit_inverts_allconcat():
  simd, placement = _pair("hidden:b")
  _assert_same(simd, placement, lambda impl: impl.allsplit(_import(impl)[1], 0, 0),
               "allsplit of a replicated dim")
  x, laid = _import(simd)
  back = simd.allsplit(simd.allconcat(laid, 1, 2), 1, 2)
  np.testing.assert_array_equal(back.all_slices[0].numpy(), laid.all_slices[0].numpy())


def test_pnum_pcoord_and_slice_offsets():
  simd, placement = _pair("batch:a;hidden:b")
  _assert_same(simd, placement, lambda impl: impl.laid_out_pnum(), "pnum")
  for axis in (0, 1):
    _assert_same(simd, placement, lambda impl, a=axis: impl.laid_out_pcoord(a), "pcoord")
  _assert_same(simd, placement, lambda impl: impl.laid_out_slice_begin(SHAPE),
               "slice begin")
  _assert_same(simd, placement, lambda impl: impl.laid_out_slice_num(SHAPE), "slice num")


def test_slicewise_multiple_outputs_scalars_and_no_inputs():
  simd, placement = _pair("batch:a;hidden:b")

  def fn(impl):
    laid = _import(impl)[1]
    top, rest = impl.slicewise(lambda t, k: tuple(tf.split(t * k, [1, 3], 1)), laid, 2.0)
    del rest
    const = impl.slicewise(lambda: tf.fill([1, 1, 2], 3.0))
    return impl.slicewise(lambda a, c: a + c, top, const)
  _assert_same(simd, placement, fn, "slicewise outputs")


def test_slicewise_falls_back_to_vectorized_map_for_unknown_ops():
  simd, placement = _pair("batch:a;hidden:b")
  before = simd_vectorize.stats["vectorized_map"]
  # a per-core begin in tf.slice has no replay rule
  fn = lambda impl: impl.slicewise(
      lambda t, p: tf.slice(t, tf.stack([0, p % 2, 0]), [-1, 2, -1]), _import(impl)[1],
      impl.laid_out_pnum())
  _assert_same(simd, placement, fn, "fallback")
  assert simd_vectorize.stats["vectorized_map"] == before + 1


def test_primitives_under_tf_function_match_eager():
  simd, _ = _pair("batch:a;hidden:b")
  x, _ = _import(simd)

  def run(value):
    laid = simd.import_tf_tensor(x, value)
    laid = simd.allreduce(simd.alltoall(laid, 1, 1, 2), [0], "SUM")
    laid = simd.shift_by_n_processors(simd.allconcat(laid, 1, 0), 0, 1, True)
    return laid.all_slices[0]
  eager = run(tf.constant(VALUE)).numpy()
  traced = tf.function(run)(tf.constant(VALUE)).numpy()
  np.testing.assert_allclose(traced, eager, rtol=1e-6)


def test_collectives_are_recorded_with_slice_sizes():
  simd, _ = _pair("batch:a;hidden:b")
  laid = _import(simd)[1]
  simd.allreduce(laid, [1], "SUM")
  simd.allconcat(laid, 0, 0)
  kinds = [(r.kind, r.mesh_axes, r.group_size, r.slice_bytes) for r in simd.comm_log]
  assert kinds == [("allreduce", (1,), 4, 4 * 4 * 2 * 4), ("allconcat", (0,), 2, 128)]
