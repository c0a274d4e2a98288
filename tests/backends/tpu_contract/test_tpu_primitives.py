"""Every SIMD primitive on the TPU runtime equals the CPU emulation, core by core.

The TPU runtime runs under MirroredStrategy on 8 virtual CPUs with the collectives'
stand-ins (tpu_standins); the emulation runs the same primitive on the same
logical-to-physical map. Values include int64 beyond 2**40, bools and +-inf.
"""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from tpu_standins import per_core

MESH = "a:2;b:4"
LAYOUT = "batch:a;hidden:b"
SCRAMBLED = [5, 2, 7, 0, 3, 6, 1, 4]  # l2p: logical pnum -> physical core
B, L, H = mtf.Dimension("batch", 8), mtf.Dimension("length", 4), mtf.Dimension("hidden", 8)
SHAPE = mtf.Shape([B, L, H])


def _values():
  rng = np.random.RandomState(0)
  floats = rng.randn(8, 4, 8).astype(np.float32)
  floats[1, 2, :] = np.inf
  floats[:, 3, 5] = -np.inf
  floats[[0, 4], 1, :] = -np.inf  # all -inf across the mesh: MAX must stay -inf
  ints = rng.randint(-2 ** 45, 2 ** 45, size=[8, 4, 8]).astype(np.int64)
  return {"float32": floats, "int64": ints, "bool": floats > 0.3,
          "int32": rng.randint(-1000, 1000, size=[8, 4, 8]).astype(np.int32)}


VALUES = _values()


def _impls(device_assignment, mesh=MESH, layout=LAYOUT, l2p=SCRAMBLED):
  tpu = mtf.SimdMeshImpl(mesh, layout, device_assignment=device_assignment,
                         logical_to_physical=l2p)
  emulation = mtf.SimdMeshImpl(mesh, layout, logical_to_physical=l2p)
  return tpu, emulation


def _compare(strategy, device_assignment, fn, dtype="float32", **impl_args):
  """fn(impl, laid_out input) on both runtimes; asserts every core's slice is equal."""
  tpu, emulation = _impls(device_assignment, **impl_args)
  value = VALUES[dtype]
  x = mtf.import_tf_tensor(mtf.Mesh(mtf.Graph(), "m"), value, SHAPE)

  def replica():
    return fn(tpu, tpu.import_tf_tensor(x, tf.constant(value))).one_slice
  got = per_core(strategy, tf.function(lambda: strategy.run(replica), autograph=False)())
  want = fn(emulation, emulation.import_tf_tensor(x, tf.constant(value))).all_slices[0]
  want = want.numpy()
  assert len(got) == want.shape[0] == 8
  for core in range(8):
    assert got[core].dtype == want[core].dtype
    if want.dtype.kind == "f":  # sums may add in another order
      np.testing.assert_allclose(got[core], want[core], rtol=1e-6, atol=1e-6,
                                 err_msg="physical core %d" % core)
    else:
      np.testing.assert_array_equal(got[core], want[core], err_msg="physical core %d" % core)


@pytest.mark.parametrize("dtype", ["float32", "int64", "int32"])
@pytest.mark.parametrize("reduction", ["SUM", "MAX", "MIN"])
@pytest.mark.parametrize("axes", [[0], [1], [0, 1]])
def test_allreduce(strategy, standins, device_assignment, dtype, reduction, axes):
  _compare(strategy, device_assignment,
           lambda impl, x: impl.allreduce(x, axes, reduction), dtype)
  if dtype == "int64":  # CrossReplicaSum takes no int64: an exact all-gather does it
    assert standins.ops_used() == {("AllToAll", "int64")}
  elif reduction == "SUM":
    assert standins.ops_used() == {("CrossReplicaSum", dtype)}


