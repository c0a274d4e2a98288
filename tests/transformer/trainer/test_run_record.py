"""Checkpoints record the vocabulary and the model's hyperparameters; loading under other
ones is refused (or warns with utils.run.allow_checkpoint_mismatch). Also: layout rules
naming a mesh dim the mesh lacks, and placement meshes with more processors than
devices."""
import os
import shutil

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import trainer_helpers
from mesh_tf.errors import CheckpointError, LayoutError

RECORD_KEY = "mesh_tf_run_record"


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(model_dir, corpus) of a tiny LM trained 2 steps with ByteVocabulary."""
  root = tmp_path_factory.mktemp("run_record")
  corpus = trainer_helpers.write_corpus(root)
  model_dir = root / "lm"
  gin.clear_config()
  trainer_helpers.run_with(trainer_helpers.tiny_lm_bindings(model_dir, corpus,
                                                            train_steps=2))
  return model_dir, corpus


def _eval(model_dir, corpus, extra=()):
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=2)
  return trainer_helpers.run_with(params + ["utils.run.mode = 'eval'"] + list(extra))


def test_checkpoint_holds_the_record(trained):
  model_dir, _ = trained
  reader = tf.train.load_checkpoint(str(model_dir / "model.ckpt-2"))
  assert RECORD_KEY in reader.get_variable_to_shape_map()
  text = reader.get_tensor(RECORD_KEY).decode("utf-8")
  assert "ByteVocabulary" in text and "heads" in text and "d_kv" in text


def test_eval_under_another_vocabulary_size_is_refused(trained):
  model_dir, corpus = trained
  with pytest.raises(CheckpointError) as info:
    _eval(model_dir, corpus, ["utils.run.vocabulary = @vocabulary.ByteVocabulary()",
                              "vocabulary.ByteVocabulary.extra_ids = 5"])
  message = str(info.value).splitlines()[0]  # gin adds the configurable below
  assert "vocabulary size" in message and "259" in message and "264" in message
  assert "model.ckpt-2" in message


def test_eval_under_another_vocabulary_type_is_refused(trained, tmp_path):
  model_dir, corpus = trained
  subwords = tmp_path / "vocab.subwords"
  subwords.write_text("".join("'%s'\n" % s for s in
                              ["<pad>", "<EOS>", "the_", "cat_", "sat_", "a", "b", "_"]))
  with pytest.raises(CheckpointError) as info:
    _eval(model_dir, corpus, [
        "utils.run.vocabulary = @t2t_vocabulary.get_t2t_vocabulary()",
        "get_t2t_vocabulary.data_dir = %r" % str(tmp_path),
        "get_t2t_vocabulary.vocabulary_filename = 'vocab.subwords'"])
  message = str(info.value)
  assert "vocabulary type" in message
  assert "ByteVocabulary" in message and "T2tVocabulary" in message


def test_heads_and_d_kv_swap_is_refused(trained):
  model_dir, corpus = trained  # trained with num_heads = 4, d_kv = 4
  with pytest.raises(CheckpointError) as info:
    _eval(model_dir, corpus, ["num_heads = 2", "d_kv = 8"])
  message = str(info.value).splitlines()[0]  # gin adds the configurable below
  assert "heads=4" in message and "heads=2" in message
  assert "d_kv=4" in message and "d_kv=8" in message
  assert "model.ckpt-2" in message


def test_resume_training_under_other_heads_is_refused(trained, tmp_path):
  model_dir, corpus = trained
  copy = tmp_path / "copy"
  shutil.copytree(model_dir, copy)
  params = trainer_helpers.tiny_lm_bindings(copy, corpus, train_steps=4)
  with pytest.raises(CheckpointError) as info:
    trainer_helpers.run_with(params + ["num_heads = 2", "d_kv = 8"])
  assert "heads=4" in str(info.value) and "heads=2" in str(info.value)
  assert not (copy / "model.ckpt-4.index").exists()


def test_leniency_option_warns_and_loads(trained, capsys):
  model_dir, corpus = trained
  capsys.readouterr()
  results = _eval(model_dir, corpus, ["num_heads = 2", "d_kv = 8",
                                      "utils.run.allow_checkpoint_mismatch = True"])
  assert np.isfinite(results["loss"])
  warnings = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith("warning:")]
  assert len(warnings) == 1
  assert "heads=4" in warnings[0] and "heads=2" in warnings[0]


def test_checkpoint_without_a_record_still_loads(trained, tmp_path):
  model_dir, corpus = trained
  old = tmp_path / "old"
  old.mkdir()
  reader = tf.train.load_checkpoint(str(model_dir / "model.ckpt-2"))
  names = sorted(n for n in reader.get_variable_to_shape_map() if n != RECORD_KEY)
  mtf.checkpoint.files.write_bundle(str(old / "model.ckpt-2"), names,
                                    [tf.constant(reader.get_tensor(n)) for n in names])
  mtf.checkpoint.files.record_latest(str(old / "model.ckpt-2"))
  results = _eval(old, corpus)
  assert results["step"] == 2 and np.isfinite(results["loss"])


def test_layout_rule_naming_an_absent_mesh_dim_warns(trained, capsys):
  model_dir, corpus = trained
  capsys.readouterr()
  _eval(model_dir, corpus, ["utils.run.mesh_shape = 'rows:2;cols:2'",
                            "utils.run.layout_rules = 'batch:row;heads:cols'"])
  warnings = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith("warning:")]
  assert len(warnings) == 1, warnings
  assert "batch:row" in warnings[0] and "'row'" in warnings[0]
  assert "rows" in warnings[0] and "cols" in warnings[0]


def test_strict_layout_makes_it_an_error(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  params = trainer_helpers.tiny_lm_bindings(tmp_path / "m", corpus, train_steps=1)
  with pytest.raises(LayoutError) as info:
    trainer_helpers.run_with(params + ["utils.run.mesh_shape = 'batch:2'",
                                       "utils.run.layout_rules = 'batch:bacth'",
                                       "utils.run.strict_layout = True"])
  assert "batch:bacth" in str(info.value) and "'bacth'" in str(info.value)
  assert not (tmp_path / "m" / "model.ckpt-1.index").exists()


def test_absent_mesh_dims_are_listed_by_the_mesh_layout():
  layout = mtf.MeshLayout("rows:2;cols:4", "batch:row;d_ff:cols;heads:model")
  assert layout.rules_naming_absent_mesh_dims() == [("batch", "row"),
                                                    ("heads", "model")]


def test_placement_mesh_with_more_processors_than_devices_is_refused(tmp_path):
  devices = ["/cpu:%d" % (i % 8) for i in range(16)]
  with pytest.raises(LayoutError) as info:
    mtf.PlacementMeshImpl("batch:4;model:4", "", devices)
  message = str(info.value)
  assert "16 processors" in message and "8 devices" in message
  corpus = trainer_helpers.write_corpus(tmp_path)
  params = trainer_helpers.tiny_lm_bindings(tmp_path / "m", corpus, train_steps=1)
  with pytest.raises(LayoutError) as info:
    trainer_helpers.run_with(params + ["utils.run.mesh_shape = 'batch:4;model:4'",
                                       "utils.run.mesh_devices = %r" % devices])
  assert "16 processors" in str(info.value) and "8 devices" in str(info.value)


def test_fewer_layers_than_the_checkpoint_is_refused(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "two_layers"
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=1,
                                            save_every=1) + ["num_layers = 2"]
  trainer_helpers.run_with(params)
  gin.clear_config()
  with pytest.raises(CheckpointError) as info:
    _eval(model_dir, corpus, ["num_layers = 1"])
  message = str(info.value).splitlines()[0]
  assert "block_001" in message and "which this model lacks" in message
