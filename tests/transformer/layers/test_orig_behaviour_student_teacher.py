"""The trainer's model_type "bi_student_teacher", as in the original: utils.build_model
makes a StudentTeacher of two Bitransformers (gin scopes student/ and teacher/), the
teacher's variables start from StudentTeacher.teacher_checkpoint (the original's
init_from_checkpoint), with initialize_student_weights the student's too, and a training
run leaves the teacher exactly as loaded (no gradient reaches it)."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
import trainer_helpers
from models.transformer import model_graph
from models.transformer import transformer
from models.transformer import utils
from models.transformer.trainer import decode_io
from models.transformer.context import ModeKeys
from models.transformer.vocabulary import ByteVocabulary

# The trainer's vocabulary below is ByteVocabulary, so the lone teacher uses its size.
VOCAB, BATCH, LENGTH = decode_io.vocab_size(ByteVocabulary()), 4, 8
_DECODER_LAYERS = ("[@transformer_layers.SelfAttention, @transformer_layers.EncDecAttention,"
                   " @transformer_layers.DenseReluDense]")
SIZES = ["num_layers = 1", "d_model = 8", "d_ff = 16", "num_heads = 2", "d_kv = 4",
         "dropout_rate = 0.0", "Unitransformer.max_length = %d" % LENGTH]
# gin scopes nest by prefix only, so the pair's decoders need their own layer lists.
PAIR = ["%s/decoder/make_layer_stack.layers = %s" % (who, _DECODER_LAYERS)
        for who in ("teacher", "student")]


def _distillation(checkpoint, initialize_student_weights=False):
  return ["StudentTeacher.teacher_checkpoint = %r" % checkpoint,
          "StudentTeacher.temperature = 2.0", "StudentTeacher.fraction_soft = 0.5",
          "StudentTeacher.initialize_student_weights = %s" % initialize_student_weights]


def _parse(params):
  from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  gin_setup.parse_gin([], params)


def _graph(model):
  return model_graph.ModelGraph(model, BATCH, LENGTH, ["inputs", "targets"],
                                ModeKeys.EVAL, mtf.VariableDType(tf.float32))


def _initial_values(mg):
  lowering = mg.lowering(mtf_testing.backend_mesh_impl("placement", "", ""))
  return {v.name: laid.read_full().numpy() for v, laid in lowering.variables.items()}


@pytest.fixture(scope="module")
def teacher_checkpoint(tmp_path_factory):
  """(checkpoint prefix, {name: value}) of a lone Bitransformer built from SIZES."""
  prefix = str(tmp_path_factory.mktemp("teacher") / "model.ckpt-5")
  _parse(SIZES)
  try:
    mg = _graph(utils.build_model("bitransformer", VOCAB, VOCAB))
    tf.random.set_seed(3)
    lowering = mg.lowering(mtf_testing.backend_mesh_impl("placement", "", ""))
    values = {v.name: laid.read_full().numpy() for v, laid in lowering.variables.items()}
    mtf.save_checkpoint(prefix, lowering)
  finally:
    gin.clear_config()
  return prefix, values


@pytest.mark.parametrize("initialize_student_weights", [False, True])
def test_build_model_makes_the_pair_starting_from_the_teacher(teacher_checkpoint,
                                                               initialize_student_weights):
  prefix, teacher = teacher_checkpoint
  _parse(SIZES + PAIR + _distillation(prefix, initialize_student_weights))
  try:
    model = utils.build_model("bi_student_teacher", VOCAB, VOCAB)
    assert isinstance(model, transformer.StudentTeacher)
    assert isinstance(model.student, transformer.Bitransformer)
    assert isinstance(model.teacher, transformer.Bitransformer)
    tf.random.set_seed(4)
    values = _initial_values(_graph(model))
  finally:
    gin.clear_config()
  assert sorted(values) == sorted(["teacher/" + n for n in teacher] +
                                  ["student/" + n for n in teacher])
  student_same = []
  for name, value in teacher.items():
    np.testing.assert_array_equal(values["teacher/" + name], value, err_msg=name)
    student_same.append(np.array_equal(values["student/" + name], value))
  if initialize_student_weights:
    assert all(student_same)
  else:  # only constant-initialised variables (norm scales of ones) agree by chance
    assert not all(student_same)
    for name, same in zip(teacher, student_same):
      assert not same or np.all(teacher[name] == 1.0), name


def test_a_teacher_checkpoint_of_another_model_is_named(teacher_checkpoint):
  prefix, _ = teacher_checkpoint
  _parse(SIZES + PAIR + _distillation(prefix) + ["teacher/Unitransformer.d_model = 16"])
  try:
    model = utils.build_model("bi_student_teacher", VOCAB, VOCAB)
    with pytest.raises(mtf.MtfError, match="teacher variable 'teacher/.*teacher_checkpoint"):
      _graph(model)
  finally:
    gin.clear_config()


def test_unknown_model_type_names_the_gin_parameter():
  with pytest.raises(mtf.MtfError, match="utils.run.model_type.*bi_student_teacher"):
    utils.build_model("bi_teacher_student", VOCAB, VOCAB)


def test_trainer_distils_without_changing_the_teacher(teacher_checkpoint, tmp_path):
  prefix, teacher = teacher_checkpoint
  model_dir = tmp_path / "pair"
  trainer_helpers.run_with(SIZES + PAIR + _distillation(prefix) + [
      "utils.run.model_type = 'bi_student_teacher'",
      "utils.run.model_dir = %r" % str(model_dir),
      "utils.run.sequence_length = {'inputs': %d, 'targets': %d}" % (LENGTH, LENGTH),
      "utils.run.batch_size = ('sequences_per_batch', %d)" % BATCH,
      "utils.run.train_steps = 1", "utils.run.save_checkpoints_steps = 1",
      "utils.run.iterations_per_loop = 1", "utils.run.learning_rate_schedule = 0.05",
      "utils.run.train_dataset_fn = @dataset.synthetic_reverse_dataset",
      "utils.run.eval_dataset_fn = @dataset.synthetic_reverse_dataset",
      "synthetic_reverse_dataset.num_tokens = 6",
      "utils.run.vocabulary = @vocabulary.ByteVocabulary()"])
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
  master = utils.get_variable_dtype().master_dtype  # the trainer's checkpoint dtype
  moved = 0
  for name, value in teacher.items():
    expected = tf.cast(value, master).numpy()
    np.testing.assert_array_equal(reader.get_tensor("teacher/" + name), expected,
                                  err_msg=name)
    moved += not np.array_equal(reader.get_tensor("student/" + name), expected)
  assert moved > len(teacher) // 2  # the student was trained from its own start
