"""Every model file of the original's gin tree (../shared/fixtures/orig_gin/models),
with the original's defaults.gin and its 2x2 layout, builds at toy size and trains
through the trainer on a 2x2 mesh (the file's layers and model type, tiny sizes): a
step on a batch lowers its loss, and (one file of each model type, on the placement
backend; the others in SIMD emulation) the first loss is one device's."""
import math
import pathlib

import gin
import pytest

import trainer_helpers
from models.transformer.trainer import gin_setup
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


# One file of each model type (decoder-only, encoder-decoder, the original's
# Transformer) is also run on one device; the others share their code paths, and the
# suite's time is better spent elsewhere. MoE files are left out: they route within
# groups that follow the mesh's batch split (as in the original), so a 2x2 mesh's loss
# may differ from one device's.
COMPARED_WITH_ONE_DEVICE = ("lm_w1.gin", "bi_w1.gin", "aiayn_base.gin", "tiny.gin")


def test_the_model_files_are_here():
  assert len(MODEL_FILES) == 13, ORIG_GIN
  assert set(COMPARED_WITH_ONE_DEVICE) <= set(MODEL_FILES)


def _train_one_step(name, model_dir, extra=()):
  gin.clear_config()
  try:
    for path in ("defaults.gin", "models/" + name, "layouts/2x2_dp_mp.gin"):
      assert gin_setup.parse_gin_file(str(ORIG_GIN / path)) == [], path
    gin.parse_config(TOY + ["utils.run.model_dir = %r" % str(model_dir)] + list(extra))
    return utils.run()
  finally:
    gin.clear_config()


@pytest.mark.parametrize("name", MODEL_FILES)
def test_original_model_file_trains_a_step_on_2x2(tmp_path, name):
  # Every batch holds the same 8 examples, so the second step's loss is that of the
  # weights after one update on the batch of the first.
  same_batch = ["utils.run.train_steps = 2",
                "synthetic_reverse_dataset.num_train_examples = 8"]
  if name not in COMPARED_WITH_ONE_DEVICE:
    # The 2x2 mesh as SIMD emulation (one program for the 4 processors) where no
    # one-device comparison follows: the placement backend's 2x2 runs are the
    # compared files'.
    same_batch.append("make_mesh_impl.backend = 'simd'")
  history = _train_one_step(name, tmp_path / "model", same_batch)
  assert [s for s, _ in history] == [1, 2] and all(
      math.isfinite(loss) for _, loss in history), history
  assert history[1][1] < history[0][1], history
  assert (tmp_path / "model" / "model.ckpt-2.index").exists()
  if name not in COMPARED_WITH_ONE_DEVICE:
    return
  # The same seed gives the same initial weights on one device: the first step's loss
  # (the loss of those weights on the first batch) is the 2x2 mesh's.
  single = _train_one_step(name, tmp_path / "single", same_batch + [
      "utils.run.train_steps = 1", "utils.run.mesh_shape = ''",
      "utils.run.layout_rules = ''"])
  assert history[0][1] == pytest.approx(single[0][1], rel=1e-5), (history, single)
