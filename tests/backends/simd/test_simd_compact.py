"""The emulation stores each distinct slice once: replicated tensors keep extent 1 along
the mesh axes they are replicated over, and every primitive on such compact values
matches PlacementMeshImpl processor by processor (scrambled core map)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.backends import simd_vectorize

MESH = "a:2;b:4"
SCRAMBLED = [5, 2, 7, 0, 3, 6, 1, 4]
B, H, L = mtf.Dimension("batch", 8), mtf.Dimension("hidden", 8), mtf.Dimension("length", 4)
SHAPE = mtf.Shape([B, L, H])
VALUE = np.random.RandomState(0).randn(8, 4, 8).astype(np.float32)


def _pair(layout):
  return (mtf.SimdMeshImpl(MESH, layout, logical_to_physical=SCRAMBLED),
          mtf.PlacementMeshImpl(MESH, layout))


def _import(impl, value=VALUE, shape=SHAPE):
  graph = mtf.Graph()
  x = mtf.import_tf_tensor(mtf.Mesh(graph, "m"), value, shape)
  return impl.import_tf_tensor(x, tf.constant(value))


def _per_processor(impl, laid):
  if isinstance(impl, mtf.SimdMeshImpl):
    stacked = laid.all_slices[0].numpy()
    assert stacked.shape[0] == impl.size
    return [stacked[impl.l2p(p)] for p in range(impl.size)]
  return [t.numpy() for t in laid.all_slices]


def _assert_same(simd, placement, fn, what, tol=1e-6):
  got, want = _per_processor(simd, fn(simd)), _per_processor(placement, fn(placement))
  assert len(got) == len(want) == 8
  for p, (g, w) in enumerate(zip(got, want)):
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol,
                               err_msg="%s, logical processor %d" % (what, p))


def test_import_keeps_extent_one_on_replicated_axes():
  simd, _ = _pair("batch:a")
  laid = _import(simd)
  assert laid.extents == [2, 1]
  assert laid.compact.shape.as_list() == [2, 1, 4, 4, 8]
  assert _import(mtf.SimdMeshImpl(MESH, ""), VALUE).extents == [1, 1]


def test_variable_is_stored_once_per_distinct_slice():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  rows, cols, hidden = (mtf.Dimension("rows", 4), mtf.Dimension("cols", 4),
                        mtf.Dimension("hidden", 64))
  mtf.get_variable(mesh, "w1", [rows, cols, hidden])
  impl = mtf.SimdMeshImpl("rows:16;cols:32", "batch:rows;hidden:cols")
  mtf.Lowering(graph, {mesh: impl})
  var = impl.variable_store["w1"]
  # 512 cores, but only the 32 distinct hidden slices are held: no 16 copies
  assert var.variable.shape.as_list() == [1, 32, 4, 4, 2]
  full = var.read_full().numpy()
  stacked = var.laid_out_tensor.all_slices[0].numpy()
  assert stacked.shape == (512, 4, 4, 2)
  for core in (0, 37, 511):
    col = impl.p2l(core) % 32
    np.testing.assert_array_equal(stacked[core], full[:, :, 2 * col:2 * col + 2])


def test_laid_out_tensor_from_physical_stack_round_trips():
  simd, _ = _pair("hidden:b")
  stacked = tf.constant(np.random.RandomState(1).randn(8, 3).astype(np.float32))
  laid = simd.LaidOutTensor([stacked])
  assert laid.extents == [2, 4]
  np.testing.assert_array_equal(laid.all_slices[0].numpy(), stacked.numpy())
  np.testing.assert_array_equal(laid.compact.numpy().reshape(8, 3),
                                stacked.numpy()[SCRAMBLED])


@pytest.mark.parametrize("layout,axes", [("batch:a", [1]), ("batch:a", [0, 1]),
                                         ("", [0]), ("hidden:b", [0, 1])])
@pytest.mark.parametrize("reduction", ["SUM", "MAX", "MIN"])
def test_allreduce_over_replicated_axes(layout, axes, reduction):
  simd, placement = _pair(layout)
  _assert_same(simd, placement,
               lambda impl: impl.allreduce(_import(impl), axes, reduction),
               "allreduce %s %s over %s" % (layout, reduction, axes))
  assert simd.allreduce(_import(simd), axes, reduction).extents == [
      1 if a in axes else e for a, e in enumerate(_import(simd).extents)]


@pytest.mark.parametrize("layout,mesh_axis,axis", [("batch:a", 1, 2), ("", 0, 0),
                                                   ("hidden:b", 0, 1)])
def test_allconcat_of_replicated_axis(layout, mesh_axis, axis):
  simd, placement = _pair(layout)
  _assert_same(simd, placement, lambda impl: impl.allconcat(_import(impl), mesh_axis, axis),
               "allconcat %s over %d on %d" % (layout, mesh_axis, axis))


@pytest.mark.parametrize("layout,mesh_axis,split,concat", [("batch:a", 1, 2, 1),
                                                           ("", 0, 0, 2),
                                                           ("hidden:b", 0, 1, 2)])
def test_alltoall_of_replicated_axis(layout, mesh_axis, split, concat):
  simd, placement = _pair(layout)
  _assert_same(simd, placement,
               lambda impl: impl.alltoall(_import(impl), mesh_axis, split, concat),
               "alltoall %s %d %d %d" % (layout, mesh_axis, split, concat))


@pytest.mark.parametrize("offset,wrap", [(1, True), (1, False), (-3, False)])
@pytest.mark.parametrize("layout", ["batch:a", "batch:b"])
def test_shift_of_replicated_and_split_axes(layout, offset, wrap):
  simd, placement = _pair(layout)
  _assert_same(simd, placement,
               lambda impl: impl.shift_by_n_processors(_import(impl), 1, offset, wrap),
               "shift %s %d %s" % (layout, offset, wrap))


@pytest.mark.parametrize("layout,mesh_axis,axis", [("hidden:b", 1, 0), ("batch:a", 0, 1),
                                                   ("", 1, 2)])
def test_allsplit_of_split_and_replicated_axes(layout, mesh_axis, axis):
  simd, placement = _pair(layout)
  _assert_same(simd, placement, lambda impl: impl.allsplit(_import(impl), mesh_axis, axis),
               "allsplit %s %d %d" % (layout, mesh_axis, axis))
  _assert_same(simd, placement, lambda impl: impl.allsplit(_import(impl), mesh_axis, axis,
                                                           which=1),
               "allsplit %s %d %d which=1" % (layout, mesh_axis, axis))
  _assert_same(simd, placement, lambda impl: impl.allsplit(
      _import(impl), mesh_axis, axis, which=impl.slicewise(
          lambda p, n=simd.shape[mesh_axis].size: p % n, impl.laid_out_pcoord(1 - mesh_axis))),
               "allsplit %s %d %d by the other pcoord" % (layout, mesh_axis, axis))


def test_slicewise_broadcasts_extents_like_numpy():
  simd, placement = _pair("batch:a;hidden:b")
  w_shape = mtf.Shape([H, mtf.Dimension("vocab", 6)])
  w_value = np.random.RandomState(2).randn(8, 6).astype(np.float32)

  def fn(impl):
    x = _import(impl)
    w = _import(impl, w_value, w_shape)  # hidden:b, replicated over a
    y = impl.slicewise(lambda a, b: tf.einsum("blh,hv->blv", a, b), x, w)
    z = impl.slicewise(
        lambda a, b, c: tf.concat([a, tf.broadcast_to(
            tf.reduce_sum(b, 0) * tf.cast(c, tf.float32), [a.shape[0], 1, 6])], 1),
        y, w, impl.laid_out_pcoord(0))
    return impl.slicewise(lambda t: tf.transpose(tf.reshape(t, [-1, 6]))[:, 1:], z)
  before = simd_vectorize.stats["vectorized_map"]
  _assert_same(simd, placement, fn, "einsum/concat/reshape on mixed extents")
  assert simd_vectorize.stats["vectorized_map"] == before  # all replayed
  w = _import(simd, w_value, w_shape)
  assert simd.slicewise(lambda t: tf.nn.relu(t) * 2.0, w).extents == [1, 4]


def test_fallback_on_replicated_input():
  simd, placement = _pair("hidden:b")
  before = simd_vectorize.stats["vectorized_map"]
  fn = lambda impl: impl.slicewise(
      lambda t, p: tf.slice(t, tf.stack([p % 2, 0, 0]), [2, -1, -1]), _import(impl),
      impl.laid_out_pnum())
  _assert_same(simd, placement, fn, "fallback on a replicated input")
  assert simd_vectorize.stats["vectorized_map"] == before + 1


def test_assign_keeps_first_copy_along_replicated_axes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.get_variable(mesh, "w", [H], initializer=tf.zeros_initializer())
  impl = mtf.SimdMeshImpl(MESH, "hidden:b", logical_to_physical=SCRAMBLED)
  mtf.Lowering(graph, {mesh: impl})
  var = impl.variable_store["w"]
  value = impl.slicewise(lambda t: t + 3.0, var.laid_out_tensor)
  # rebuilt from the physical stack: one (equal) copy per core along a
  value = impl.LaidOutTensor(value.all_slices)
  assert value.extents == [2, 4]
  var.assign_to_slices(lambda v, t: v.assign(t), value)
  np.testing.assert_array_equal(var.read_full().numpy(), np.full([8], 3.0, np.float32))
  assert var.variable.shape.as_list() == [1, 4, 2]


@pytest.mark.parametrize("layout,axes", [("batch:a;hidden:b", [0]),
                                         ("batch:a;hidden:b", [0, 1]),
                                         ("batch:b", [1]), ("batch:a", [0, 1])])
def test_allreduce_of_an_einsum_contracts_inside_it(layout, axes):
  simd, placement = _pair(layout)
  w_shape = mtf.Shape([H, mtf.Dimension("vocab", 6)])
  w_value = np.random.RandomState(3).randn(8, 6).astype(np.float32)

  def partial(impl):
    x, w = _import(impl), _import(impl, w_value, w_shape)
    return impl.slicewise(lambda a, b: tf.einsum("blh,hv->lv", a, b), x, w)
  _assert_same(simd, placement, lambda impl: impl.allreduce(partial(impl), axes, "SUM"),
               "allreduce of an einsum %s over %s" % (layout, axes), tol=1e-5)
  assert partial(simd).sum_recipe is not None
  assert simd.slicewise(lambda t: t * 2.0, partial(simd)).sum_recipe is None

  @tf.function
  def reduced():
    return simd.allreduce(partial(simd), axes, "SUM").compact
  graph = reduced.get_concrete_function().graph
  assert not [op for op in graph.get_operations() if op.type == "Sum"]
