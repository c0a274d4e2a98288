"""Bad input to optimizers and schedules raises MtfError subclasses naming the culprit."""
import pytest
import tensorflow as tf

import mesh_tf as mtf
from optimizer_testing import BATCH, HIDDEN, fresh_global_step, make_impl


def _graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "dense/kernel", [BATCH, HIDDEN])
  b = mtf.get_variable(mesh, "dense/bias", [HIDDEN])
  return graph, mesh, w, b


def test_count_mismatch_names_the_variables():
  graph, mesh, w, b = _graph()
  grads = mtf.gradients([mtf.reduce_sum(w)], [w])
  with pytest.raises(mtf.MtfError, match=r"1 gradients for 2 variables.*dense/kernel"):
    mtf.optimize.SgdOptimizer(0.1).apply_grads(grads, graph.trainable_variables)


def test_swapped_gradients_name_the_variable_and_shapes():
  graph, mesh, w, b = _graph()
  gw, gb = mtf.gradients([mtf.reduce_sum(w) + mtf.reduce_sum(b)], [w, b])
  with pytest.raises(mtf.ShapeError, match=r"variable 'dense/kernel' has shape") as info:
    mtf.optimize.AdafactorOptimizer().apply_grads([gb, gw], [w, b])
  assert info.value.tensor == "dense/kernel"


def test_dim_order_mismatch_is_a_shape_error():
  graph, mesh, w, b = _graph()
  g = mtf.zeros(mesh, [HIDDEN, BATCH])
  with pytest.raises(mtf.ShapeError, match="same order"):
    mtf.optimize.SgdOptimizer(0.1).apply_grads([g, None], [w, b])


def test_gradient_on_another_mesh_or_not_a_tensor():
  graph, mesh, w, b = _graph()
  other = mtf.Mesh(graph, "other")
  with pytest.raises(mtf.ShapeError, match=r"dense/bias.*mesh"):
    mtf.optimize.SgdOptimizer(0.1).apply_grads([None, mtf.zeros(other, [HIDDEN])], [w, b])
  with pytest.raises(mtf.ShapeError, match=r"gradient 0 for variable 'dense/kernel'"):
    mtf.optimize.SgdOptimizer(0.1).apply_grads([tf.zeros([8, 8]), None], [w, b])


def test_integer_gradient_is_rejected():
  graph, mesh, w, b = _graph()
  g = mtf.zeros(mesh, [HIDDEN], dtype=tf.int32)
  with pytest.raises(mtf.ShapeError, match=r"dense/bias.*int32"):
    mtf.optimize.SgdOptimizer(0.1).apply_grads([None, g], [w, b])


def test_non_variable_and_duplicate_variable():
  graph, mesh, w, b = _graph()
  not_var = w * 2.0
  with pytest.raises(mtf.ShapeError, match=r"variables\[0\].*not a variable"):
    mtf.optimize.SgdOptimizer(0.1).apply_grads([w], [not_var])
  with pytest.raises(mtf.MtfError, match=r"'dense/bias' appears twice"):
    mtf.optimize.SgdOptimizer(0.1).apply_grads([b, b], [b, b])


def test_bad_rates_are_rejected_when_the_optimizer_is_made():
  with pytest.raises(mtf.MtfError, match="SgdOptimizer.learning_rate"):
    mtf.optimize.SgdOptimizer("0.1")
  with pytest.raises(mtf.MtfError, match="MomentumOptimizer.momentum"):
    mtf.optimize.MomentumOptimizer(0.1, momentum=[0.9])
  with pytest.raises(mtf.MtfError, match="AdafactorOptimizer.decay_rate"):
    mtf.optimize.AdafactorOptimizer(decay_rate="pow")
  with pytest.raises(mtf.MtfError, match="clipping_threshold"):
    mtf.optimize.AdafactorOptimizer(clipping_threshold=0.0)
  with pytest.raises(mtf.MtfError, match="AdamWeightDecayOptimizer.beta_1"):
    mtf.optimize.AdamWeightDecayOptimizer(0.1, beta_1=None)


def test_non_scalar_rates_are_rejected():
  graph, mesh, w, b = _graph()
  gw = mtf.zeros(mesh, [BATCH, HIDDEN])
  with pytest.raises(mtf.ShapeError, match="SgdOptimizer.learning_rate .* scalar"):
    mtf.optimize.SgdOptimizer(mtf.ones(mesh, [HIDDEN])).apply_grads([gw], [w])
  # A callable giving a vector fails when lowered, naming the rate.
  ops = mtf.optimize.SgdOptimizer(lambda: tf.ones([3])).apply_grads([gw], [w])
  lowering = mtf.Lowering(graph, {mesh: make_impl("", "")})
  with pytest.raises(mtf.ShapeError, match=r"SgdOptimizer.learning_rate.*shape \(3,\)"):
    lowering.lowered_operation(ops[0])


def test_make_optimizer_and_hparams_errors():
  class HParams:
    optimizer = "RMSProp"
    optimizer_adafactor_decay_type = "linear"
  with pytest.raises(mtf.MtfError, match="'RMSProp'"):
    mtf.optimize.make_optimizer(HParams(), 0.1)
  with pytest.raises(mtf.MtfError, match="'linear'"):
    mtf.optimize.adafactor_optimizer_from_hparams(HParams(), 0.1)


def test_multi_schedule_errors_and_global_step_errors():
  with pytest.raises(mtf.MtfError, match="2 variable_search patterns but 1"):
    mtf.optimize.AdafactorWithMultiLRSchedule(variable_search=["a", "b"],
                                              alt_lr_schedules=[None])
  with pytest.raises(mtf.MtfError, match="schedule must be"):
    mtf.optimize.compute_lr_for_step([0.5], 0.1)
  with pytest.raises(mtf.MtfError, match="integer scalar"):
    mtf.optimize.set_global_step(tf.Variable(0.0))
  with pytest.raises(mtf.MtfError, match="tf.Variable"):
    mtf.optimize.set_global_step(3)
  with pytest.raises(mtf.MtfError, match="no gradients"):
    mtf.optimize.clip_by_global_norm([None], 1.0)
  fresh_global_step()


def test_rate_on_another_mesh():
  graph, mesh, w, b = _graph()
  other = mtf.Mesh(graph, "other")
  lr = mtf.constant(other, 0.1)
  with pytest.raises(mtf.ShapeError, match="learning_rate .* on mesh"):
    mtf.optimize.SgdOptimizer(lr).apply_grads([mtf.zeros(mesh, [HIDDEN])], [b])


def test_base_optimizer_has_no_update_rule():
  graph, mesh, w, b = _graph()
  with pytest.raises(mtf.MtfError, match=r"Optimizer does not implement apply_grad.*dense/bias"):
    mtf.optimize.Optimizer().apply_grads([None, mtf.zeros(mesh, [HIDDEN])], [w, b])
