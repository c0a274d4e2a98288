"""The original's object model: Variable and VariableDType members, TensorLayout, Graph
and Lowering methods, StackedVariable / ReadVariable, the slicing Operation classes, lazy
laid-out values, SimdMeshImpl / PlacementMeshImpl extras and every op's splittability."""
import numpy as np
import pytest
import tensorflow as tf

import every_op_program
import mesh_tf as mtf
from mtf_testing import (BATCH, HIDDEN, assert_close, lower_and_export, new_mesh,
                         random_array)

CPUS = ["/cpu:%d" % i for i in range(8)]
LENGTH = mtf.Dimension("length", 4)


def _mesh_2x4(layout="batch:rows;hidden:cols"):
  return mtf.PlacementMeshImpl("rows:2;cols:4", layout, CPUS)


def test_variable_members_and_master_value():
  v0 = random_array([BATCH, HIDDEN], 1)
  graph, mesh = new_mesh()
  dtype = mtf.VariableDType(tf.float32, tf.float32, tf.bfloat16)
  x = mtf.get_variable(mesh, "w", [BATCH, HIDDEN], dtype=dtype,
                       initializer=tf.constant_initializer(v0))
  var = x.operation
  assert (dtype.master_dtype, dtype.slice_dtype, dtype.activation_dtype) == (
      tf.float32, tf.float32, tf.bfloat16)
  with pytest.raises(AttributeError):
    dtype.master_dtype = tf.int32
  assert var.dtype == tf.bfloat16 and var.size == 64 and var.master_device == "cpu:0"
  with pytest.raises(mtf.ShapeError, match="lower its graph"):
    var.get_master()
  impl = _mesh_2x4()
  mtf.Lowering(graph, {mesh: impl})
  assert_close(var.get_master().numpy(), v0, "get_master")
  var.assign_to_master(2.0 * v0)
  assert_close(lower_and_export(graph, mesh, impl, [mtf.cast(x, tf.float32)])[0],
               (2.0 * v0).astype(tf.bfloat16.as_numpy_dtype).astype(np.float32),
               "after assign_to_master")


def test_stacked_and_read_variable():
  a0, b0 = random_array([HIDDEN], 2), random_array([HIDDEN], 3)
  graph, mesh = new_mesh()
  a = mtf.get_variable(mesh, "a", [HIDDEN], initializer=tf.constant_initializer(a0))
  b = mtf.get_variable(mesh, "b", [HIDDEN], initializer=tf.constant_initializer(b0))
  stacked = mtf.StackedVariable([a.operation, b.operation])
  assert stacked.original_names == ["a", "b"]
  assert stacked.shape == mtf.Shape([mtf.Dimension("stacked", 2), HIDDEN])
  read = mtf.read_variable(stacked)
  assert isinstance(read.operation, mtf.ReadVariable)
  impl = _mesh_2x4("hidden:cols")
  got = lower_and_export(graph, mesh, impl, [read])[0]
  assert_close(got, np.stack([a0, b0]), "stacked initial value")
  assert_close(stacked.get_master().numpy(), np.stack([a0, b0]), "stacked master")


def test_tensor_layout_graph_and_lowering_members():
  impl = _mesh_2x4()
  layout = impl.tensor_layout(mtf.Shape([LENGTH, HIDDEN, BATCH]))
  assert tuple(layout.tensor_axis_to_mesh_axis) == (None, 1, 0)
  d1, d2 = random_array([BATCH, HIDDEN], 4), random_array([HIDDEN], 5)
  graph, mesh = new_mesh()
  v1 = mtf.get_variable(mesh, "v1", [BATCH, HIDDEN], initializer=tf.zeros_initializer())
  v2 = mtf.get_variable(mesh, "v2", [HIDDEN], initializer=tf.zeros_initializer())
  x = mtf.import_tf_tensor(mesh, d1, [BATCH, HIDDEN])
  y = mtf.exp(x)
  new_ops, mapping = graph.clone_operations([y.operation], {x: x * 2.0})
  assert len(new_ops) == 1 and mapping[y] is new_ops[0].outputs[0]
  combined = graph.combine_assignments(
      [mtf.assign(v1, mapping[y]), mtf.assign(v2, mtf.import_tf_tensor(mesh, d2, [HIDDEN])),
       mtf.assign_add(v2, mtf.ones(mesh, [HIDDEN]))])
  assert len(combined) == 2
  assert graph.rewrite_stack_variables() is None  # variables stay as they are
  lowering = mtf.Lowering(graph, {mesh: impl})
  for op in combined:
    lowering.lowered_operation(op)
  lowering.add_counter("my_counter", 3)
  assert lowering.counters["my_counter"] == 3
  assert lowering.laid_out_size(tensor=x) == 64
  got = lower_and_export(graph, mesh, impl, [v1, v2])
  assert_close(got[0], np.exp(2.0 * d1), "cloned exp", rtol=1e-5)
  assert_close(got[1], d2 + 1.0, "combined assigns")


