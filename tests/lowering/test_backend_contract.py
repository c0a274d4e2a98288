"""The backend contract: MeshImpl's abstract primitives, SimdRuntime's, and the one place
where collectives are recorded (MeshImpl's public collectives)."""
import importlib
import pkgutil

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import backends
from mesh_tf.backends import (process_placement, simd_emulation, simd_multi_client,
                              simd_runtime, simd_tpu)
from mesh_tf.lowering.mesh_impl import MeshImpl

PRIMITIVES = {"slicewise", "_allreduce", "_allconcat", "_alltoall", "_receive",
              "laid_out_pnum", "import_tf_tensor", "export_to_tf_tensor", "make_variable"}
RUNTIME_PRIMITIVES = {"LaidOutTensor", "slicewise", "allreduce", "allconcat", "alltoall",
                      "receive", "allsplit", "laid_out_pnum", "laid_out_pcoord",
                      "laid_out_slice_begin", "laid_out_slice_num", "import_tf_tensor",
                      "export_to_tf_tensor", "make_variable"}
DEVICES = ["/cpu:%d" % i for i in range(8)]
MESH, LAYOUT = "rows:2;cols:4", "batch:rows;hidden:cols"
SHAPE = mtf.convert_to_shape("batch:4;hidden:8")

# One constructor per concrete backend class.
FACTORIES = {
    "PlacementMeshImpl": lambda: mtf.PlacementMeshImpl(MESH, LAYOUT, DEVICES),
    "SimdMeshImpl": lambda: mtf.SimdMeshImpl(MESH, LAYOUT),
    "GSPMDMeshImpl": lambda: mtf.GSPMDMeshImpl(MESH, LAYOUT),
    "MultiClientMeshImpl": lambda: simd_multi_client.MultiClientMeshImpl(
        MESH, LAYOUT, pnum=0, device="/cpu:0"),
    "ProcessPlacementMeshImpl": lambda: process_placement.ProcessPlacementMeshImpl(
        MESH, LAYOUT, range(4), DEVICES[:4]),
    # the cross-process member of ProcessPlacementMeshImpl's local device 1
    "_ProcessPeer": lambda: process_placement._ProcessPeer(  # pylint: disable=protected-access
        "process:2", 0, "/cpu:1", 1, 60.0, "auto"),
}


def _concrete_subclasses(base):
  for module in pkgutil.iter_modules(backends.__path__):
    importlib.import_module("mesh_tf.backends." + module.name)
  found, todo = set(), [base]
  while todo:
    for sub in todo.pop().__subclasses__():
      todo.append(sub)
      if not sub.__abstractmethods__ and sub.__module__.startswith("mesh_tf."):
        found.add(sub)
  return found


def _stub(name):
  def method(self, *args, **kwargs):
    del self, args, kwargs
  method.__name__ = name
  return method


def test_mesh_impl_declares_exactly_the_primitives():
  assert set(MeshImpl.__abstractmethods__) == PRIMITIVES

  class MissingOne(MeshImpl):
    pass
  for name in sorted(PRIMITIVES - {"slicewise"}):
    setattr(MissingOne, name, _stub(name))
  with pytest.raises(TypeError, match="abstract.*slicewise"):
    MissingOne(MESH, LAYOUT)  # pylint: disable=abstract-class-instantiated


def test_mesh_impl_itself_answers_layout_queries_as_the_original():
  impl = MeshImpl(MESH, LAYOUT)  # the original's ops_test builds one to query layouts
  assert isinstance(impl, MeshImpl)
  assert impl.shape == mtf.convert_to_shape(MESH) and impl.size == impl.shape.size
  assert impl.supports_control_dependencies
  for name in sorted(PRIMITIVES):
    with pytest.raises(NotImplementedError, match="layout queries only"):
      getattr(impl, name)()


def test_every_backend_class_is_known_and_implements_every_primitive():
  classes = _concrete_subclasses(MeshImpl) - {type(MeshImpl(MESH, LAYOUT))}
  assert sorted(c.__name__ for c in classes) == sorted(FACTORIES)
  for cls in classes:
    for name in PRIMITIVES:
      method = getattr(cls, name)
      assert not getattr(method, "__isabstractmethod__", False), (cls, name)
      assert method is not getattr(MeshImpl, name), (cls, name)
    impl = FACTORIES[cls.__name__]()
    assert impl.__class__ is cls


