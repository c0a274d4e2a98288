"""utils.run with the original's parameters: its defaults apply where gin binds nothing,
and its options this trainer does not offer are refused by name."""
import re

import gin
import pytest

import trainer_helpers
from mesh_tf.errors import MtfError
from models.transformer.trainer import gin_setup
from models.transformer import utils


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_options_the_trainer_does_not_offer_are_named(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  gin_setup.parse_gin([], trainer_helpers.tiny_lm_bindings(tmp_path / "m", corpus))
  with pytest.raises(MtfError, match=r"utils.run: checkpoint_input_pipeline, "
                     r"skip_seen_data not supported by this port's trainer"):
    utils.run(skip_seen_data=True, checkpoint_input_pipeline=True)
  with pytest.raises(MtfError, match="utils.run: tpu not supported"):
    utils.run("job", "my-tpu", None, None)  # the original's leading positionals
  assert not (tmp_path / "m").exists()


def test_train_steps_from_auto_train_steps(tmp_path, capsys):
  corpus = trainer_helpers.write_corpus(tmp_path)
  params = [p for p in trainer_helpers.tiny_lm_bindings(tmp_path / "m", corpus)
            if not p.startswith("utils.run.train_steps")]
  # 8 sequences x 16 tokens a step: 256 tokens make 2 steps.
  history = trainer_helpers.run_with(params + [
      "utils.run.train_steps = @utils.auto_train_steps",
      "auto_train_steps.train_tokens = 256"])
  # The announced target is step 2 exactly (not 20, 200, ...), and training stopped there.
  assert re.search(r"\bto step 2$", capsys.readouterr().out, re.M)
  assert history[-1][0] == 2
  assert (tmp_path / "m" / "model.ckpt-2.index").exists()
  assert not (tmp_path / "m" / "model.ckpt-4.index").exists()
