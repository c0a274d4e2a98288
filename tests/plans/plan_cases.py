"""Plan checks that need no TensorFlow: shapes and a MeshLayout in, steps and bytes out.

test_plans.py runs every `case_*` here in-process and again in an interpreter where
TensorFlow cannot be imported (tf_free), which proves mesh_tf.plans is pure.
"""
from mesh_tf.errors import LayoutError
from mesh_tf.plans import rules
from mesh_tf.plans.steps import (Allconcat, Allreduce, Allsplit, Alltoall, Operand,
                                 Receive)
from mesh_tf.shapes.mesh_layout import MeshLayout
from mesh_tf.shapes.shape import convert_to_shape as shape

F32 = 4


def _records(layout, plan, ins, outs):
  return plan.records(layout, [shape(s) for s in ins], [shape(s) for s in outs],
                      [F32] * len(ins), [F32] * len(outs), op="op")


def case_einsum_contracting_a_split_dim_owes_a_sum():
  ml = MeshLayout("rows:2;cols:4", "batch:rows;hidden:cols")
  x, w, y = "batch:8;hidden:12", "hidden:12;ff:6", "batch:8;ff:6"
  plan = rules.einsum_plan(ml, [shape(x), shape(w)], shape(y))
  assert plan.operands == [Operand(0, []), Operand(1, [])], plan
  assert plan.outputs == [[Allreduce((1,), "SUM", True)]], plan
  # local einsum over batch 4, hidden 3, ff 6
  assert plan.flops == 2.0 * 4 * 3 * 6
  records, owed = _records(ml, plan, [x, w], [y])
  assert records == []
  assert (owed[0].kind, owed[0].mesh_axes, owed[0].group_size, owed[0].slice_bytes) == (
      "allreduce", (1,), 4, 4 * 6 * F32)


def case_einsum_gathers_a_dim_sharing_a_mesh_axis_with_the_output():
  # ff and hidden (never in one tensor) both on cols: the output keeps ff split, so the
  # contracted hidden must be whole.
  ml = MeshLayout("cols:4", "hidden:cols;ff:cols")
  x, z, y = "batch:8;hidden:12", "batch:8;ff:8", "batch:8;ff:8"
  plan = rules.einsum_plan(ml, [shape(x), shape(z)], shape(y))
  assert plan.operands == [Operand(0, [Allconcat("hidden", 0)]), Operand(1, [])]
  assert plan.outputs == [[]]
  records, _ = _records(ml, plan, [x, z], [y])
  assert [(r.kind, r.group_size, r.slice_bytes) for r in records] == [
      ("allconcat", 4, 8 * 3 * F32)]


def case_reduce_allreduces_the_reduced_split_dims_in_dim_order():
  ml = MeshLayout("rows:2;cols:4", "batch:cols;hidden:rows")
  plan = rules.reduce_plan(ml, shape("batch:8;hidden:4;d:3"), shape("d:3"), "MAX")
  assert plan.outputs == [[Allreduce((1, 0), "MAX")]]
  records, owed = _records(ml, plan, ["batch:8;hidden:4;d:3"], ["d:3"])
  assert owed == [None] and records[0].slice_bytes == 3 * F32
  assert records[0].group_size == 8


def case_reshape_moving_a_split_is_one_alltoall():
  # The MoE dispatch: [experts_unsplit, groups, ...] -> [experts, groups_unsplit, ...],
  # groups and experts on one mesh dim.
  ml = MeshLayout("all:8", "batch:all;experts:all")
  old = "outer_batch:1;expert_unsplit:8;batch:16;expert_capacity:4;d_model:8"
  new = "outer_batch:1;experts:8;batch_unsplit:16;expert_capacity:4;d_model:8"
  plan = rules.reshape_plan(ml, shape(old), shape(new))
  assert plan.operands == [Operand(0, [Alltoall(0, "expert_unsplit", "batch")])], plan
  assert plan.outputs == [[]]
  records, _ = _records(ml, plan, [old], [new])
  slice_bytes = 8 * 2 * 4 * 8 * F32
  assert [(r.kind, r.mesh_axes, r.group_size, r.slice_bytes) for r in records] == [
      ("alltoall", (0,), 8, slice_bytes)]
  back = rules.reshape_plan(ml, shape(new), shape(old))
  assert back.operands[0].steps == [Alltoall(0, "batch_unsplit", "experts")]


def case_reshape_keeps_a_split_with_the_same_prefix():
  # [batch=8, length=16] -> [batch=16, group=8]: batch starts the flat order in both.
  ml = MeshLayout("rows:2", "batch:rows")
  plan = rules.reshape_plan(ml, shape("batch:8;length:16;d:4"),
                            shape("batch:16;group:8;d:4"))
  assert plan.operands[0].steps == [] and plan.outputs == [[]]


