"""Every model file of the original's gin tree (../shared/fixtures/orig_gin/models),
with the original's defaults.gin and its 2x2 layout, builds at toy size and trains one
step through the trainer on a 2x2 mesh (the file's layers and model type, tiny sizes)."""
import math
import pathlib

import gin
import pytest

import trainer_helpers
from models.transformer import gin_setup
from models.transformer import utils

ORIG_GIN = pathlib.Path(trainer_helpers.REPO_ROOT).parent / "shared" / "fixtures" / \
    "orig_gin"
MODEL_FILES = sorted(p.name for p in (ORIG_GIN / "models").glob("*.gin"))

# Toy sizes over the file's macros and MoE settings; data, vocabulary and mesh for CPU.
TOY = ["num_layers = 1", "d_model = 16", "d_ff = 32", "num_heads = 4", "d_kv = 4",
       "MoE1D.num_experts = 4", "MoE1D.hidden_size = 16", "dropout_rate = 0.0",
       "utils.run.vocabulary = @vocabulary.ByteVocabulary()",
       "utils.run.sequence_length = {'inputs': 8, 'targets': 8}",
       "utils.run.batch_size = ('sequences_per_batch', 8)",
       "utils.run.train_steps = 1", "utils.run.save_checkpoints_steps = 1",
       "utils.run.iterations_per_loop = 1", "utils.run.learning_rate_schedule = 0.01",
       "utils.run.train_dataset_fn = @dataset.synthetic_reverse_dataset",
       "synthetic_reverse_dataset.num_tokens = 6",
       "utils.run.mesh_shape = 'batch:2;model:2'",
       "Unitransformer.max_length = 8"]


def test_the_model_files_are_here():
  assert len(MODEL_FILES) == 13, ORIG_GIN


@pytest.mark.parametrize("name", MODEL_FILES)
def test_original_model_file_trains_a_step_on_2x2(tmp_path, name):
  gin.clear_config()
  try:
    for path in ("defaults.gin", "models/" + name, "layouts/2x2_dp_mp.gin"):
      assert gin_setup.parse_gin_file(str(ORIG_GIN / path)) == [], path
    gin.parse_config(TOY + ["utils.run.model_dir = %r" % str(tmp_path / "model")])
    history = utils.run()
  finally:
    gin.clear_config()
  assert len(history) == 1 and math.isfinite(history[0][1]), history
  assert (tmp_path / "model" / "model.ckpt-1.index").exists()
