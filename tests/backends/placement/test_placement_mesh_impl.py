"""PlacementMeshImpl's primitives, checked directly on a 2x4 mesh of virtual CPUs."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf

DEVICES = ["/cpu:%d" % i for i in range(8)]
SHAPE = mtf.convert_to_shape("batch:4;hidden:8")


def _impl(layout):
  return mtf.PlacementMeshImpl("rows:2;cols:4", layout, DEVICES)


@pytest.mark.parametrize("layout", ["", "batch:rows", "hidden:cols", "batch:rows;hidden:cols",
                                    "batch:cols;hidden:rows"])
def test_make_and_combine_slices_round_trip(layout):
  impl = _impl(layout)
  full = tf.reshape(tf.range(32.0), [4, 8])
  slices = impl.make_slices(full, SHAPE)
  assert [s.shape.as_list() for s in slices] == [impl.slice_shape(SHAPE)] * 8
  for pnum, s in enumerate(slices):
    b = impl.slice_begin(SHAPE, pnum)
    size = impl.slice_shape(SHAPE)
    np.testing.assert_array_equal(s.numpy(), full.numpy()[b[0]:b[0] + size[0],
                                                          b[1]:b[1] + size[1]])
  np.testing.assert_array_equal(impl.combine_slices(slices, SHAPE).numpy(), full.numpy())


def test_slice_geometry():
  impl = _impl("batch:rows;hidden:cols")
  assert impl.slice_shape(SHAPE) == [2, 2]
  assert impl.slice_begin(SHAPE, 5) == [2, 2]  # pnum 5 = (row 1, col 1)
  assert impl.laid_out_size(SHAPE) == 32
  assert impl.mesh_axis_to_cumprod(SHAPE) == [8, 1]
  pcoord = impl.laid_out_pcoord(1).tensor_list
  assert [int(c) for c in pcoord] == [0, 1, 2, 3, 0, 1, 2, 3]
  pnum = impl.laid_out_pnum().tensor_list
  assert [int(p) for p in pnum] == list(range(8))
  assert [t.device[-5:] for t in pnum] == ["CPU:%d" % i for i in range(8)]


def test_slices_traced_in_a_tf_function_are_placed_on_their_devices():
  """Inside tf.function the slices are placed through the graph's device scope
  (placement_collectives.device_scope), not tf.device: each slice's op on its device."""
  impl = _impl("batch:rows;hidden:cols")
  full = tf.reshape(tf.range(32.0), [4, 8])

  @tf.function
  def double(x):
    slices = impl.make_slices(x, SHAPE)
    laid_out = impl.slicewise(lambda t: t * 2.0, impl.LaidOutTensor(slices))
    return impl.combine_slices(laid_out.tensor_list, SHAPE)
  np.testing.assert_array_equal(double(full).numpy(), full.numpy() * 2.0)
  graph = double.get_concrete_function(full).graph
  # processor 0's Mul, and a call of one function of it on each other device
  # (slice_segments.py); without deferral, a Mul on each device
  made = [op for op in graph.get_operations() if op.type in ("Mul", "PartitionedCall")]
  assert sorted(op.device[-5:] for op in made) == ["CPU:%d" % i for i in range(8)]
  assert [op.type for op in made if op.device.endswith("CPU:0")] == ["Mul"]
  impl.defer_copies = False
  graph = tf.function(double.python_function).get_concrete_function(full).graph
  muls = [op for op in graph.get_operations() if op.type == "Mul"]
  assert sorted(op.device[-5:] for op in muls) == ["CPU:%d" % i for i in range(8)]


def test_slice_num_is_equal_exactly_on_replicas():
  impl = _impl("hidden:cols")  # replicated over rows
  nums = [int(n) for n in impl.laid_out_slice_num(SHAPE).tensor_list]
  assert nums == [0, 1, 2, 3, 0, 1, 2, 3]
  impl = _impl("batch:rows;hidden:cols")
  assert [int(n) for n in impl.laid_out_slice_num(SHAPE).tensor_list] == list(range(8))


def test_receive_and_shift_by_n_processors():
  impl = _impl("")
  x = impl.slicewise(lambda p: tf.fill([1], p), impl.laid_out_pnum())
  shifted = impl.shift_by_n_processors(x, 1, 1, wrap=False)
  assert [int(t[0]) for t in shifted.tensor_list] == [0, 0, 1, 2, 0, 4, 5, 6]
  wrapped = impl.shift_by_n_processors(x, 1, -1, wrap=True)
  assert [int(t[0]) for t in wrapped.tensor_list] == [1, 2, 3, 0, 5, 6, 7, 4]
  across_rows = impl.receive(x, 0, [1, 0])
  assert [int(t[0]) for t in across_rows.tensor_list] == [4, 5, 6, 7, 0, 1, 2, 3]


