"""while_loop (mesh_tf/ops/control_flow.py) against a plain-TF loop, eagerly and traced."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, LENGTH, assert_close, new_mesh, random_array

X_SHAPE = [BATCH, HIDDEN]
HIDDEN_OUT = mtf.Dimension("hidden_out", 8)


def _loop_graph():
  """x is halved-and-mixed with w until its total is small, counting steps, and with
  accumulators summing a [length, hidden] product and a scalar over iterations."""
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0, 1.0, 3.0), X_SHAPE)
  w = mtf.import_tf_tensor(mesh, random_array([HIDDEN, HIDDEN_OUT], 1, 0.0, 0.2),
                           [HIDDEN, HIDDEN_OUT])
  v = mtf.import_tf_tensor(mesh, random_array([LENGTH, BATCH], 2), [LENGTH, BATCH])

  def cond(i, y):
    return mtf.logical_and(mtf.less(i, 10), mtf.greater(mtf.reduce_sum(y), 20.0))

  def body(i, y):
    # Reads w and v from outside the loop; hidden is contracted (an allreduce if split).
    mixed = mtf.rename_dimension(mtf.einsum([y, w], [BATCH, HIDDEN_OUT]), "hidden_out",
                                 "hidden")
    new_y = mtf.relu(mixed) * 0.5 + y * 0.25
    return [i + 1, new_y, mtf.einsum([v, new_y], [LENGTH, HIDDEN]), mtf.reduce_max(new_y)]
  i0 = mtf.constant(mesh, 0, dtype=tf.int32)
  outs = mtf.while_loop(cond, body, [i0, x], has_accumulators=True)
  return graph, mesh, outs


def _tf_loop():
  x = tf.constant(random_array(X_SHAPE, 0, 1.0, 3.0))
  w = tf.constant(random_array([HIDDEN, HIDDEN_OUT], 1, 0.0, 0.2))
  v = tf.constant(random_array([LENGTH, BATCH], 2))
  i, acc, peak = 0, tf.zeros([3, 8]), tf.zeros([])
  while i < 10 and float(tf.reduce_sum(x)) > 20.0:
    x = tf.nn.relu(x @ w) * 0.5 + x * 0.25
    acc += v @ x
    peak += tf.reduce_max(x)
    i += 1
  return [np.int32(i), x, acc, peak]


def test_while_loop_eager(mesh_impl):
  graph, mesh, outs = _loop_graph()
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  got = [lowering.export_to_tf_tensor(t).numpy() for t in outs]
  ref = _tf_loop()
  assert 2 <= ref[0] < 10, "the test loop should stop on its condition"
  for g, r, what in zip(got, ref, ["counter", "loop var", "accumulator", "scalar acc"]):
    assert_close(g, np.asarray(r), what, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("jit", [False, True], ids=["tf.function", "xla"])
def test_while_loop_in_tf_function(make_mesh_impl, jit):
  graph, mesh, outs = _loop_graph()
  impl = make_mesh_impl() if jit else make_mesh_impl("rows:2;cols:4",
                                                      "batch:rows;hidden:cols")

  @tf.function(jit_compile=jit)
  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(t) for t in outs]
  for g, r in zip(run(), _tf_loop()):
    assert_close(g.numpy(), np.asarray(r), "traced loop", rtol=1e-5, atol=1e-5)


def test_while_loop_maximum_iterations_and_num_loop_vars(mesh_impl):
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 3), X_SHAPE)
  y = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 4), X_SHAPE)
  # cond never fails; maximum_iterations stops the loop after 3 rounds. Only the first
  # loop var is returned (num_loop_vars=1), but the second still feeds the body.
  out = mtf.while_loop(lambda a, b: mtf.greater(mtf.reduce_sum(a * 0.0), -1.0),
                       lambda a, b: [mtf.shift(a, 1, BATCH, wrap=True) + b, b * 2.0],
                       [x, y], num_loop_vars=1, maximum_iterations=3)
  assert len(out) == 1
  got = mtf.Lowering(graph, {mesh: mesh_impl}).export_to_tf_tensor(out[0]).numpy()
  a, b = random_array(X_SHAPE, 3), random_array(X_SHAPE, 4)
  for _ in range(3):
    a, b = np.roll(a, 1, 0) + b, b * 2.0
  assert_close(got, a, "3 iterations")


def test_while_loop_that_never_runs(make_mesh_impl):
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 5), X_SHAPE)
  out = mtf.while_loop(lambda a: mtf.less(mtf.reduce_sum(a), -1e9),
                       lambda a: [a * 2.0, mtf.reduce_sum(a, reduced_dim=BATCH)], [x],
                       has_accumulators=True)
  lowering = mtf.Lowering(graph, {mesh: make_mesh_impl("all:8", "hidden:all")})
  assert_close(lowering.export_to_tf_tensor(out[0]).numpy(), random_array(X_SHAPE, 5),
               "unchanged loop var")
  assert_close(lowering.export_to_tf_tensor(out[1]).numpy(), np.zeros([8], np.float32),
               "empty accumulator")


def test_while_loop_has_no_gradient():
  graph, mesh = new_mesh()
  w = mtf.get_variable(mesh, "w", X_SHAPE)
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 6), X_SHAPE)
  out = mtf.while_loop(lambda a: mtf.less(mtf.reduce_sum(a), 100.0),
                       lambda a: [a + w], [x])  # w is read from outside the loop
  assert isinstance(out[0].operation, mtf.WhileLoopOperation)
  with pytest.raises(mtf.MtfError, match="while_loop .* has no gradient"):
    mtf.gradients([mtf.reduce_sum(out[0])], [w])
  with pytest.raises(mtf.MtfError, match="no gradient"):
    mtf.gradients([mtf.reduce_sum(out[0])], [x])
  assert graph.operations[-1] is not out[0].operation  # reduce ops came after


def test_while_loop_errors():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  num_ops = len(graph.operations)
  is_small = lambda a: mtf.less(mtf.reduce_sum(a), 1.0)
  with pytest.raises(mtf.ShapeError, match="scalar bool"):
    mtf.while_loop(lambda a: mtf.reduce_sum(a), lambda a: [a], [x])
  with pytest.raises(mtf.ShapeError, match="returned 2 tensors for 1 loop variables"):
    mtf.while_loop(is_small, lambda a: [a, a], [x])
  with pytest.raises(mtf.ShapeError, match="loop variable 0 is"):
    mtf.while_loop(is_small, lambda a: [mtf.reduce_sum(a, reduced_dim=BATCH)], [x])
  with pytest.raises(mtf.ShapeError, match="not an mtf.Tensor"):
    mtf.while_loop(is_small, lambda a: [a], [1.0])
  with pytest.raises(mtf.ShapeError, match="num_loop_vars"):
    mtf.while_loop(is_small, lambda a: [a], [x], num_loop_vars=2)
  assert len(graph.operations) == num_ops  # failed loops leave no ops in the graph


def test_random_ops_in_the_body_draw_per_iteration(make_mesh_impl):
  def build():
    graph, mesh = new_mesh()
    x = mtf.zeros(mesh, X_SHAPE)
    out = mtf.while_loop(
        lambda i, a: mtf.less(i, 3),
        lambda i, a: [i + 1, a, mtf.random_uniform(mesh, X_SHAPE, seed=5)],
        [mtf.constant(mesh, 0, dtype=tf.int32), x], has_accumulators=True)
    first = mtf.random_uniform(mesh, X_SHAPE, seed=5)  # the same op seed, drawn once
    return graph, mesh, [out[2], first]
  graph, mesh, tensors = build()
  eager = mtf.Lowering(graph, {mesh: make_mesh_impl()})
  eager_sum = eager.export_to_tf_tensor(tensors[0]).numpy()
  single = eager.export_to_tf_tensor(tensors[1]).numpy()
  graph, mesh, tensors = build()
  impl = make_mesh_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  traced = tf.function(lambda: mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(
      tensors[0]))()
  # The noise is layout-independent and fresh in each iteration, eagerly or traced.
  assert_close(traced.numpy(), eager_sum, "sum of 3 draws", rtol=1e-6)
  assert not np.allclose(eager_sum, 3 * single, atol=0.1)
  assert 1.0 < eager_sum.mean() < 2.0
