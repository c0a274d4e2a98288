"""StudentTeacher / make_bi_student_teacher: the distillation loss and its gradient with
respect to the student's logits against plain TF, no gradient into the teacher, the
same numbers on placement (rows:2;cols:4) and SIMD emulation, distill_start_step read
from the global step, teacher (and student) weights from a teacher checkpoint, and a
training step of a Bitransformer pair through the trainer's ModelGraph."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from models.transformer import model_graph
from models.transformer import transformer
from models.transformer import transformer_layers
from models.transformer.context import ModeKeys

VOCAB, BATCH, LENGTH = 16, 4, 8
TEMPERATURE, FRACTION = 2.0, 0.25


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  gin.clear_config()
  yield
  gin.clear_config()


def _lm(d_model, d_ff, name="transformer"):
  attention = transformer_layers.SelfAttention(num_heads=2, key_value_size=4)
  ffn = transformer_layers.DenseReluDense(hidden_size=d_ff)
  attention.set_name("block_000/layer_000")
  ffn.set_name("block_000/layer_001")
  return transformer.Unitransformer(
      layer_stack=transformer.LayerStack([attention, ffn]), d_model=d_model,
      input_vocab_size=VOCAB, output_vocab_size=VOCAB, autoregressive=True,
      max_length=LENGTH, vocab_divisor=8, name=name)


def _targets():
  t = np.random.RandomState(0).randint(2, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
  t[1, 6:] = 0  # padding
  return t


def _graph(model, targets):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  dims = [mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)]
  t = mtf.import_tf_tensor(mesh, targets, dims)
  logits, loss = model.call_simple(transformer.autoregressive_inputs(t), t,
                                   compute_loss=True, mode=ModeKeys.EVAL)
  return graph, mesh, logits, loss


def _distill(distill_start_step=0):
  return transformer.StudentTeacher(
      _lm(8, 8), _lm(16, 16), temperature=TEMPERATURE, fraction_soft=FRACTION,
      distill_start_step=distill_start_step)


def _lower(graph, mesh, impl, fetches, weights=None):
  lowering = mtf.Lowering(graph, {mesh: impl})
  for v, laid in lowering.variables.items():
    if weights is not None:
      laid.assign_full(weights[v.name])
  out = [None if t is None else lowering.export_to_tf_tensor(t).numpy() for t in fetches]
  full = {v.name: laid.read_full().numpy() for v, laid in lowering.variables.items()}
  return out, full, lowering


def tf_distillation_loss(student_logits, teacher_logits, targets):
  """(1 - f) * hard + T**2 * f * soft, in TF, from the two models' logits."""
  weights = tf.cast(targets != 0, tf.float32)
  onehot = tf.one_hot(targets, student_logits.shape[-1])
  hard = tf.nn.softmax_cross_entropy_with_logits(onehot, student_logits)
  soft_targets = tf.nn.softmax(teacher_logits / TEMPERATURE)
  soft = tf.nn.softmax_cross_entropy_with_logits(soft_targets,
                                                 student_logits / TEMPERATURE)
  denominator = float(targets.size)
  return ((1 - FRACTION) * tf.reduce_sum(hard * weights) / denominator +
          TEMPERATURE ** 2 * FRACTION * tf.reduce_sum(soft * weights) / denominator)


@pytest.fixture(scope="module")
def single_device_run():
  targets = _targets()
  model = _distill()
  graph, mesh, logits, loss = _graph(model, targets)
  (teacher_logits,) = [op.outputs[0] for op in graph.operations
                       if op.name == "teacher/transformer/logits/einsum"]
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [logits] + [v.outputs[0] for v in variables])
  fetches = [logits, teacher_logits, loss] + grads
  tf.random.set_seed(1)
  values, full, _ = _lower(graph, mesh, mtf_testing.backend_mesh_impl("placement", "", ""), fetches)
  names = [v.name for v in variables]
  return targets, values, full, names, graph


def test_distillation_loss_and_gradient_match_tf(single_device_run):
  targets, values, _, names, _ = single_device_run
  student_logits, teacher_logits, loss, d_logits = values[:4]
  assert student_logits.shape == (BATCH, LENGTH, VOCAB)
  assert np.abs(student_logits - teacher_logits).max() > 1e-3
  tf_logits = tf.constant(student_logits)
  with tf.GradientTape() as tape:
    tape.watch(tf_logits)
    ref = tf_distillation_loss(tf_logits, tf.constant(teacher_logits), targets)
  np.testing.assert_allclose(loss, ref.numpy(), rtol=1e-5)
  np.testing.assert_allclose(d_logits, tape.gradient(ref, tf_logits).numpy(), rtol=1e-4,
                             atol=1e-7)
  grads = dict(zip(names, values[4:]))
  assert all(n.startswith(("student/", "teacher/")) for n in names), names
  for name, g in grads.items():
    if name.startswith("teacher/"):
      assert g is None or not np.any(g), "gradient reached teacher variable " + name
    else:
      assert g is not None, name
  assert "student/transformer/logits/kernel" in grads
  assert "teacher/transformer/block_000/layer_001/DenseReluDense/wi/kernel" in grads


@pytest.mark.parametrize("backend,mesh_shape,layout", [
    ("placement", "rows:2;cols:4", "batch:rows;d_ff:cols;vocab:cols"),
    ("simd", "rows:2;cols:4", "batch:rows;d_ff:cols")], ids=["placement", "simd"])
