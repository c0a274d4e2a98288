"""Learning-rate schedules against their formulas; gin; per-variable schedules; clipping."""
import math

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from optimizer_testing import (BATCH, HIDDEN, fresh_global_step, make_impl, random_values,
                               run_optimizer)

lrs = mtf.learning_rate_schedules
STEPS = [0, 1, 50, 99, 100, 900, 999]
TOTAL = 1000


def _at(schedule, **kwargs):
  return [float(schedule(tf.constant(s, tf.int64), TOTAL, **kwargs)) for s in STEPS]


@pytest.mark.parametrize("name,kwargs,formula", [
    ("linear_decay", {"steps_or_fraction": 0.1}, lambda s: min(1.0, (TOTAL - s) / 100.0)),
    ("linear_decay", {"steps_or_fraction": 200}, lambda s: min(1.0, (TOTAL - s) / 200.0)),
    ("linear_warmup", {"steps_or_fraction": 100}, lambda s: min(1.0, s / 100.0)),
    ("linear_warmup", {"steps_or_fraction": 0.05}, lambda s: min(1.0, s / 50.0)),
    ("truncated_rsqrt", {"warmup_steps": 100}, lambda s: max(s, 100) ** -0.5),
    ("constant", {"value": 3.0}, lambda s: 3.0),
    ("constant_learning_rate", {"learning_rate": 0.02}, lambda s: 0.02),
    ("linear_decay_learning_rate", {"initial_lr": 0.5, "offset": 600},
     lambda s: 0.5 * min(1.0, (TOTAL - s) / 400.0)),
    ("learning_rate_schedule_noam", {"warmup_steps": 100, "multiplier": 2.0},
     lambda s: 2.0 * max(s, 100) ** -0.5 * min(1.0, (TOTAL - s) / 100.0)),
    ("learning_rate_schedule_noam",
     {"warmup_steps": 10, "linear_decay_fraction": 0.0, "offset": 1},
     lambda s: max(s - 1, 10) ** -0.5),
    ("slanted_triangular", {},  # cut = 100; rise to 0.01 at 100, fall to 0.01/32 at 1000
     lambda s: 0.01 * (1 + (s / 100.0 if s < 100 else 1 - (s - 100) / 900.0) * 31) / 32),
])
def test_schedule_matches_formula(name, kwargs, formula):
  np.testing.assert_allclose(_at(getattr(lrs, name), **kwargs),
                             [formula(s) for s in STEPS], rtol=1e-5, atol=1e-8)


def test_product_learning_rate_multiplies_factors_with_offset():
  factors = [lambda s, t: lrs.linear_warmup(s, t, steps_or_fraction=100),
             lambda s, t: lrs.truncated_rsqrt(s, t, warmup_steps=100),
             lambda s, t: lrs.constant(s, t, value=2.0)]
  got = _at(lrs.product_learning_rate, factors=factors, offset=10)
  expected = [min(1.0, (s - 10) / 100.0) * max(s - 10, 100) ** -0.5 * 2.0 for s in STEPS]
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  got = _at(mtf.optimize.product_learning_rate, factors=factors)
  expected = [min(1.0, s / 100.0) * max(s, 100) ** -0.5 * 2.0 for s in STEPS]
  np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_schedules_are_gin_configurable_under_the_original_names():
  with gin.unlock_config():
    gin.parse_config("""
        learning_rate_schedules.learning_rate_schedule_noam.warmup_steps = 400
        learning_rate_schedules.learning_rate_schedule_noam.linear_decay_fraction = 0.0
        optimize.AdafactorOptimizer.beta1 = 0.25
        """)
  try:
    np.testing.assert_allclose(float(lrs.learning_rate_schedule_noam(0, TOTAL)),
                               1 / math.sqrt(400.0), rtol=1e-6)
    assert mtf.optimize.AdafactorOptimizer()._beta1 == 0.25  # pylint: disable=protected-access
  finally:
    gin.clear_config()
  assert mtf.optimize.AdafactorOptimizer()._beta1 == 0.0  # pylint: disable=protected-access


def test_compute_lr_for_step_reads_the_global_step():
  step = fresh_global_step()
  rates = mtf.optimize.compute_lr_for_step(
      [None, [lambda s, t: lrs.linear_warmup(s, t, steps_or_fraction=10)],
       lambda s, t: lrs.linear_decay(s, t, steps_or_fraction=1.0)], 0.3, train_steps=20)
  assert rates[0] == 0.3
  step.assign(5)
  np.testing.assert_allclose([float(rates[1]()), float(rates[2]())], [0.5, 0.75])
  step.assign(15)
  np.testing.assert_allclose([float(rates[1]()), float(rates[2]())], [1.0, 0.25])


@pytest.mark.parametrize("kind", ["adafactor", "adam"])
def test_multi_lr_schedule_applies_the_matching_schedule(kind):
  fresh_global_step()
  specs = [("enc/w", [HIDDEN], random_values([HIDDEN], 1)),
           ("dec/w", [HIDDEN], random_values([HIDDEN], 2))]
  grads = [[random_values([HIDDEN], 3), random_values([HIDDEN], 3)] for _ in range(2)]
  alt = [lambda s, t: lrs.constant(s, t, value=0.0)]  # freezes the matching variables

  def make():
    if kind == "adafactor":
      return mtf.optimize.AdafactorWithMultiLRSchedule(
          variable_search=["^enc/"], alt_lr_schedules=[alt], learning_rate=0.1)
    return mtf.optimize.AdamWithMultiLRSchedule(
        variable_search="^enc/", alt_lr_schedules=alt, learning_rate=0.1)
  values, _, _ = run_optimizer(make, specs, grads, make_impl("", ""))
  np.testing.assert_allclose(values["enc/w"], specs[0][2])
  assert np.abs(values["dec/w"] - specs[1][2]).min() > 1e-4


def test_clip_by_global_norm_matches_tf():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  a, b = random_values([BATCH, HIDDEN], 1), random_values([HIDDEN], 2)
  ga = mtf.import_tf_tensor(mesh, a, [BATCH, HIDDEN])
  gb = mtf.import_tf_tensor(mesh, b, [HIDDEN])
  for clip_norm in (1.0, 100.0):
    clipped, norm = mtf.optimize.clip_by_global_norm([ga, None, gb], clip_norm)
    assert clipped[1] is None
    lowering = mtf.Lowering(graph, {mesh: make_impl("rows:2;cols:4",
                                                    "batch:rows;hidden:cols")})
    ref, ref_norm = tf.clip_by_global_norm([tf.constant(a), tf.constant(b)], clip_norm)
    np.testing.assert_allclose(lowering.export_to_tf_tensor(norm).numpy(),
                               ref_norm.numpy(), rtol=1e-5)
    for got, want in zip([clipped[0], clipped[2]], ref):
      np.testing.assert_allclose(lowering.export_to_tf_tensor(got).numpy(), want.numpy(),
                                 rtol=1e-5, atol=1e-7)


def test_reduce_rms():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  a = random_values([BATCH, HIDDEN], 9)
  rms = mtf.optimize.reduce_rms(mtf.import_tf_tensor(mesh, a, [BATCH, HIDDEN]))
  lowering = mtf.Lowering(graph, {mesh: make_impl("all:8", "hidden:all")})
  np.testing.assert_allclose(lowering.export_to_tf_tensor(rms).numpy(),
                             np.sqrt(np.mean(a ** 2)), rtol=1e-5)
