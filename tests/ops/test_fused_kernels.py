"""softmax / log_softmax / reduce_logsumexp as one fused op (mesh_tf/ops/fused_softmax.py),
and reduce_mean as TF's Mean per slice.

Values and gradients on every mesh case are in test_reduce.py; here: the fused TF kernel is
what runs when the reduced dim is whole, the split case sends exactly the bytes of the
composite of reductions (and the cost model predicts them), rank 6 works (the CPU kernels
stop at rank 5), and the SIMD emulation replays the kernels without a fallback.
"""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import analysis
from mesh_tf.autodiff.gradients import stop_gradient
from mtf_testing import (BATCH, CLASSES, HIDDEN, LENGTH, assert_simd_replays_like_one_device,
                         check_against_tf, new_mesh, random_array)

SHAPE = [BATCH, LENGTH, HIDDEN, CLASSES]
DEVICES = ["/cpu:%d" % i for i in range(8)]


def _composite_log_softmax(x, dim):
  """x - logsumexp(x) written with mtf reductions (the unfused form)."""
  reduced = x.shape - [dim]
  top = mtf.reduce_max(stop_gradient(x), output_shape=reduced)
  total = mtf.reduce_sum(mtf.exp(x - top), output_shape=reduced)
  return x - (mtf.log(total) + top)


def _loss_and_grad(make, dim):
  graph, mesh = new_mesh()
  w = mtf.get_variable(mesh, "w", SHAPE, initializer=tf.constant_initializer(
      random_array(SHAPE, 3)))
  target = mtf.import_tf_tensor(mesh, random_array(SHAPE, 4), SHAPE)
  loss = mtf.reduce_sum(make(w, dim) * target)
  grad, = mtf.gradients([loss], [w])
  return graph, mesh, loss, grad


@pytest.mark.parametrize("mesh_shape,rules", [
    ("all:8", "batch:all"), ("all:8", "hidden:all"),
    ("rows:2;cols:4", "batch:rows;hidden:cols"), ("rows:2;cols:4", "classes:cols;hidden:rows")])
def test_split_dim_sends_the_bytes_of_the_composite(mesh_shape, rules):
  sent, values = [], []
  for make in (mtf.log_softmax, _composite_log_softmax):
    graph, mesh, loss, grad = _loss_and_grad(make, HIDDEN)
    impl = mtf.PlacementMeshImpl(mesh_shape, rules, DEVICES)
    lowering = mtf.Lowering(graph, {mesh: impl})
    values.append([lowering.export_to_tf_tensor(t).numpy() for t in (loss, grad)])
    measured = analysis.total_bytes_per_processor(impl.comm_log)
    cost = analysis.estimate_cost(graph, mesh_shape, rules, fetches=[loss, grad])
    assert not cost.unmodelled_ops
    assert measured == cost.comm_bytes_per_processor
    sent.append(measured)
  assert sent[0] == sent[1], sent
  for fused, composite in zip(*values):
    np.testing.assert_allclose(fused, composite, rtol=1e-5, atol=1e-5)


def _tf_op_types(graph, mesh, impl, tensors):
  @tf.function
  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(t) for t in tensors]
  return {op.type for op in run.get_concrete_function().graph.get_operations()}


def test_whole_dim_runs_the_fused_kernels():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(SHAPE, 5), SHAPE)
  outs = [mtf.softmax(x, CLASSES), mtf.log_softmax(x, HIDDEN),
          mtf.reduce_logsumexp(x, LENGTH)]
  kinds = {type(t.operation).__name__ for t in outs}
  assert kinds == {"FusedSoftmaxOperation"}
  impl = mtf.PlacementMeshImpl("all:8", "batch:all", DEVICES)
  tf_ops = _tf_op_types(graph, mesh, impl, outs)
  assert {"Softmax", "LogSoftmax"} <= tf_ops
  impl = mtf.PlacementMeshImpl("all:8", "hidden:all", DEVICES)
  graph, mesh, outs = _graph_with_softmax(HIDDEN)
  split = _tf_op_types(graph, mesh, impl, outs)
  assert "Softmax" not in split  # the split dim takes the two-allreduce path


def _graph_with_softmax(dim):
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(SHAPE, 6), SHAPE)
  return graph, mesh, [mtf.softmax(x, dim)]


@pytest.mark.parametrize("fn,tf_fn", [(mtf.softmax, tf.nn.softmax),
                                      (mtf.log_softmax, tf.nn.log_softmax)])
