"""mtf.utils additions, mtf.test_utils, mtf.tpu_variables and the module namespaces."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mesh_tf.ops
import mesh_tf.ops_with_redefined_builtins
from mtf_testing import BATCH, HIDDEN, new_mesh, random_array


def test_ops_namespaces_are_the_originals():
  assert mesh_tf.ops.einsum is mtf.einsum and mesh_tf.ops.reshape is mtf.reshape
  assert mesh_tf.ops.assign is mtf.assign and mesh_tf.ops.Graph is mtf.Graph
  assert not hasattr(mesh_tf.ops, "range")  # the original's ops.py spells it mtf_range
  assert mesh_tf.ops_with_redefined_builtins.range is mtf.mtf_range
  assert mesh_tf.ops_with_redefined_builtins.slice is mtf.mtf_slice
  # the op families stay reachable as submodules
  from mesh_tf.ops.einsum import EinsumOperation  # pylint: disable=g-import-not-at-top
  assert EinsumOperation is mtf.EinsumOperation


def test_outside_all_rewrites_drops_pending_control_dependencies():
  @tf.function
  def fn():
    first = tf.constant(1.0)
    with tf.control_dependencies([first]):
      inside = tf.constant(2.0)
      with mtf.utils.outside_all_rewrites():
        outside = tf.constant(3.0)
    return [len(inside.op.control_inputs), len(outside.op.control_inputs)]
  assert fn.get_concrete_function().structured_outputs is not None
  inside_deps, outside_deps = [t.numpy() for t in fn()]
  assert inside_deps == 1 and outside_deps == 0


def test_balanced_variable_placer_uses_the_least_loaded_device():
  mesh_impl = mtf.PlacementMeshImpl("all:4", "", ["/cpu:%d" % i for i in range(4)])
  placer = mtf.utils.BalancedVariablePlacer(mesh_impl.devices, init_usage=[0, 0, 0, 40])
  graph, mesh = new_mesh()
  sizes = [64, 8, 8, 16, 4]
  variables = [mtf.get_variable(mesh, "v%d" % i, [mtf.Dimension("d", n)]).operation
               for i, n in enumerate(sizes)]
  placed = [placer.device_function(v) for v in variables]
  # float32 bytes: 256 -> cpu:0; 32 -> cpu:1; 32 -> cpu:2; 64 -> cpu:1 (32 < 40);
  # 16 -> cpu:2 (32 is the least).
  assert placed == ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:1", "/cpu:2"]
  assert placer.usage == [256, 96, 48, 40]
  assert placer.device_function(tf.Variable(tf.zeros([3]))) == "/cpu:3"
  assert graph is variables[0].graph


def test_a_mesh_variable_placer_places_the_master_values():
  devices = ["/cpu:%d" % i for i in range(4)]
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m", mtf.utils.BalancedVariablePlacer(devices))
  values = [random_array([mtf.Dimension("d", 4)], i) for i in range(4)]
  variables = [mtf.get_variable(mesh, "v%d" % i, [mtf.Dimension("d", 4)],
                                initializer=tf.constant_initializer(v)).operation
               for i, v in enumerate(values)]
  assert [v.master_device for v in variables] == devices
  mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("all:2", "d:all", devices[:2])})
  for v, value in zip(variables, values):
    master = v.get_master()
    assert tf.DeviceSpec.from_string(master.device).device_index == int(v.master_device[-1])
    np.testing.assert_allclose(master.numpy(), value)


def test_create_host_call_writes_the_lowered_summaries(tmp_path):
  mtf.utils.remove_summaries()
  x_np = random_array([BATCH, HIDDEN], 1)
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, HIDDEN])
  mean = mtf.reduce_mean(x)
  summary = mtf.scalar_summary("my_mean", mean)
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", [""])})
  lowering.lowered_operation(summary)
  host_call = mtf.utils.create_host_call(str(tmp_path))
  assert host_call is not None
  host_call_fn, tensors = host_call
  host_call_fn(*tensors)
  values = {}
  for event_file in tmp_path.iterdir():
    for event in tf.compat.v1.train.summary_iterator(str(event_file)):
      for v in event.summary.value:
        values[v.tag] = tf.make_ndarray(v.tensor)
  np.testing.assert_allclose(values["my_mean"], x_np.mean(), rtol=1e-5)
  mtf.utils.remove_summaries()
  assert mtf.utils.create_host_call(str(tmp_path)) is None


def test_topology_rank():
  topology = tf.tpu.experimental.Topology(
      mesh_shape=[2, 2, 1, 2],
      device_coordinates=np.array([[[x, y, 0, c] for x in range(2) for y in range(2)
                                    for c in range(2)]], np.int32))
  assert mtf.utils.topology_rank(topology) == 4
  assert mtf.utils.topology_rank(topology.serialized()) == 4
  assert mtf.utils.topology_rank([4, 4, 2]) == 3


def test_numpy_converter_round_trip_and_a_computation():
  converter = mtf.test_utils.NumpyConverter()
  x_np = np.arange(12, dtype=np.int32).reshape(3, 4)
  x = converter.convert_np_array_to_mtf_tensor(x_np, dim_names=["rows", "cols"])
  assert x.shape.dimension_names == ["rows", "cols"] and x.dtype == tf.int32
  assert x.mesh is converter.mesh and x.graph is converter.graph
  total = mtf.reduce_sum(x, reduced_dim=x.shape.dims[1])
  np.testing.assert_array_equal(converter.convert_mtf_tensor_to_np_array(total),
                                x_np.sum(axis=1))
  y = converter.convert_np_array_to_mtf_tensor(np.ones([2], np.float32), dtype=tf.float32)
  assert y.shape.dimension_names == ["dim0"]
  lowering, as_tf = converter.convert_mtf_tensor_to_tf_tensor(y * 3.0)
  assert isinstance(lowering, mtf.Lowering) and as_tf.shape == [2]
  np.testing.assert_array_equal(converter.session.run(as_tf), [3.0, 3.0])
  with pytest.raises(ValueError, match="1 dim names"):
    converter.convert_np_array_to_mtf_tensor(x_np, dim_names=["a"])


def test_replicated_variable_keeps_its_copies_equal():
  copies = [tf.Variable([1.0, 2.0]), tf.Variable([1.0, 2.0])]
  replicated = mtf.tpu_variables.ReplicatedVariable("w", copies)
  assert replicated.name == "w" and replicated.shape == [2] and replicated.dtype == tf.float32
  replicated.assign([3.0, 4.0])
  after_add = replicated.assign_add([1.0, 1.0])
  np.testing.assert_array_equal(after_add.numpy(), [4.0, 5.0])
  for v in copies:
    np.testing.assert_array_equal(v.numpy(), [4.0, 5.0])
  replicated.assign_sub([4.0, 5.0])
  np.testing.assert_array_equal(tf.convert_to_tensor(replicated).numpy(), [0.0, 0.0])
  np.testing.assert_array_equal((tf.constant([1.0, 1.0]) + replicated).numpy(), [1.0, 1.0])
  with pytest.raises(ValueError, match="copy"):
    mtf.tpu_variables.ReplicatedVariable("bad", [tf.Variable([1.0]), tf.Variable([1, 2])])


class _FakeDeviceAssignment:
  """A 2x2x1 torus with 2 cores per chip: replica r sits at the r-th coordinates in
  reverse order (so replica ids differ from row-major physical numbers)."""

  num_replicas = 8

  def __init__(self):
    coords = [[x, y, 0, c] for x in range(2) for y in range(2) for c in range(2)]
    self._coords = coords[::-1]

  def coordinates(self, replica, logical_core):
    assert logical_core == 0
    return self._coords[replica]


def test_device_coordinates_with_a_device_assignment():
  assignment = _FakeDeviceAssignment()
  mesh_shape = mtf.convert_to_shape("rows:2;cols:4")
  assert mtf.pnum_to_processor_coordinates_nd(mesh_shape, 0, assignment) == [1, 1, 0, 1]
  assert mtf.pnum_to_processor_coordinates_nd(mesh_shape, 5, None) == [1, 1]
  mapping = mtf.processor_coordinates_to_pnum_map_nd(mesh_shape, list(range(8)),
                                                     assignment)
  assert sorted(mapping.values()) == list(range(8))
  assert mapping[(0, 0, 0, 0)] == 7
  coords = mtf.simd_mesh_impl.auto_logical_to_physical_tpu([2, 4], [2, 2, 1, 2],
                                                           return_coordinates=True)
  replicas = mtf.simd_mesh_impl.auto_logical_to_physical_tpu(
      [2, 4], [2, 2, 1, 2], device_assignment=assignment)
  assert [assignment.coordinates(r, 0) for r in replicas] == [list(c) for c in coords]


def test_checkpoint_hooks_run_the_lowering_copies():
  class RecordingLowering:
    def __init__(self):
      self.calls = []

    def copy_slices_to_masters(self):
      self.calls.append("slices_to_masters")
      return "save_op"

    def copy_masters_to_slices(self):
      self.calls.append("masters_to_slices")
      return "restore_op"

  class Session:
    def __init__(self):
      self.ran = []

    def run(self, op):
      self.ran.append(op)
  lowering, session = RecordingLowering(), Session()
  saver = mtf.MtfCheckpointSaverListener(lowering)
  restorer = mtf.MtfRestoreHook(lowering)
  saver.begin()
  restorer.begin()
  saver.before_save(session, 0)
  saver.after_save(session, 0)
  restorer.after_create_session(session, None)
  saver.end(session, 0)
  assert lowering.calls == ["slices_to_masters", "masters_to_slices"]
  assert session.ran == ["save_op", "restore_op"]
