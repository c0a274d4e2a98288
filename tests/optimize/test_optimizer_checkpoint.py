"""Optimizer state (slots and the global step) survives a checkpoint and a change of
layout: 2 steps on [2,4], save, restore on one device, 1 more step == 3 steps on [2,4]."""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from optimizer_testing import (BATCH, CLASSES, HIDDEN, fresh_global_step, make_impl,
                               random_values)

SHAPES = {"w": [BATCH, HIDDEN], "b": [CLASSES]}


def _build():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  variables = [mtf.get_variable(mesh, n, s, initializer=random_values(s, i))
               for i, (n, s) in enumerate(sorted(SHAPES.items()))]
  grads = [mtf.import_tf_tensor(mesh, tf.TensorSpec(v.shape.to_integer_list), v.shape)
           for v in variables]
  ops = mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=4, beta1=0.5).apply_grads(
      grads, variables)
  return graph, mesh, grads, ops


def _steps(impl, built, grad_values):
  graph, mesh, grads, ops = built
  for step_grads in grad_values:
    lowering = mtf.Lowering(graph, {mesh: impl}, feeds=dict(zip(grads, step_grads)))
    for op in ops:
      lowering.lowered_operation(op)
    mtf.optimize.get_global_step().assign_add(1)
  return {v.name: impl.variable_store[v.name].read_full().numpy()
          for v in graph.all_variables}


def test_resume_on_another_layout_matches_uninterrupted_run(tmp_path):
  grad_values = [[random_values(s, 10 * t + i, low=-3.0, high=3.0)
                  for i, (_, s) in enumerate(sorted(SHAPES.items()))] for t in range(3)]
  fresh_global_step()
  expected = _steps(make_impl("rows:2;cols:4", "batch:rows;hidden:cols"), _build(),
                    grad_values)

  step = fresh_global_step()
  impl = make_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  _steps(impl, _build(), grad_values[:2])
  path = mtf.save_checkpoint(str(tmp_path / "model.ckpt"), impl,
                             extra_variables={"global_step": step})
  saved = dict(tf.train.list_variables(path))
  assert saved["w_slot_vr"] == [8] and saved["w_slot_vc"] == [8] and "b_slot_v" in saved
  assert saved["w_slot_m"] == [8, 8] and "global_step" in saved

  step = fresh_global_step()
  single = make_impl("", "")
  built = _build()
  mtf.Lowering(built[0], {built[1]: single})  # creates the variables
  mtf.restore_checkpoint(path, single, extra_variables={"global_step": step})
  assert int(step.numpy()) == 2
  resumed = _steps(single, built, grad_values[2:])
  assert sorted(resumed) == sorted(expected)
  for name in expected:
    np.testing.assert_allclose(resumed[name], expected[name], rtol=1e-5, atol=1e-7,
                               err_msg=name)