def case_reshape_without_a_target_dim_gathers_and_cuts():
  # m splits dim "a" (prefix 1) in the old shape and "b" (prefix 3) in the new one; the
  # old shape has no whole dim with prefix 3, so the split is gathered and cut after.
  ml = MeshLayout("m:2", "a:m;b:m")
  plan = rules.reshape_plan(ml, shape("a:2;c:6"), shape("x:3;b:4"))
  assert plan.operands[0].steps == [Allconcat("a", 0)]
  assert plan.outputs == [[Allsplit("b", 0)]]
  records, _ = _records(ml, plan, ["a:2;c:6"], ["x:3;b:4"])
  assert [(r.kind, r.slice_bytes) for r in records] == [("allconcat", 6 * F32)]
  # with a whole dim at the new prefix (c, prefix 2), the split moves instead
  moved = rules.reshape_plan(ml, shape("a:2;c:6"), shape("x:2;b:6"))
  assert moved.operands[0].steps == [Alltoall(0, "c", "a")] and moved.outputs == [[]]


def case_shift_by_less_than_a_slice_receives_the_neighbour():
  ml = MeshLayout("cols:4", "length:cols")
  plan = rules.shift_plan(ml, shape("batch:2;length:8"), "length", 1, False)
  assert plan.operands == [Operand(0, []), Operand(0, [Receive(0, (None, 0, 1, 2))])]
  records, _ = _records(ml, plan, ["batch:2;length:8"], ["batch:2;length:8"])
  assert [(r.kind, r.slice_bytes) for r in records] == [("receive", 2 * 2 * F32)]
  wide = rules.shift_plan(ml, shape("batch:2;length:8"), "length", -3, True)
  assert wide.operands == [Operand(0, [Allconcat("length", 0)])]
  assert wide.outputs == [[Allsplit("length", 0)]]
  assert rules.shift_sources(4, -1, True) == (1, 2, 3, 0)


def case_gather_owes_a_sum_and_rejects_one_axis_on_both_inputs():
  ml = MeshLayout("cols:4", "vocab:cols")
  vocab = shape("vocab:16").dims[0]
  plan = rules.gather_plan(ml, "embed", shape("vocab:16;d:8"), shape("batch:4"), vocab,
                           shape("batch:4;d:8"))
  assert plan.outputs == [[Allreduce((0,), "SUM", True)]]
  grad = rules.gather_grad_plan(MeshLayout("cols:4", "batch:cols"), "embed_grad",
                                shape("batch:4;d:8"), shape("batch:4"),
                                shape("vocab:16;d:8"), vocab)
  assert grad.outputs == [[Allreduce((0,), "SUM", True)]]
  try:
    rules.gather_plan(MeshLayout("cols:4", "vocab:cols;batch:cols"), "embed",
                      shape("vocab:16;d:8"), shape("batch:4"), vocab, shape("batch:4;d:8"))
  except LayoutError as e:
    assert "embed" in str(e) and "vocab" in str(e), e
  else:
    raise AssertionError("no LayoutError")


def case_add_n_of_partial_sums_owing_one_allreduce_owes_it_once():
  ml = MeshLayout("cols:4", "hidden:cols")
  lazy = rules.add_n_plan(ml, shape("batch:8"), [(0,), (0,), (0,)])
  assert lazy.reads_partial_sums and lazy.outputs == [[Allreduce((0,), "SUM", True)]]
  mixed = rules.add_n_plan(ml, shape("batch:8"), [(0,), None])
  assert not mixed.reads_partial_sums and mixed.outputs == [[]]


def case_slicewise_gathers_unsplittable_dims_and_cuts_them_after():
  ml = MeshLayout("rows:2;cols:4", "batch:rows;length:cols")
  plan = rules.whole_dims_plan(ml, [shape("batch:4;length:8")], [shape("batch:4;length:8")],
                               {"length"})
  assert plan.operands == [Operand(0, [Allconcat("length", 1)])]
  assert plan.outputs == [[Allsplit("length", 1)]]




def case_top_k_gathers_k_candidates_per_processor():
  ml = MeshLayout("rows:2;cols:4", "batch:rows;hidden:cols")
  x = shape("batch:4;hidden:16")
  hidden, k = x.dims[1], shape("k:3").dims[0]
  plan = rules.top_k_plan(ml, x, hidden, k, F32)
  assert [m.steps for m in plan.middle] == [[Allconcat("k", 1)]] * 2
  records, _ = _records(ml, plan, ["batch:4;hidden:16"], ["batch:4;k:3"] * 2)
  # each processor holds 2 rows x 3 candidates of its 4 hidden values, as f32 and int32
  assert [(r.kind, r.group_size, r.slice_bytes) for r in records] == [
      ("allconcat", 4, 2 * 3 * F32), ("allconcat", 4, 2 * 3 * 4)]


CASES = sorted(name for name in dir() if name.startswith("case_"))
