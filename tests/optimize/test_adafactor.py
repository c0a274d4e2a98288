"""Adafactor: factored second moments on 2-D and 3-D variables, slots, options."""
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from optimizer_testing import (BATCH, CASES, CLASSES, HIDDEN, LENGTH, adafactor_reference,
                               fresh_global_step, make_impl, random_values, run_optimizer)

FIXTURE = (pathlib.Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures"
           / "orig_mtf_lm" / "variables.txt")
STEPS = 3


def _run_single_variable(shape, factored_axes, case, **options):
  fresh_global_step()
  w0 = random_values(shape, 5)
  grads = [[random_values(shape, 50 + t, low=-3.0, high=3.0)] for t in range(STEPS)]
  values, all_vars, _ = run_optimizer(
      lambda: mtf.optimize.AdafactorOptimizer(**options), [("w", shape, w0)], grads,
      make_impl(*case))
  ref_w, ref_slots = adafactor_reference(w0, [g[0] for g in grads], factored_axes)
  return values, all_vars, ref_w, ref_slots


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=["single", "2x4"])
def test_factored_2d(case):
  # hidden (8) is the largest dim, classes (4) the second: vr drops hidden, vc classes.
  values, all_vars, ref_w, slots = _run_single_variable(
      [HIDDEN, CLASSES], (0, 1), case, min_dim_size_to_factor=4)
  shapes = {v.name: v.shape for v in all_vars}
  assert shapes["w_slot_vr"] == mtf.Shape([CLASSES])
  assert shapes["w_slot_vc"] == mtf.Shape([HIDDEN])
  assert "w_slot_v" not in shapes
  np.testing.assert_allclose(values["w_slot_vr"], slots["vr"], rtol=1e-5)
  np.testing.assert_allclose(values["w_slot_vc"], slots["vc"], rtol=1e-5)
  np.testing.assert_allclose(values["w"], ref_w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=["single", "2x4"])
def test_factored_3d(case):
  # batch (8) > length (6) > classes (4): the classes dim is carried along.
  values, all_vars, ref_w, slots = _run_single_variable(
      [BATCH, LENGTH, CLASSES], (0, 1), case, min_dim_size_to_factor=6)
  shapes = {v.name: v.shape for v in all_vars}
  assert shapes["w_slot_vr"] == mtf.Shape([LENGTH, CLASSES])
  assert shapes["w_slot_vc"] == mtf.Shape([BATCH, CLASSES])
  np.testing.assert_allclose(values["w_slot_vr"], slots["vr"], rtol=1e-5)
  np.testing.assert_allclose(values["w_slot_vc"], slots["vc"], rtol=1e-5)
  np.testing.assert_allclose(values["w"], ref_w, rtol=1e-5, atol=1e-7)


def test_small_dims_and_factored_false_keep_full_slot():
  for options in ({"min_dim_size_to_factor": 7}, {"factored": False,
                                                    "min_dim_size_to_factor": 1}):
    values, all_vars, ref_w, slots = _run_single_variable(
        [BATCH, LENGTH, CLASSES], None, CASES[0], **options)
    names = {v.name for v in all_vars}
    assert names == {"w", "w_slot_v"}, options
    np.testing.assert_allclose(values["w_slot_v"], slots["v"], rtol=1e-5)
    np.testing.assert_allclose(values["w"], ref_w, rtol=1e-5, atol=1e-7)