@pytest.mark.parametrize("missing", sorted(PRIMITIVES))
def test_a_backend_missing_one_primitive_cannot_be_made(missing):
  body = {name: _stub(name) for name in PRIMITIVES if name != missing}
  incomplete = type("Incomplete", (MeshImpl,), body)
  with pytest.raises(TypeError, match=missing):
    incomplete(MESH, LAYOUT)
  complete = type("Complete", (MeshImpl,), dict(body, **{missing: _stub(missing)}))
  assert complete(MESH, LAYOUT).size == 8


def test_simd_runtimes_implement_the_runtime_protocol():
  assert set(simd_runtime.SimdRuntime.__abstractmethods__) == RUNTIME_PRIMITIVES
  runtimes = _concrete_subclasses(simd_runtime.SimdRuntime)
  assert runtimes == {simd_emulation.EmulationRuntime, simd_tpu.TpuRuntime}
  impl = mtf.SimdMeshImpl(MESH, LAYOUT)
  runtime = impl._runtime  # pylint: disable=protected-access
  assert isinstance(runtime, simd_emulation.EmulationRuntime)
  tpu = simd_tpu.TpuRuntime(impl)
  assert tpu.LaidOutTensor is mtf.simd_mesh_impl.SimdMeshImpl.LaidOutTensor


@pytest.mark.parametrize("missing", sorted(RUNTIME_PRIMITIVES))
def test_a_runtime_missing_one_primitive_cannot_be_made(missing):
  body = {name: _stub(name) for name in RUNTIME_PRIMITIVES if name != missing}
  incomplete = type("Incomplete", (simd_runtime.SimdRuntime,), body)
  with pytest.raises(TypeError, match=missing):
    incomplete()


def test_emulated_laid_out_tensor_is_the_plain_class():
  impl = mtf.SimdMeshImpl(MESH, LAYOUT)
  stacked = tf.reshape(tf.range(8 * 2 * 2, dtype=tf.float32), [8, 2, 2])
  laid = impl.LaidOutTensor([stacked])
  assert laid.__class__ is simd_emulation.EmulatedLaidOutTensor
  np.testing.assert_array_equal(laid.one_slice.numpy(), stacked.numpy())
  assert laid.dtype == tf.float32 and laid.slice_shape == [2, 2]


def _kinds(impl, start=0):
  return [(r.kind, r.mesh_axes, r.group_size, r.slice_bytes) for r in impl.comm_log[start:]]


@pytest.mark.parametrize("backend", ["PlacementMeshImpl", "SimdMeshImpl"])
def test_each_public_collective_records_itself_once(backend):
  impl = FACTORIES[backend]()
  full = tf.reshape(tf.range(32.0), [4, 8])
  x = impl.import_tf_tensor(_Holder(SHAPE), full)  # slices [2, 2] of float32: 16 bytes
  impl.allreduce(x, [1], "sum")
  impl.allreduce(x, [0], "MAX", record=False)
  impl.allreduce(x, [], "SUM")
  impl.allconcat(x, 1, 1)
  impl.alltoall(impl.allconcat(x, 1, 1), 1, 1, 0)  # the allconcat's slices: [2, 8]
  impl.receive(x, 0, [1, 0])
  summed = impl.reduce_scatter(x, 0, 0)
  assert summed.slice_shape == [1, 2]
  assert _kinds(impl) == [("allreduce", (1,), 4, 16), ("allconcat", (1,), 4, 16),
                          ("allconcat", (1,), 4, 16), ("alltoall", (1,), 4, 64),
                          ("receive", (0,), 2, 16), ("reducescatter", (0,), 2, 16)]


def test_gspmd_records_no_collective():
  impl = FACTORIES["GSPMDMeshImpl"]()
  x = impl.import_tf_tensor(_Holder(SHAPE), tf.ones([4, 8]))
  impl.allreduce(x, [1], "SUM")
  impl.allconcat(x, 1, 1)
  impl.receive(x, 0, [1, 0])
  impl.reduce_scatter(x, 0, 0)
  assert impl.comm_log == []


def test_multi_client_leaves_a_lone_allreduce_unrecorded():
  impl = simd_multi_client.MultiClientMeshImpl("a:1;b:2", "", pnum=0, device="/cpu:0")
  x = impl.LaidOutTensor([tf.ones([3])])
  assert impl.allreduce(x, [0], "SUM") is x  # a group of one: nothing emitted
  assert impl.comm_log == []
  placement = mtf.PlacementMeshImpl("a:1;b:2", "", DEVICES[:2])
  placement.allreduce(placement.LaidOutTensor([tf.ones([3])] * 2), [0], "SUM")
  assert _kinds(placement) == [("allreduce", (0,), 1, 12)]


class _Holder:
  """What import_tf_tensor reads of an mtf Tensor."""

  def __init__(self, shape):
    self.shape = shape
    self.name = "x"
