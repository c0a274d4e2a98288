"""The original trainer's operative_config.gin, read through gin_compat, builds the
fixture's model: restored from the original checkpoint it reproduces the original's
logits and loss. Unsupported bindings are skipped and reported; unknown configurables
still fail with an MtfError naming them."""
import shutil

import gin
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.trainer import gin_compat
from models.transformer.trainer import gin_setup
from models.transformer import transformer
from models.transformer import transformer_layers
from models.transformer import utils
from models.transformer.context import ModeKeys
import orig_fixture
import trainer_helpers
from orig_fixture import FIXTURE

OPERATIVE = FIXTURE / "operative_config.gin"

pytestmark = pytest.mark.skipif(not OPERATIVE.exists(),
                                reason="fixture %s is not present" % FIXTURE)

# What the fixture's config binds that this port does not offer.
EXPECTED_SKIPPED = {"rewrite_stack_variables.max_combined_variable_size"}


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  gin_setup.import_configurables()
  yield
  gin.clear_config()


def _model_from_operative_config(capsys=None):
  gin_setup.parse_gin([str(OPERATIVE)], [], with_defaults=False)
  report = capsys.readouterr().out if capsys else ""
  # What the original's build_model passes for model_type="lm".
  model = utils.build_model(model_type="lm", input_vocab_size=64, output_vocab_size=64)
  return model, report


@orig_fixture.MESH_CASES
def test_operative_config_reproduces_original_logits(capsys, mesh_shape, layout, devices):
  model, report = _model_from_operative_config(capsys)
  assert "skipped 1 binding(s)" in report and "rewrite_stack_variables" in report
  # The config, not class defaults, decided the model.
  assert model.model_dim.size == 32 and model.output_vocab_dim.size == 128
  assert model.shared_embedding_and_softmax_weights
  assert [type(l) for l in model.layer_stack.layers] == [
      transformer_layers.SelfAttention, transformer_layers.DenseReluDense] * 2
  assert utils.get_variable_dtype().master_dtype == tf.bfloat16
  logits, loss, _, _ = orig_fixture.run_restored(
      model, mesh_shape, layout, devices, ModeKeys.EVAL, utils.get_variable_dtype())
  orig_fixture.check_against_original(logits, loss)


def test_skipped_bindings_are_exactly_the_unsupported_parameters():
  skipped = gin_compat.parse_original_config(OPERATIVE.read_text(), str(OPERATIVE))
  assert {s.binding for s in skipped} == EXPECTED_SKIPPED
  # Supported neighbours of the skipped lines were bound, the hyper-prompt ones too.
  layer = transformer_layers.SelfAttention()
  assert (layer.num_heads, layer.key_value_size, layer.z_loss_coeff) == (4, 16, None)
  assert (layer.use_hyperprompt, layer.hyperprompt_task_num) == (False, 8)
  assert gin.query_parameter("Unitransformer.vocab_divisor") == 128


def test_translate_text_rewrites_paths_and_aliases():
  text = "\n".join([
      "import mesh_tensorflow.optimize",
      "import mesh_tensorflow.transformer.transformer as mesh_tensorflow3",
      "from mesh_tensorflow.transformer import utils",
      "a.x = @mesh_tensorflow.transformer.transformer_layers.SelfAttention",
      "b.y = @mesh_tensorflow3.sublayer_rms_norm",
      "mesh_tensorflow.optimize.AdafactorOptimizer.beta1 = 0.0",
      "c.z = @mesh_tensorflow.transformer.learning_rate_schedules.constant",
      "d.w = @mesh_tensorflow.transformer.utils.get_variable_dtype()",
      "e.v = @mesh_tensorflow.layers.VarianceScalingInitializer()",
  ])
  out = [line for line in gin_compat.translate_text(text).split("\n") if line.strip()]
  assert out == [
      "a.x = @transformer_layers.SelfAttention",
      "b.y = @transformer.sublayer_rms_norm",
      "mesh_tf.optimize.AdafactorOptimizer.beta1 = 0.0",
      "c.z = @learning_rate_schedules.constant",
      "d.w = @utils.get_variable_dtype()",
      "e.v = @VarianceScalingInitializer()",
  ]
  assert gin_compat.is_original_config(text)
  assert not gin_compat.is_original_config("SelfAttention.num_heads = 4\n")


