"""utils.run.layout_rules = "auto": the trainer searches a layout before training, prints
it, trains on it, and records it in operative_config.gin."""
import re

import gin
import pytest

import mesh_tf as mtf
import trainer_helpers
from mesh_tf.errors import MtfError
from models.transformer.trainer import auto_layout
from models.transformer import utils


def test_auto_layout_chooses_trains_and_records(tmp_path, capsys):
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "model"
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=2) + [
      "make_mesh_impl.backend = 'simd'", "utils.run.mesh_shape = 8",
      "utils.run.layout_rules = 'auto'"]
  history = trainer_helpers.run_with(params)
  out = capsys.readouterr().out
  match = re.search(r"Chosen: mesh (\S+), rules (\S+)", out)
  assert match, out
  chosen_mesh = match.group(1)
  assert mtf.convert_to_shape(chosen_mesh).size == 8
  config = (model_dir / "operative_config.gin").read_text()
  recorded = re.search(r"^utils.run.mesh_shape = '(\S+)'\nutils.run.layout_rules = "
                       r"'(\S*)'$", config, re.M)
  assert recorded and recorded.group(1) == chosen_mesh, config
  chosen_rules = recorded.group(2)
  assert match.group(2) == (chosen_rules or "(none)")
  assert "training Unitransformer on mesh %s, layout %s (SimdMeshImpl)" % (
      chosen_mesh, chosen_rules) in out
  assert len(history) == 1

  # The choice is what the search function returns for the same train graph, and the
  # recorded operative config reproduces it without a search.
  gin.clear_config()
  def model_fn():
    return utils.build_model(model_type="lm", input_vocab_size=256,
                             output_vocab_size=256)
  try:
    from models.transformer.trainer import gin_setup  # pylint: disable=g-import-not-at-top
    gin_setup.parse_gin([], trainer_helpers.tiny_lm_bindings(model_dir, corpus)[:7])
    chosen, _ = auto_layout.choose(model_fn, 8, 8, 16, utils.get_variable_dtype(), None)
  finally:
    gin.clear_config()
  assert (chosen.shape.to_string, str(chosen.layout_rules)) == (chosen_mesh, chosen_rules)


def test_device_count_without_auto_is_refused(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  params = trainer_helpers.tiny_lm_bindings(tmp_path / "m", corpus) + [
      "utils.run.mesh_shape = 8"]
  with pytest.raises(MtfError, match="a device count needs utils.run.layout_rules = "
                     "'auto'"):
    trainer_helpers.run_with(params)