def test_slicing_operation_classes_with_the_original_arguments():
  x_np = random_array([BATCH, LENGTH, HIDDEN], 6)
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, LENGTH, HIDDEN])
  sliced = mtf.SliceOperation(x, 1, 2, "length").outputs[0]
  padded = mtf.PadOperation(x, [1, 2], "length").outputs[0]
  concat = mtf.ConcatOperation([x, x], "length").outputs[0]
  parts = mtf.SplitOperation(x, LENGTH, [1, 3]).outputs
  stacked = mtf.StackOperation([x, x], "pair", 1).outputs[0]
  unstacked = mtf.UnstackOperation(x, LENGTH).outputs
  got = lower_and_export(graph, mesh, _mesh_2x4(),
                         [sliced, padded, concat, parts[1], stacked, unstacked[2]])
  expected = [x_np[:, 1:3], np.pad(x_np, [[0, 0], [1, 2], [0, 0]]),
              np.concatenate([x_np, x_np], 1), x_np[:, 1:], np.stack([x_np, x_np], 1),
              x_np[:, 2]]
  for g, e in zip(got, expected):
    assert_close(g, e, "slicing op")
  # The dim each of them needs whole is unsplittable, the rest splittable.
  for op in (sliced, padded, concat, parts[0], unstacked[0]):
    assert "length" in op.operation.unsplittable_dims
    assert {"batch", "hidden"} <= op.operation.splittable_dims


def test_every_op_answers_splittability():
  graph, _, _, _ = every_op_program.build_program()
  assert len(graph.operations) > 30
  for op in graph.operations:
    dims = set()
    for t in op.inputs + op.outputs:
      dims.update(t.shape.dimension_names)
    split, whole = set(op.splittable_dims), set(op.unsplittable_dims)
    assert split | whole == dims and not split & whole, op.name


def test_lazy_laid_out_values():
  impl = _mesh_2x4()
  pnums = impl.slicewise(lambda p: tf.cast(p, tf.float32), impl.laid_out_pnum())
  lazy = mtf.LazyAllreduceSum(impl, pnums, [1])
  other = mtf.LazyAllreduceSum(impl, pnums, [1])
  assert mtf.compatible_lazy_allreduce_sums([lazy, other])
  assert not mtf.compatible_lazy_allreduce_sums([lazy, mtf.LazyAllreduceSum(impl, pnums,
                                                                            [0])])
  summed = [t.numpy() for t in lazy.to_laid_out_tensor().tensor_list]
  assert summed == [0 + 1 + 2 + 3] * 4 + [4 + 5 + 6 + 7] * 4
  calls = []
  deferred = mtf.LazyLaidOutTensor(lambda: calls.append(1) or pnums, [])
  assert deferred.slice_shape == [] and not calls
  concrete = mtf.convert_args_to_laid_out_tensors([deferred, lazy, pnums])
  assert calls == [1] and concrete[0] is pnums and concrete[2] is pnums


def test_simd_mesh_impl_extras():
  impl = mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols")
  assert impl.pnum_tensor.numpy().tolist() == list(range(8))
  full = random_array([BATCH, HIDDEN], 7)
  slices = impl.slice(full, mtf.Shape([BATCH, HIDDEN])).numpy()
  assert slices.shape == (8, 4, 2)
  assert_close(slices[5], full[4:8, 2:4], "slice of core 5")
  x = impl.import_tf_tensor(mtf.import_tf_tensor(new_mesh()[1], full, [BATCH, HIDDEN]),
                            full)
  stacked = impl.allconcat(x, 1, 1, stack=True).one_slice.numpy()
  assert stacked.shape == (8, 4, 4, 2)
  assert_close(stacked[5], full[4:8].reshape(4, 4, 2).transpose(0, 1, 2), "stacked")
  r = impl.random(mtf.Shape([BATCH, HIDDEN]), tf.random.uniform, {"maxval": 2.0})
  assert r.one_slice.shape == (8, 4, 2) and r.one_slice.numpy().max() < 2.0
