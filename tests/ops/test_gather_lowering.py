"""mtf.gather as a local tf.gather and its gradient as a segment sum (mesh_tf/ops/gather.py).

Values and gradients are compared with plain TF on one device on every mesh/layout case;
the lowered step is checked to hold no one-hot, and the cost model to predict exactly the
bytes the lowering sends, with the gathered dim split or not.
"""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import analysis
from mesh_tf.errors import LayoutError
from mtf_testing import (BATCH, CLASSES, HIDDEN, LENGTH, assert_simd_replays_like_one_device,
                         check_against_tf, new_mesh, random_array, random_ints)


def test_gather_middle_dim_out_of_range_and_output_shape(mesh_impl):
  w = random_array([BATCH, HIDDEN, CLASSES], 1)
  idx = np.array([7, -1, 3], np.int32)  # -1 is outside [0, 8): zeros, no gradient
  idx_big = np.array([8, 0, 0], np.int32)  # 8 too; 0 twice accumulates gradient

  def one_hot_ref(a, i):  # plain TF: zeros outside the range, as a one-hot lookup
    return tf.einsum("lh,bhc->lbc", tf.one_hot(i, 8), a)
  check_against_tf(
      mesh_impl, [(w, [BATCH, HIDDEN, CLASSES]), (w, [BATCH, HIDDEN, CLASSES]),
                  (idx, [LENGTH]), (idx_big, [LENGTH])],
      lambda a, b, i, j: [mtf.gather(a, i, HIDDEN),
                          mtf.gather(b, j, HIDDEN, output_shape=[CLASSES, LENGTH, BATCH])],
      lambda a, b, i, j: [one_hot_ref(a, i),
                          tf.transpose(one_hot_ref(b, j), [2, 0, 1])],
      labels=["gather along the middle dim", "gather with a permuted output_shape"],
      input_labels=["weights", "weights", "indices", "indices"])


def test_batched_gather_falls_back_to_one_hot(mesh_impl):
  w = random_array([BATCH, HIDDEN], 2)
  idx = random_ints([BATCH, LENGTH], 3, 0, 8)
  check_against_tf(
      mesh_impl, [(w, [BATCH, HIDDEN]), (idx, [BATCH, LENGTH])],
      lambda a, i: [mtf.gather(a, i, HIDDEN)],
      lambda a, i: [tf.gather(a, i, batch_dims=1)],
      labels=["gather sharing the batch dim"], input_labels=["weights", "indices"])


def _lm_like(graph, mesh):
  """An embedding lookup, a loss and its gradient (dims as in a language model)."""
  emb = mtf.get_variable(mesh, "emb", [HIDDEN, CLASSES], initializer=(
      tf.constant_initializer(random_array([HIDDEN, CLASSES], 4))))
  ids = mtf.import_tf_tensor(mesh, random_ints([BATCH, LENGTH], 5, 0, 8), [BATCH, LENGTH])
  loss = mtf.reduce_sum(mtf.square(mtf.gather(emb, ids, HIDDEN)))
  grad, = mtf.gradients([loss], [emb])
  return emb, loss, grad


def test_gather_and_its_gradient_emit_no_one_hot():
  graph, mesh = new_mesh()
  _, _, grad = _lm_like(graph, mesh)
  kinds = [type(op).__name__ for op in graph.operations]
  assert "GatherOperation" in kinds and "GatherGradOperation" in kinds
  assert "OneHotOperation" not in kinds
  impl = mtf.PlacementMeshImpl("all:8", "batch:all", ["/cpu:%d" % i for i in range(8)])

  @tf.function
  def run():
    return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(grad)
  tf_ops = {op.type for op in run.get_concrete_function().graph.get_operations()}
  assert {"GatherV2", "UnsortedSegmentSum"} <= tf_ops
  assert "OneHot" not in tf_ops


@pytest.mark.parametrize("mesh_shape,rules", [
    ("all:8", "batch:all"), ("all:8", "hidden:all"), ("rows:2;cols:4", "hidden:rows"),
    ("rows:2;cols:4", "batch:rows;hidden:cols"), ("rows:2;cols:4", "batch:cols;hidden:rows"),
    ("rows:2;cols:4", "classes:cols"),
])
def test_cost_model_predicts_the_gather_bytes(mesh_shape, rules):
  graph, mesh = new_mesh()
  _, loss, grad = _lm_like(graph, mesh)
  n = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.PlacementMeshImpl(mesh_shape, rules, ["/cpu:%d" % i for i in range(n)])
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.export_to_tf_tensor(loss)
  lowering.export_to_tf_tensor(grad)
  measured = analysis.total_bytes_per_processor(impl.comm_log)
  cost = analysis.estimate_cost(graph, mesh_shape, rules, fetches=[loss, grad])
  assert not cost.unmodelled_ops
  assert measured == cost.comm_bytes_per_processor
  gathers = [r for r in impl.comm_log if r.op.startswith("gather")]
  # The gathered dim split (hidden) or the indices split (batch) costs an
  # allreduce; otherwise (classes split) the lookup and its gradient are local.
  assert bool(gathers) == any(r in rules for r in ("hidden", "batch"))


def test_gather_on_simd_emulation_equals_one_device():
  """Replicated and per-core tables; the lookup and the segment sum replay on the compact
  tensors (no tf.vectorized_map fallback)."""
  def build():
    graph, mesh = new_mesh()
    _, loss, grad = _lm_like(graph, mesh)
    return graph, mesh, [loss, grad]
  assert_simd_replays_like_one_device(build, [
      mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols"),
      mtf.SimdMeshImpl("rows:2;cols:4", "batch:cols")])


def test_gather_along_a_later_dim_on_simd_equals_one_device():
  """A lookup along a dim that is not the table's first (a decoding step reading one
  position of [batch, length] ids) from a table every core shares, and from a split one:
  one tf.gather along that axis."""
  def build():
    graph, mesh = new_mesh()
    table = mtf.import_tf_tensor(mesh, random_array([CLASSES, HIDDEN], 6), [CLASSES, HIDDEN])
    ids = mtf.import_tf_tensor(mesh, random_ints([BATCH, LENGTH], 7, 0, 8), [BATCH, LENGTH])
    looked_up = mtf.gather(table, ids, HIDDEN)  # [batch, length, classes]
    return graph, mesh, [looked_up, mtf.reduce_sum(looked_up)]
  assert_simd_replays_like_one_device(build, [
      mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows"),
      mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows;classes:cols")])


def test_gather_split_on_the_indices_mesh_axis_is_a_layout_error():
  graph, mesh = new_mesh()
  _, loss, _ = _lm_like(graph, mesh)
  impl = mtf.PlacementMeshImpl("all:8", "batch:all;hidden:all",
                               ["/cpu:%d" % i for i in range(8)])
  with pytest.raises(LayoutError, match="gather.*hidden"):
    mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(loss)