def test_allsplit_is_inverse_of_allconcat():
  impl = _impl("")
  x = impl.slicewise(lambda p: tf.reshape(tf.range(8) + 10 * p, [2, 4]),
                     impl.laid_out_pnum())
  gathered = impl.allconcat(x, 1, 0)
  assert gathered.slice_shape == [8, 4]
  back = impl.allsplit(gathered, 1, 0)
  for a, b in zip(back.tensor_list, x.tensor_list):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_allreduce_over_both_axes_and_one():
  impl = _impl("")
  x = impl.slicewise(lambda p: tf.cast(tf.fill([3], p), tf.float32), impl.laid_out_pnum())
  total = impl.allreduce(x, [0, 1], "SUM")
  assert all(float(t[0]) == 28.0 for t in total.tensor_list)
  row_max = impl.allreduce(x, [1], "MAX")
  assert [float(t[0]) for t in row_max.tensor_list] == [3.0] * 4 + [7.0] * 4


def test_slicewise_delay_allreduce_keeps_partial_sums_owing_one_allreduce():
  from mesh_tf.lowering.lazy_allreduce import LazyAllreduceSum  # pylint: disable=g-import-not-at-top
  impl = mtf.PlacementMeshImpl("all:4", "", ["/cpu:%d" % i for i in range(4)])
  parts = [impl.LaidOutTensor([tf.constant([float(p + k)]) for p in range(4)])
           for k in (0, 10)]
  lazy = [LazyAllreduceSum(impl, p, [0], op_name="einsum") for p in parts]
  out = impl.slicewise_delay_allreduce(tf.add, *lazy)
  assert isinstance(out, LazyAllreduceSum) and not impl.comm_log
  # Sum over processors of (p + p + 10) = 2 * 6 + 40.
  assert [t.numpy()[0] for t in out.force().all_slices] == [52.0] * 4
  assert len(impl.comm_log) == 1
  mixed = impl.slicewise_delay_allreduce(tf.add, lazy[0], parts[1])
  assert not isinstance(mixed, LazyAllreduceSum)


def test_mesh_impl_print_passes_the_value_through(capsys):
  del capsys
  impl = mtf.PlacementMeshImpl("all:2", "", ["/cpu:0", "/cpu:1"])
  x = impl.LaidOutTensor([tf.constant([1.0]), tf.constant([2.0])])
  out = impl.Print(x, [x], "x is")
  assert [t.numpy()[0] for t in out.all_slices] == [1.0, 2.0]


def test_replicas_share_a_slice_within_one_process_never_across_processes():
  # rows:2 over two worker tasks, cols:2 within each; "x" is split over rows only, so
  # the two processors of a task hold the same slice of it
  devices = ["/job:worker/replica:0/task:%d/device:CPU:%d" % (t, c)
             for t in range(2) for c in range(2)]
  impl = mtf.PlacementMeshImpl("rows:2;cols:2", "x:rows", devices)
  shape = mtf.convert_to_shape("x:4;y:3")
  keys = [impl.slice_key(shape, p) for p in range(4)]
  assert keys[0] == keys[1] and keys[2] == keys[3] and keys[0] != keys[2]
  assert not impl.shares_memory  # two processes
  one_worker = mtf.PlacementMeshImpl("rows:2;cols:2", "x:rows", [
      "/job:worker/replica:0/task:0/device:CPU:%d" % i for i in range(4)])
  assert one_worker.shares_memory
  gpus = mtf.PlacementMeshImpl("rows:2;cols:2", "x:rows", [
      "/job:worker/replica:0/task:0/device:GPU:%d" % i for i in range(4)])
  assert len({gpus.slice_key(shape, p) for p in range(4)}) == 4  # GPUs share nothing


def test_owed_sums_are_packed_where_the_mesh_spans_processes():
  """A placement cluster pays owed SUMs in one allreduce of the concatenated slices (each
  copy between processes is a gRPC round trip); the results are the separate ones'."""
  two_tasks = ["/job:worker/replica:0/task:%d/device:CPU:%d" % (p // 4, p % 4)
               for p in range(8)]
  assert mtf.PlacementMeshImpl("rows:2;cols:4", "", two_tasks).packs_allreduces
  assert not _impl("").packs_allreduces  # one process: an AddN per sum is as cheap
  impl = _impl("batch:rows")
  rng = np.random.RandomState(0)
  xs = [impl.LaidOutTensor([tf.constant(rng.randn(*shape), tf.float32) for _ in range(8)])
        for shape in ([2, 3], [5], [])]
  for axes in ([0], [1], [0, 1]):
    packed = impl._allreduce_packed(xs, axes)  # pylint: disable=protected-access
    for x, p in zip(xs, packed):
      separate = impl.allreduce(x, axes, "SUM").tensor_list
      for a, b in zip(p.tensor_list, separate):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