def test_stacked_dim_is_a_stack_of_separate_variables():
  """With batch stacked, each batch index is updated as its own [length, classes] var."""
  fresh_global_step()
  shape = [BATCH, LENGTH, CLASSES]
  w0 = random_values(shape, 6)
  w0[3] *= 40.0  # a different scale per slice: the parameter scale must be per slice
  grads = [[random_values(shape, 60 + t)] for t in range(STEPS)]
  values, all_vars, _ = run_optimizer(
      lambda: mtf.optimize.AdafactorOptimizer(stacked_dim_names=["batch"],
                                              min_dim_size_to_factor=4),
      [("w", shape, w0)], grads, make_impl(*CASES[2]))
  shapes = {v.name: v.shape for v in all_vars}
  assert shapes["w_slot_vr"] == mtf.Shape([BATCH, CLASSES])  # length, classes factored
  for b in range(BATCH.size):
    ref_w, slots = adafactor_reference(w0[b], [g[0][b] for g in grads], (0, 1))
    np.testing.assert_allclose(values["w"][b], ref_w, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(values["w_slot_vr"][b], slots["vr"], rtol=1e-5)


def test_exclude_from_parameter_scale():
  fresh_global_step()
  w0 = random_values([HIDDEN], 7, low=5.0, high=9.0)
  grads = [[random_values([HIDDEN], 70 + t)] for t in range(STEPS)]
  values, _, _ = run_optimizer(
      lambda: mtf.optimize.AdafactorOptimizer(exclude_from_parameter_scale=["bias$"]),
      [("layer/bias", [HIDDEN], w0), ("layer/kernel", [HIDDEN], w0)],
      [[g[0], g[0]] for g in grads], make_impl("", ""))
  scaled, _ = adafactor_reference(w0, [g[0] for g in grads])
  unscaled, _ = adafactor_reference(w0, [g[0] for g in grads], param_scale=False)
  np.testing.assert_allclose(values["layer/kernel"], scaled, rtol=1e-5)
  np.testing.assert_allclose(values["layer/bias"], unscaled, rtol=1e-5)
  assert np.abs(scaled - unscaled).max() > 1e-3


def test_bfloat16_variables_get_float32_slots_named_like_the_original():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  dtype = mtf.VariableDType(tf.bfloat16, tf.float32, tf.float32)
  d_model, vocab = mtf.Dimension("d_model", 32), mtf.Dimension("vocab", 128)
  d_ff = mtf.Dimension("d_ff", 256)
  with mtf.variable_scope("transformer"):
    emb = mtf.get_variable(mesh, "embedding", [vocab, d_model], dtype=dtype)
    big = mtf.get_variable(mesh, "wi", [vocab, d_ff], dtype=dtype)
  grads = mtf.gradients([mtf.reduce_sum(emb) + mtf.reduce_sum(big)], [emb, big])
  mtf.optimize.AdafactorOptimizer().apply_grads(grads, graph.trainable_variables)
  got = {v.name: (v.shape.to_integer_list, v.master_dtype, v.trainable)
         for v in graph.all_variables}
  assert got == {
      "transformer/embedding": ([128, 32], tf.bfloat16, True),
      "transformer/embedding_slot_v": ([128, 32], tf.float32, False),
      "transformer/wi": ([128, 256], tf.bfloat16, True),
      "transformer/wi_slot_vr": ([128], tf.float32, False),
      "transformer/wi_slot_vc": ([256], tf.float32, False)}


@pytest.mark.skipif(not FIXTURE.exists(), reason="fixture %s is not present" % FIXTURE)
def test_slot_names_shapes_dtypes_match_original_checkpoint():
  """Default Adafactor on the fixture's weights creates exactly the fixture's slots."""
  listed = [line.split("\t") for line in FIXTURE.read_text().splitlines()]
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  dtype = mtf.VariableDType(tf.bfloat16, tf.float32, tf.float32)
  weights = []
  for name, shape, _ in listed:
    if name == "global_step" or "_slot_" in name:
      continue
    sizes = [int(s) for s in shape.strip("[]").split(",")]
    dims = [mtf.Dimension("d%d_%d" % (i, s), s) for i, s in enumerate(sizes)]
    weights.append(mtf.get_variable(mesh, name, dims, dtype=dtype))
  grads = mtf.gradients([mtf.add_n([mtf.reduce_sum(w) for w in weights])], weights)
  mtf.optimize.AdafactorOptimizer().apply_grads(grads, weights)
  ours = sorted((v.name, str(v.shape.to_integer_list).replace(" ", ""), v.master_dtype.name)
                for v in graph.all_variables)
  theirs = sorted((n, s.replace(" ", ""), d) for n, s, d in listed if n != "global_step")
  assert ours == theirs


def test_decay_rate_schedules_follow_the_global_step():
  step = fresh_global_step()
  pow_rate = mtf.optimize.adafactor_decay_rate_pow(0.8)
  adam_rate = mtf.optimize.adafactor_decay_rate_adam(0.999)
  offset_rate = mtf.optimize.adafactor_decay_rate_pow(0.5, offset=2)
  for t in [0, 2, 5, 100]:
    step.assign(t)
    np.testing.assert_allclose(float(pow_rate()), 1.0 - (t + 1.0) ** -0.8, rtol=1e-6)
    expected = 0.999 * (1 - 0.999 ** t) / (1 - 0.999 ** (t + 1))
    np.testing.assert_allclose(float(adam_rate()), expected, rtol=1e-4, atol=1e-7)
    if t >= 2:  # the offset schedule starts at step 2 with decay 0
      np.testing.assert_allclose(float(offset_rate()), 1.0 - (t - 1.0) ** -0.5,
                                 atol=1e-7)


class _HParams:
  optimizer = "Adafactor"
  optimizer_adafactor_decay_type = "pow"
  optimizer_adafactor_memory_exponent = 0.5
  optimizer_adafactor_beta2 = 0.99
  optimizer_adafactor_multiply_by_parameter_scale = False
  optimizer_adafactor_beta1 = 0.9
  optimizer_adafactor_clipping_threshold = 2.0
  optimizer_adafactor_factored = False


def test_from_hparams_and_make_optimizer():
  step = fresh_global_step()
  step.assign(3)
  opt = mtf.optimize.adafactor_optimizer_from_hparams(_HParams(), 0.02)
  assert isinstance(opt, mtf.optimize.AdafactorOptimizer)
  assert opt.learning_rate == 0.02
  np.testing.assert_allclose(float(opt.decay_rate()), 1.0 - 4.0 ** -0.5, rtol=1e-6)
  hparams = _HParams()
  hparams.optimizer_adafactor_decay_type = "Adam"
  opt = mtf.optimize.make_optimizer(hparams, 0.5)
  expected = 0.99 * (1 - 0.99 ** 3) / (1 - 0.99 ** 4)
  np.testing.assert_allclose(float(opt.decay_rate()), expected, rtol=1e-5)
  hparams.optimizer = "SGD"
  sgd = mtf.optimize.make_optimizer(hparams, 0.5)
  assert isinstance(sgd, mtf.optimize.SgdOptimizer) and sgd.lr == 0.5


@pytest.mark.skipif(not FIXTURE.exists(), reason="fixture %s is not present" % FIXTURE)
def test_original_operative_config_bindings_parse():
  """The optimizer bindings of the original trainer's operative config configure ours."""
  import gin  # pylint: disable=g-import-not-at-top
  text = (FIXTURE.parent / "operative_config.gin").read_text()
  lines = [l for l in text.splitlines()
           if l.startswith(("AdafactorOptimizer.", "adafactor_decay_rate_pow."))]
  assert len(lines) == 13
  lines = [l.replace("clipping_threshold = 1.0", "clipping_threshold = 2.5") for l in lines]
  with gin.unlock_config():
    gin.parse_config("\n".join(lines))
  try:
    opt = mtf.optimize.AdafactorOptimizer()
    assert opt._clipping_threshold == 2.5  # pylint: disable=protected-access
    assert opt._min_dim_size_to_factor == 128  # pylint: disable=protected-access
  finally:
    gin.clear_config()