def test_distillation_does_not_depend_on_layout(single_device_run, backend, mesh_shape,
                                                layout):
  targets, ref, full, _, _ = single_device_run
  graph, mesh, logits, loss = _graph(_distill(), targets)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [logits] + [v.outputs[0] for v in variables])
  got, _, _ = _lower(graph, mesh, mtf_testing.backend_mesh_impl(backend, mesh_shape, layout),
                     [logits, None, loss] + grads, weights=full)
  for i, (g, r) in enumerate(zip(got, ref)):
    if i == 1:  # the teacher logits are fetched on one device only
      continue
    if r is None or g is None:
      assert (r is None or not np.any(r)) and (g is None or not np.any(g)), i
      continue
    np.testing.assert_allclose(g, r, rtol=2e-4, atol=2e-6, err_msg="fetch %d" % i)


def test_distill_start_step_reads_the_global_step(single_device_run):
  targets, ref, full, _, _ = single_device_run
  step = tf.Variable(3, dtype=tf.int64)
  previous = mtf.optimize.set_global_step(step)
  try:
    graph, mesh, logits, loss = _graph(_distill(distill_start_step=5), targets)
    (before, got_logits), _, _ = _lower(graph, mesh, mtf_testing.backend_mesh_impl("placement", "", ""),
                                        [loss, logits], weights=full)
    step.assign(6)
    (after,), _, _ = _lower(graph, mesh, mtf_testing.backend_mesh_impl("placement", "", ""), [loss], weights=full)
  finally:
    mtf.optimize.set_global_step(previous)
  hard = tf.reduce_sum(tf.nn.softmax_cross_entropy_with_logits(
      tf.one_hot(targets, VOCAB), got_logits) * (targets != 0)) / targets.size
  np.testing.assert_allclose(before, hard.numpy(), rtol=1e-5)
  np.testing.assert_allclose(after, ref[2], rtol=1e-5)


def test_initialize_loads_the_teacher_checkpoint(tmp_path, single_device_run):
  targets = single_device_run[0]
  teacher = _lm(16, 16)
  graph, mesh, _, _ = _graph(teacher, targets)
  tf.random.set_seed(11)
  lowering = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl("placement", "", "")})
  saved = {v.name: laid.read_full().numpy() for v, laid in lowering.variables.items()}
  mtf.save_checkpoint(str(tmp_path / "teacher"), lowering)

  model = transformer.StudentTeacher(_lm(16, 16), _lm(16, 16), temperature=1.0,
                                     fraction_soft=0.5,
                                     teacher_checkpoint=str(tmp_path / "teacher"),
                                     initialize_student_weights=True)
  graph, mesh, _, _ = _graph(model, targets)
  lowering = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl("placement", "rows:2;cols:4",
                                              "batch:rows;d_ff:cols")})
  results = model.initialize(lowering)
  assert len(results) == 2
  values = {v.name: laid.read_full().numpy() for v, laid in lowering.variables.items()}
  for name, value in saved.items():
    np.testing.assert_array_equal(values["teacher/" + name], value, err_msg=name)
    np.testing.assert_array_equal(values["student/" + name], value, err_msg=name)
  with pytest.raises(mtf.MtfError, match="teacher_checkpoint"):
    _distill().initialize(lowering)


def test_missing_temperature_is_named():
  model = transformer.StudentTeacher(_lm(8, 8), _lm(8, 8), fraction_soft=0.5)
  with pytest.raises(mtf.MtfError, match="temperature must be set"):
    _graph(model, _targets())


def test_make_bi_student_teacher_trains_through_the_model_graph():
  gin.parse_config("""
      teacher/encoder/make_layer_stack.num_layers = 2
      teacher/decoder/make_layer_stack.num_layers = 2
      student/encoder/make_layer_stack.num_layers = 1
      student/decoder/make_layer_stack.num_layers = 1
      transformer.Unitransformer.d_model = 8
      transformer.Unitransformer.max_length = 8
      transformer.Unitransformer.vocab_divisor = 8
      transformer_layers.SelfAttention.num_heads = 2
      transformer_layers.SelfAttention.key_value_size = 4
      transformer_layers.EncDecAttention.num_heads = 2
      transformer_layers.EncDecAttention.key_value_size = 4
      transformer_layers.DenseReluDense.hidden_size = 8
      transformer.StudentTeacher.temperature = 2.0
      transformer.StudentTeacher.fraction_soft = 0.5
  """)
  model = transformer.make_bi_student_teacher(input_vocab_size=VOCAB,
                                              output_vocab_size=VOCAB)
  assert model.student.encoder.layer_stack.num_layers == 2  # one block of 2 layers
  assert model.teacher.encoder.layer_stack.num_layers == 4
  assert model_graph.is_bitransformer(model)
  mg = model_graph.ModelGraph(model, BATCH, LENGTH, ["inputs", "targets"],
                              ModeKeys.TRAIN, mtf.VariableDType(tf.float32),
                              optimizer=mtf.optimize.SgdOptimizer(0.5))
  names = [v.name for v in mg.graph.trainable_variables]
  assert "student/shared/embedding" in names and "teacher/shared/embedding" in names
  impl = mtf_testing.backend_mesh_impl("placement", "rows:2;cols:4", "batch:rows;d_ff:cols")
  features = {"inputs": _targets(), "targets": np.roll(_targets(), 1, axis=0)}
  losses = []
  for _ in range(3):
    lowering = mg.lowering(impl, features)
    for op in mg.update_ops:
      lowering.lowered_operation(op)
    losses.append(float(lowering.export_to_tf_tensor(mg.loss).numpy()))
    if len(losses) == 1:
      teacher_before = {v.name: lowering.variables[v].read_full().numpy()
                        for v in mg.graph.trainable_variables
                        if v.name.startswith("teacher/")}
  assert losses[-1] < losses[0], losses
  for v in mg.graph.trainable_variables:
    if v.name.startswith("teacher/"):
      np.testing.assert_array_equal(lowering.variables[v].read_full().numpy(),
                                    teacher_before[v.name], err_msg=v.name)