def test_max_over_minus_infinity_stays_minus_infinity(strategy, standins, device_assignment):
  del standins
  tpu, _ = _impls(device_assignment)
  x = mtf.import_tf_tensor(mtf.Mesh(mtf.Graph(), "m"), VALUES["float32"], SHAPE)
  value = tf.constant(VALUES["float32"])
  got = per_core(strategy, tf.function(lambda: strategy.run(
      lambda: tpu.allreduce(tpu.import_tf_tensor(x, value), [0, 1], "MAX").one_slice),
                                       autograph=False)())
  want = VALUES["float32"].reshape(2, 4, 4, 4, 2).max(axis=(0, 3))  # [batch/2, L, H/4]
  for core in range(8):
    np.testing.assert_array_equal(got[core], want)
  assert np.isneginf(want).any() and not np.isnan(np.stack(got)).any()


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
@pytest.mark.parametrize("mesh_axis,concat_axis", [(0, 0), (1, 2), (1, 1)])
def test_allconcat(strategy, standins, device_assignment, dtype, mesh_axis, concat_axis):
  del standins
  _compare(strategy, device_assignment,
           lambda impl, x: impl.allconcat(x, mesh_axis, concat_axis), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bool"])
@pytest.mark.parametrize("mesh_axis,split_axis,concat_axis", [(1, 1, 2), (1, 0, 0),
                                                              (0, 2, 0)])
def test_alltoall(strategy, standins, device_assignment, dtype, mesh_axis, split_axis,
                  concat_axis):
  del standins
  _compare(strategy, device_assignment,
           lambda impl, x: impl.alltoall(x, mesh_axis, split_axis, concat_axis), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bool", "int64"])
@pytest.mark.parametrize("mesh_axis,offset,wrap", [(1, 1, True), (1, -1, False),
                                                   (1, 2, False), (0, 1, False)])
def test_shift_by_n_processors(strategy, standins, device_assignment, dtype, mesh_axis,
                               offset, wrap):
  _compare(strategy, device_assignment,
           lambda impl, x: impl.shift_by_n_processors(x, mesh_axis, offset, wrap), dtype)
  if dtype == "bool":  # CollectivePermute takes no bool: it travels as int32
    assert standins.ops_used() == {("CollectivePermute", "int32")}


def test_receive_from_one_source_in_rounds(strategy, standins, device_assignment):
  # every core of a group receives from core 0 of the group: core 0 sends 4 times
  _compare(strategy, device_assignment, lambda impl, x: impl.receive(x, 1, [0, 0, 0, 0]))
  assert len(standins.calls) == 4


def test_receive_without_wrap_on_a_size_one_axis(strategy, standins, device_assignment):
  _compare(strategy, device_assignment,
           lambda impl, x: impl.shift_by_n_processors(x, 0, 1, False),
           mesh="a:1;b:8", layout="hidden:b")
  assert not standins.calls  # nobody sends: zeros without a collective


@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_allsplit(strategy, standins, device_assignment, dtype):
  del standins
  _compare(strategy, device_assignment,
           lambda impl, x: impl.allsplit(impl.allconcat(x, 1, 2), 1, 2), dtype)


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_export_gives_every_core_the_full_value(strategy, standins, device_assignment,
                                                dtype):
  del standins
  tpu, emulation = _impls(device_assignment)
  value = VALUES[dtype]
  x = mtf.import_tf_tensor(mtf.Mesh(mtf.Graph(), "m"), value, SHAPE)
  got = per_core(strategy, tf.function(lambda: strategy.run(
      lambda: tpu.export_to_tf_tensor(x, tpu.import_tf_tensor(x, tf.constant(value)))),
                                       autograph=False)())
  want = emulation.export_to_tf_tensor(x, emulation.import_tf_tensor(x, tf.constant(value)))
  np.testing.assert_array_equal(want.numpy(), value)
  for core in range(8):
    np.testing.assert_array_equal(got[core], value, err_msg="physical core %d" % core)


def test_alltoall_of_an_indivisible_axis_is_a_layout_error(strategy, standins,
                                                          device_assignment):
  del standins
  tpu, _ = _impls(device_assignment, mesh="a:8", layout="")
  x = mtf.import_tf_tensor(mtf.Mesh(mtf.Graph(), "m"), VALUES["float32"], SHAPE)
  with pytest.raises(mtf.LayoutError, match="split axis 1 of slice"):
    tf.function(lambda: strategy.run(lambda: tpu.alltoall(
        tpu.import_tf_tensor(x, tf.constant(VALUES["float32"])), 0, 1, 0).one_slice),
                autograph=False)()


def test_pnum_pcoord_slice_begin_and_num(strategy, standins, device_assignment):
  del standins
  for fn in [lambda impl, x: impl.laid_out_pnum(),
             lambda impl, x: impl.laid_out_pcoord(0),
             lambda impl, x: impl.laid_out_pcoord(1),
             lambda impl, x: impl.laid_out_slice_begin(SHAPE),
             lambda impl, x: impl.laid_out_slice_num(SHAPE)]:
    _compare(strategy, device_assignment, fn)


MESHES = [("a:8", "hidden:a", list(reversed(range(8)))),
          ("a:2;b:2;c:2", "batch:a;length:b;hidden:c", [3, 6, 0, 5, 7, 1, 4, 2]),
          ("a:2;b:2;c:2", "batch:c;hidden:a", list(range(8)))]


@pytest.mark.parametrize("mesh,layout,l2p", MESHES)
def test_other_meshes_and_core_maps(strategy, standins, device_assignment, mesh, layout,
                                    l2p):
  del standins
  last = mtf.convert_to_shape(mesh).ndims - 1
  cases = [lambda impl, x: impl.allreduce(x, list(range(last + 1)), "SUM"),
           lambda impl, x: impl.allreduce(x, sorted({0, last}), "MAX"),
           lambda impl, x: impl.allconcat(x, last, 2),
           lambda impl, x: impl.alltoall(x, 0, 0, 2),
           lambda impl, x: impl.shift_by_n_processors(x, last, -1, True),
           lambda impl, x: impl.laid_out_pnum()]
  for fn in cases:
    for dtype in ("float32", "int64"):
      _compare(strategy, device_assignment, fn, dtype, mesh=mesh, layout=layout, l2p=l2p)
