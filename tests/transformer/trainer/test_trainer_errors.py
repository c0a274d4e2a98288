"""Bad input to the trainer: each raises an MtfError naming the file, binding or dim."""
import os

import gin
import pytest

import trainer_helpers
from mesh_tf.errors import CheckpointError, LayoutError, MtfError
from models.transformer.trainer import gin_setup
from models.transformer import utils


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _run(params, **kwargs):
  gin_setup.parse_gin([], params)
  return utils.run(**kwargs)


def test_unknown_configurable_in_binding():
  with pytest.raises(MtfError, match=r"gin binding 'no_such_thing.size = 3'.*no_such_thing"):
    gin_setup.parse_gin([], ["no_such_thing.size = 3"])


def test_unknown_parameter_in_binding():
  with pytest.raises(MtfError, match=r"utils.run.trian_steps = 5.*trian_steps"):
    gin_setup.parse_gin([], ["utils.run.trian_steps = 5"])


def test_unknown_configurable_in_gin_file_names_the_file(tmp_path):
  path = tmp_path / "bad.gin"
  path.write_text("num_layers = 1\nUnitransformer.d_modle = 8\n")
  with pytest.raises(MtfError, match=r"gin file %s.*d_modle" % path):
    gin_setup.parse_gin([str(path)], [])


def test_missing_gin_file():
  with pytest.raises(MtfError, match=r"gin file models/nope.gin not found"):
    gin_setup.parse_gin(["models/nope.gin"], [])


def test_unknown_mode(tmp_path):
  with pytest.raises(MtfError, match=r"unknown mode 'trian'"):
    _run(["utils.run.model_dir = %r" % str(tmp_path)], mode="trian")


def test_layout_naming_a_dim_the_model_lacks(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  params = trainer_helpers.tiny_lm_bindings(tmp_path / "m", corpus) + [
      "utils.run.mesh_shape = 'm:2'", "utils.run.layout_rules = 'batch:m;hiden:m'"]
  with pytest.raises(LayoutError, match=r"rule 'hiden:m' names dim 'hiden'.*d_model"):
    _run(params)
  assert not os.path.exists(tmp_path / "m" / "checkpoint")


def test_mesh_that_does_not_divide_a_model_dim(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  params = trainer_helpers.tiny_lm_bindings(tmp_path / "m", corpus) + [
      "utils.run.mesh_shape = 'm:8'", "utils.run.layout_rules = 'heads:m'"]
  with pytest.raises(LayoutError, match=r'heads=4 is split over mesh dim "m" \(size 8\)'):
    _run(params)


def test_missing_data_file(tmp_path):
  missing = str(tmp_path / "no_such_corpus.txt")
  params = trainer_helpers.tiny_lm_bindings(tmp_path / "m", missing)
  with pytest.raises(MtfError, match=missing):
    _run(params)
  assert not os.path.exists(tmp_path / "m" / "checkpoint")


def test_checkpoint_of_another_model_is_refused_and_nothing_written(tmp_path, capsys):
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "m"
  _run(trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=2))
  gin.clear_config()
  before = {n: os.stat(model_dir / n).st_mtime_ns for n in os.listdir(model_dir)
            if n != ".mesh_tf.lock"}  # the lock file records each run that tried
  bigger = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=4) + [
      "d_model = 32"]
  with pytest.raises(CheckpointError) as info:
    _run(bigger)
  message = str(info.value)
  assert "model.ckpt-2.index" in message
  assert "transformer/" in message and "shape" in message
  after = {n: os.stat(model_dir / n).st_mtime_ns for n in os.listdir(model_dir)
           if n != ".mesh_tf.lock"}
  assert after == before
  capsys.readouterr()