def test_full_module_paths_bind_to_port_configurables():
  skipped = gin_compat.parse_original_config("\n".join([
      "mesh_tensorflow.transformer.transformer_layers.SelfAttention.num_heads = 3",
      "mesh_tensorflow.optimize.AdafactorOptimizer.beta1 = 0.5",
      "mesh_tensorflow.transformer.utils.run.tpu_job_name = 'worker'",
      "mesh_tensorflow.transformer.utils.run.train_steps = 7",
      "mesh_tensorflow.transformer.utils.run.no_such_option = 1",
  ]))
  assert [s.binding for s in skipped] == ["utils.run.no_such_option"]
  assert gin.query_parameter("utils.run.tpu_job_name") == "worker"
  assert gin.query_parameter("transformer_layers.SelfAttention.num_heads") == 3
  assert gin.query_parameter("mesh_tf.optimize.AdafactorOptimizer.beta1") == 0.5
  assert gin.query_parameter("utils.run.train_steps") == 7
  assert transformer_layers.SelfAttention().num_heads == 3


def test_unknown_configurable_still_fails_naming_it():
  text = OPERATIVE.read_text() + "\nSelfAtention.num_heads = 4\n"
  with pytest.raises(mtf.MtfError, match="SelfAtention") as info:
    gin_compat.parse_original_config(text, "my_operative.gin")
  assert "my_operative.gin" in str(info.value)
  bad_ref = ("import mesh_tensorflow.transformer.transformer_layers as mesh_tensorflow4\n"
             "make_layer_stack.layers = [@mesh_tensorflow4.NoSuchLayer]\n")
  with pytest.raises(mtf.MtfError, match="NoSuchLayer"):
    gin_compat.parse_original_config(bad_ref, "bad_ref.gin")


def test_parse_gin_reports_unknown_configurable_in_original_file(tmp_path):
  path = tmp_path / "orig.gin"
  path.write_text("import mesh_tensorflow.optimize\n"
                  "mesh_tensorflow.optimize.NoSuchOptimizer.beta1 = 0.0\n")
  with pytest.raises(mtf.MtfError, match="NoSuchOptimizer") as info:
    gin_setup.parse_gin([str(path)], [], with_defaults=False)
  assert str(path) in str(info.value)


def test_main_trains_from_operative_config(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path, repeats=20)
  model_dir = tmp_path / "model"
  params = [
      "utils.run.model_dir = %r" % str(model_dir),
      "utils.run.sequence_length = 16", "utils.run.batch_size = 4",
      "utils.run.train_steps = 2", "utils.run.save_checkpoints_steps = 2",
      "utils.run.learning_rate_schedule = 0.01",
      "utils.run.train_dataset_fn = @dataset.text_corpus_dataset",
      "text_corpus_dataset.glob = %r" % corpus,
  ]
  cmd = trainer_helpers.main_command(params, mode="train")
  cmd.insert(3, "--gin_file=%s" % OPERATIVE)
  env = trainer_helpers.main_env()
  import subprocess  # pylint: disable=g-import-not-at-top
  proc = subprocess.run(cmd, cwd=trainer_helpers.REPO_ROOT, env=env, capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "skipped 1 binding(s)" in proc.stdout
  names = {n for n, _ in tf.train.list_variables(str(model_dir))}
  # The operative config's model: 2 blocks, tied embeddings, d_ff=64.
  assert "transformer/block_001/layer_001/DenseReluDense/wi/kernel" in names
  assert "transformer/logits/kernel" not in names
  shapes = dict(tf.train.list_variables(str(model_dir)))
  assert shapes["transformer/block_000/layer_001/DenseReluDense/wi/kernel"] == [32, 64]
  shutil.rmtree(model_dir)
