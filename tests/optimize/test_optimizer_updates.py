"""Each optimizer's updates match a reference written directly in TF, on several layouts."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from optimizer_testing import (BATCH, CASES, CLASSES, HIDDEN, adafactor_reference,
                               fresh_global_step, make_impl, random_values, run_optimizer)

STEPS = 3
W_SHAPE = [BATCH, HIDDEN]
B_SHAPE = [HIDDEN]


def _specs():
  return [("w", W_SHAPE, random_values(W_SHAPE, 1)), ("b", B_SHAPE, random_values(B_SHAPE, 2))]


def _grads():
  return [[random_values(W_SHAPE, 10 + t), random_values(B_SHAPE, 20 + t)]
          for t in range(STEPS)]


def _case_id(case):
  return "%s/%s" % (case[0] or "single", case[1] or "replicated")


@pytest.fixture(params=CASES, ids=_case_id)
def impl(request):
  fresh_global_step()
  return make_impl(*request.param)


def _check(values, name, expected, rtol=1e-5, atol=1e-6):
  np.testing.assert_allclose(values[name], expected, rtol=rtol, atol=atol, err_msg=name)


def test_sgd_matches_tf(impl):
  values, _, ops = run_optimizer(lambda: mtf.optimize.SgdOptimizer(0.3), _specs(),
                                 _grads(), impl)
  assert len(ops) == 2 and all(isinstance(op, mtf.Assign) for op in ops)
  for i, (name, _, w) in enumerate(_specs()):
    for g in _grads():
      w = w - 0.3 * g[i]
    _check(values, name, w)


def test_momentum_matches_tf_momentum_optimizer(impl):
  values, _, _ = run_optimizer(lambda: mtf.optimize.MomentumOptimizer(0.1, 0.9), _specs(),
                               _grads(), impl)
  for i, (name, _, w) in enumerate(_specs()):
    ref = tf.Variable(w)
    opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
    for g in _grads():
      opt.apply_gradients([(tf.constant(g[i]), ref)])
    _check(values, name, ref.numpy())
    accumulator = opt.get_slot(ref, "momentum").numpy()
    _check(values, name + "_momentum_v", 0.1 * accumulator)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adam_weight_decay_matches_tf(impl, weight_decay):
  def make():
    return mtf.optimize.AdamWeightDecayOptimizer(
        0.01, weight_decay_rate=weight_decay, exclude_from_weight_decay=["^b$"])
  values, _, _ = run_optimizer(make, _specs(), _grads(), impl)
  for i, (name, _, w) in enumerate(_specs()):
    w, m, v = tf.constant(w), tf.zeros_like(w), tf.zeros_like(w)
    for g in _grads():
      g = tf.constant(g[i])
      m = 0.9 * m + 0.1 * g
      v = 0.999 * v + 0.001 * tf.square(g)
      update = m / (tf.sqrt(v) + 1e-6)
      if name == "w":  # b is excluded from decay by the regex
        update += weight_decay * w
      w = w - 0.01 * update
    _check(values, name, w.numpy(), rtol=1e-5, atol=1e-6)
    _check(values, name + "/adam_m", m.numpy())
    _check(values, name + "/adam_v", v.numpy())


def test_adafactor_defaults_match_tf(impl):
  values, _, _ = run_optimizer(mtf.optimize.AdafactorOptimizer, _specs(), _grads(), impl)
  for i, (name, _, w) in enumerate(_specs()):
    ref_w, slots = adafactor_reference(w, [g[i] for g in _grads()])
    _check(values, name, ref_w)
    _check(values, name + "_slot_v", slots["v"])


def test_adafactor_beta1_no_clipping_no_scale_matches_tf(impl):
  def make():
    return mtf.optimize.AdafactorOptimizer(
        multiply_by_parameter_scale=False, learning_rate=0.05, beta1=0.9,
        clipping_threshold=None)
  values, _, _ = run_optimizer(make, _specs(), _grads(), impl)
  for i, (name, _, w) in enumerate(_specs()):
    ref_w, slots = adafactor_reference(w, [g[i] for g in _grads()], beta1=0.9, clip=None,
                                       param_scale=False, learning_rate=0.05)
    _check(values, name, ref_w)
    _check(values, name + "_slot_m", slots["m"])


def test_sgd_on_bfloat16_slices_subtracts_the_rounded_step():
  fresh_global_step()
  dtype = mtf.VariableDType(tf.bfloat16, tf.bfloat16, tf.bfloat16)
  specs = _specs()
  values, _, _ = run_optimizer(lambda: mtf.optimize.SgdOptimizer(0.5), specs, _grads(),
                               make_impl(*CASES[2]), dtype=dtype)
  for i, (name, _, w) in enumerate(specs):
    w = tf.cast(w, tf.bfloat16)
    for g in _grads():
      w = w - tf.cast(0.5 * g[i], tf.bfloat16)
    assert values[name].dtype == tf.bfloat16.as_numpy_dtype
    np.testing.assert_array_equal(values[name].astype(np.float32),
                                  tf.cast(w, tf.float32).numpy(), err_msg=name)


def test_none_gradient_leaves_variable_alone(impl):
  specs = _specs()
  grads = [[None, g[1]] for g in _grads()]
  values, _, ops = run_optimizer(lambda: mtf.optimize.SgdOptimizer(1.0), specs, grads,
                                 impl)
  assert len(ops) == 1
  _check(values, "w", specs[0][2])
  _check(values, "b", specs[1][2] - sum(g[1] for g in grads))


def test_updates_identical_across_layouts():
  """Adafactor (factored and not) and Adam give the same state on [], placement [2,4],
  SIMD emulation [8,8] and GSPMD [2,4]."""
  specs = [("w", [HIDDEN, CLASSES], random_values([HIDDEN, CLASSES], 3)),
           ("e", [BATCH, HIDDEN], random_values([BATCH, HIDDEN], 4))]
  grads = [[random_values([HIDDEN, CLASSES], 30 + t), random_values([BATCH, HIDDEN], 40 + t)]
           for t in range(STEPS)]
  results = []
  for make in (lambda: mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=4, beta1=0.5),
               lambda: mtf.optimize.AdamWeightDecayOptimizer(0.01, weight_decay_rate=0.1)):
    per_layout = []
    for impl in (make_impl(*CASES[0]), make_impl(*CASES[2]),
                 mtf.SimdMeshImpl("rows:8;cols:8", "batch:rows;hidden:cols"),
                 mtf.GSPMDMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols")):
      fresh_global_step()
      per_layout.append(run_optimizer(make, specs, grads, impl)[0])
    single = per_layout[0]
    for split in per_layout[1:]:
      assert sorted(single) == sorted(split)
      for name in single:
        np.testing.assert_allclose(split[name], single[name], rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    results.append(single)
  assert "w_slot_vr" in results[0] and "e_slot_vc" in results[0]
