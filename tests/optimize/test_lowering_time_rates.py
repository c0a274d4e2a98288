"""Rates that follow the global step are read by each lowered step, not frozen at build
time; and a step's updates all see the values the step started from."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from optimizer_testing import (BATCH, HIDDEN, adafactor_reference, fresh_global_step,
                               make_impl, random_values)


def _linear_model(optimizer_fn, impl, w0, jit_compile=False):
  """loss = sum(w * x), so the gradient of w is the fed x; returns a tf.function step."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", [BATCH, HIDDEN], initializer=w0)
  x = mtf.import_tf_tensor(mesh, tf.TensorSpec([8, 8]), [BATCH, HIDDEN], name="x")
  loss = mtf.reduce_sum(w * x)
  grads = mtf.gradients([loss], [w])
  ops = optimizer_fn().apply_grads(grads, [w])
  mtf.Lowering(graph, {mesh: impl})
  step = mtf.optimize.get_global_step()

  @tf.function(jit_compile=jit_compile)
  def train_step(tf_x):
    lowering = mtf.Lowering(graph, {mesh: impl}, feeds={x: tf_x})
    for op in ops:
      lowering.lowered_operation(op)
    step.assign_add(1)
  return train_step, graph


def test_callable_learning_rate_is_read_each_call():
  fresh_global_step()
  impl = make_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  w0 = random_values([BATCH, HIDDEN], 1)
  lr = lambda: 1.0 / (mtf.optimize.step_num() + 1.0)  # 1, 1/2, 1/3
  train_step, graph = _linear_model(lambda: mtf.optimize.SgdOptimizer(lr), impl, w0)
  num_ops = len(graph.operations)
  xs = [random_values([BATCH, HIDDEN], 10 + t) for t in range(3)]
  for x in xs:
    train_step(x)
  assert train_step.experimental_get_tracing_count() == 1
  assert len(graph.operations) == num_ops
  expected = w0 - xs[0] - xs[1] / 2.0 - xs[2] / 3.0
  np.testing.assert_allclose(impl.variable_store["w"].read_full().numpy(), expected,
                             rtol=1e-5, atol=1e-6)


def test_tf_variable_learning_rate_and_schedule():
  fresh_global_step()
  impl = make_impl("all:8", "hidden:all")
  w0 = random_values([BATCH, HIDDEN], 2)
  lr_var = tf.Variable(0.5)
  train_step, _ = _linear_model(lambda: mtf.optimize.MomentumOptimizer(lr_var, 0.0), impl,
                                w0)
  x = random_values([BATCH, HIDDEN], 3)
  train_step(x)
  lr_var.assign(0.25)
  train_step(x)
  np.testing.assert_allclose(impl.variable_store["w"].read_full().numpy(),
                             w0 - 0.75 * x, rtol=1e-5, atol=1e-6)

  # A schedule of learning_rate_schedules driven by the global step (now 2).
  fresh_global_step().assign(2)
  impl = make_impl("", "")
  schedule = lambda: mtf.learning_rate_schedules.linear_warmup(
      mtf.optimize.get_global_step(), 100, steps_or_fraction=4)
  train_step, _ = _linear_model(lambda: mtf.optimize.SgdOptimizer(schedule), impl, w0)
  train_step(x)  # rate 2/4
  train_step(x)  # rate 3/4
  np.testing.assert_allclose(impl.variable_store["w"].read_full().numpy(),
                             w0 - 1.25 * x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mesh_shape,layout,jit", [
    ("rows:2;cols:4", "batch:rows;hidden:cols", False), ("", "", True)])
def test_default_adafactor_rates_advance_inside_tf_function(mesh_shape, layout, jit):
  fresh_global_step()
  impl = make_impl(mesh_shape, layout)
  w0 = random_values([BATCH, HIDDEN], 4)
  train_step, _ = _linear_model(mtf.optimize.AdafactorOptimizer, impl, w0, jit_compile=jit)
  xs = [random_values([BATCH, HIDDEN], 20 + t) for t in range(3)]
  for x in xs:
    train_step(x)
  ref_w, slots = adafactor_reference(w0, xs)
  np.testing.assert_allclose(impl.variable_store["w_slot_v"].read_full().numpy(),
                             slots["v"], rtol=1e-5)
  np.testing.assert_allclose(impl.variable_store["w"].read_full().numpy(), ref_w,
                             rtol=1e-5, atol=1e-7)


def test_updates_lowered_one_by_one_all_see_the_old_values():
  """loss = sum(x w1 w2): w2's update does not read w2, w1's gradient does. Lowering
  w2's update first must not let w1's update see the new w2."""
  fresh_global_step()
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w1_0, w2_0 = random_values([BATCH, HIDDEN], 5), random_values([HIDDEN], 6)
  x0 = random_values([BATCH], 7)
  w1 = mtf.get_variable(mesh, "w1", [BATCH, HIDDEN], initializer=w1_0)
  w2 = mtf.get_variable(mesh, "w2", [HIDDEN], initializer=w2_0)
  x = mtf.import_tf_tensor(mesh, x0, [BATCH])
  loss = mtf.reduce_sum(mtf.einsum([mtf.einsum([x, w1], [HIDDEN]), w2], []))
  grads = mtf.gradients([loss], [w1, w2])
  ops = mtf.optimize.SgdOptimizer(0.5).apply_grads(grads, [w1, w2])
  impl = make_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  lowering = mtf.Lowering(graph, {mesh: impl})
  for op in reversed(ops):
    lowering.lowered_operation(op)
  loss_value = lowering.export_to_tf_tensor(loss).numpy()
  np.testing.assert_allclose(loss_value, x0 @ w1_0 @ w2_0, rtol=1e-5)
  np.testing.assert_allclose(impl.variable_store["w2"].read_full().numpy(),
                             w2_0 - 0.5 * (x0 @ w1_0), rtol=1e-5)
  np.testing.assert_allclose(impl.variable_store["w1"].read_full().numpy(),
                             w1_0 - 0.5 * np.outer(x0, w2_0), rtol=1e-5)