def test_rank_six_matches_tf_on_a_2d_view(fn, tf_fn):
  dims = [mtf.Dimension("d%d" % i, n) for i, n in enumerate([2, 3, 2, 2, 3, 4])]
  value = random_array(dims, 7)
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, value, dims)
  outs = [fn(x, dims[2]), fn(x, dims[5])]
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", [""])})
  got = [lowering.export_to_tf_tensor(t).numpy() for t in outs]
  moved = np.moveaxis(value, 2, -1)
  want_mid = np.moveaxis(tf_fn(moved.reshape(-1, 2)).numpy().reshape(moved.shape), -1, 2)
  want_last = tf_fn(value.reshape(-1, 4)).numpy().reshape(value.shape)
  np.testing.assert_allclose(got[0], want_mid, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[1], want_last, rtol=1e-5, atol=1e-6)


def test_simd_emulation_replays_the_kernels():
  def build():
    graph, mesh, loss, grad = _loss_and_grad(mtf.softmax, HIDDEN)
    return graph, mesh, [loss, grad]
  assert_simd_replays_like_one_device(build, [
      mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols"),
      mtf.SimdMeshImpl("rows:2;cols:4", "batch:rows;classes:cols"),
      mtf.SimdMeshImpl("rows:2;cols:4", "hidden:rows;classes:cols")])


@pytest.mark.parametrize("mesh_shape,rules", [
    ("all:8", "batch:all"), ("rows:2;cols:4", "batch:rows;hidden:cols")])
def test_reduce_mean_is_one_mean_kernel_with_the_bytes_of_a_sum(mesh_shape, rules):
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(SHAPE, 8), SHAPE)
  means = [mtf.reduce_mean(x, reduced_dim=BATCH), mtf.reduce_mean(x, reduced_dim=CLASSES),
           mtf.reduce_mean(x)]
  sums = [mtf.reduce_sum(x, reduced_dim=BATCH), mtf.reduce_sum(x, reduced_dim=CLASSES),
          mtf.reduce_sum(x)]
  sent = []
  for outs in (means, sums):
    n = mtf.convert_to_shape(mesh_shape).size
    impl = mtf.PlacementMeshImpl(mesh_shape, rules, DEVICES[:n])
    lowering = mtf.Lowering(graph, {mesh: impl})
    got = [lowering.export_to_tf_tensor(t).numpy() for t in outs]
    sent.append(analysis.total_bytes_per_processor(impl.comm_log))
    cost = analysis.estimate_cost(graph, mesh_shape, rules, fetches=outs)
    assert sent[-1] == cost.comm_bytes_per_processor
  value = random_array(SHAPE, 8)
  for g, want in zip(got, [value.sum(0), value.sum(3), value.sum()]):
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
  assert sent[0] == sent[1] > 0, sent
  impl = mtf.PlacementMeshImpl(mesh_shape, rules, DEVICES[:n])
  tf_ops = _tf_op_types(graph, mesh, impl, means)
  assert "Mean" in tf_ops and "Sum" not in tf_ops


@pytest.mark.parametrize("dim,axis", [(HIDDEN, 2), (BATCH, 0)], ids=["hidden", "batch"])
def test_softmax_cross_entropy_matches_tf(mesh_impl, dim, axis):
  """Soft targets (distributions over dim: TF's kernel differentiates as if they sum to
  1), so the gradient reaches both inputs; split or whole dim by case."""
  logits, targets = random_array(SHAPE, 9, -4.0, 4.0), random_array(SHAPE, 10, 0.1, 1.0)
  targets /= targets.sum(axis, keepdims=True)
  check_against_tf(
      mesh_impl, [(logits, SHAPE), (targets, SHAPE)],
      lambda l, t: [mtf.layers.softmax_cross_entropy_with_logits(l, t, dim)],
      lambda l, t: [tf.nn.softmax_cross_entropy_with_logits(labels=t, logits=l, axis=axis)],
      labels=["cross-entropy"], input_labels=["logits", "targets"])



@pytest.mark.parametrize("mesh_shape,rules", [("", ""), ("all:8", "hidden:all"),
                                              ("rows:2;cols:4", "hidden:cols")])
def test_logsumexp_of_infinite_rows_matches_tf(mesh_shape, rules):
  """A row of all -inf has logsumexp -inf and one with +inf has +inf, split or whole."""
  x = random_array([BATCH, HIDDEN], 5)
  x[0, :] = -np.inf
  x[1, 3] = np.inf
  graph, mesh = new_mesh()
  xt = mtf.import_tf_tensor(mesh, x, [BATCH, HIDDEN])
  y = mtf.reduce_logsumexp(xt, reduced_dim=HIDDEN)
  impl = mtf.PlacementMeshImpl(mesh_shape, rules, DEVICES[:max(1, len(mesh_shape) and 8)])
  got = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(y).numpy()
  np.testing.assert_allclose(got, tf.reduce_logsumexp(x, axis=1).numpy(), rtol=1e-6)
