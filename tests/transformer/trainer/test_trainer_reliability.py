"""The trainer never loses checkpoints: a lost or garbled state file, a missing index, a
NaN loss, leftovers of killed runs, and bad values (in-process, on the tiny byte LM)."""
import os
import re
import shutil
import uuid

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import trainer_helpers
from mesh_tf.checkpoint import discovery, files
from mesh_tf.errors import CheckpointError, MtfError, NonFiniteError
from models import train_steps as shared_steps
from models.transformer import utils


def _params(model_dir, corpus, **kwargs):
  kwargs.setdefault("keep", 3)
  return trainer_helpers.tiny_lm_bindings(model_dir, corpus, **kwargs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(model_dir, corpus): the tiny LM trained to step 4, checkpoints at steps 2 and 4."""
  root = tmp_path_factory.mktemp("trained")
  corpus = trainer_helpers.write_corpus(root)
  model_dir = root / "model"
  trainer_helpers.run_with(_params(model_dir, corpus, train_steps=4, save_every=2))
  return model_dir, corpus


def _copy(trained, tmp_path):
  model_dir = tmp_path / "model"
  shutil.copytree(trained[0], model_dir)
  return model_dir, trained[1]


def _checkpoint_bytes(model_dir):
  return {n: (model_dir / n).read_bytes() for n in os.listdir(model_dir)
          if n.startswith("model.ckpt-")}


def _break_state(model_dir, how):
  state = model_dir / "checkpoint"
  if how == "garbage":
    state.write_text("model_checkpoint_path: model.ckpt-4 {{{ not a proto\n")
  elif how == "empty":
    state.write_text("")
  elif how == "binary":
    state.write_bytes(bytes(range(256)) * 4)
  elif how == "missing":
    state.unlink()
  elif how == "newest_index_missing":
    (model_dir / "model.ckpt-4.index").unlink()


_NOTES = {
    "garbage": r"state file \S+checkpoint is garbled \(line 1",
    "empty": r"state file \S+checkpoint is empty",
    "binary": r"state file \S+checkpoint is not text",
    "missing": r"state file \S+checkpoint is missing",
    "newest_index_missing": r"the latest checkpoint the state file names, model\.ckpt-4, "
                            r"is incomplete",
}


@pytest.mark.parametrize("how", sorted(_NOTES))
def test_broken_state_file_resumes_from_newest_complete_checkpoint(trained, tmp_path,
                                                                   capsys, how):
  model_dir, corpus = _copy(trained, tmp_path)
  _break_state(model_dir, how)
  expected = 2 if how == "newest_index_missing" else 4
  before = _checkpoint_bytes(model_dir)
  capsys.readouterr()

  # Eval uses the same rule, says so in one line, and writes no checkpoint.
  result = trainer_helpers.run_with(_params(model_dir, corpus), mode="eval")
  out = capsys.readouterr().out
  assert result["checkpoint"] == str(model_dir / ("model.ckpt-%d" % expected))
  assert re.search(_NOTES[how] + r".*using \S*model\.ckpt-%d" % expected, out), out
  assert _checkpoint_bytes(model_dir) == before

  # Train resumes there, rewrites the state file, and overwrites nothing.
  history = trainer_helpers.run_with(_params(model_dir, corpus, train_steps=6,
                                             save_every=2, log_every=1))
  out = capsys.readouterr().out
  assert re.search(_NOTES[how], out), out
  assert "rewrote the state file" in out
  assert re.search(r"resumed from \S*model\.ckpt-%d at step %d" % (expected, expected),
                   out), out
  assert [s for s, _ in history] == list(range(expected + 1, 7))
  after = _checkpoint_bytes(model_dir)
  for name, content in before.items():
    if how == "newest_index_missing" and name.startswith("model.ckpt-4"):
      continue  # never a complete checkpoint; step 4 was trained and saved again
    assert after[name] == content, name
  state = tf.train.get_checkpoint_state(str(model_dir))
  assert state.model_checkpoint_path.endswith("model.ckpt-6")


def test_decode_falls_back_to_the_next_complete_checkpoint(trained, tmp_path, capsys):
  model_dir, corpus = _copy(trained, tmp_path)
  _break_state(model_dir, "newest_index_missing")
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("the cat\n")
  capsys.readouterr()
  trainer_helpers.run_with(_params(model_dir, corpus) + [
      "utils.run.decode_input_file = %r" % str(prompts),
      "utils.run.decode_output_file = %r" % str(tmp_path / "out.txt")], mode="decode")
  out = capsys.readouterr().out
  assert re.search(_NOTES["newest_index_missing"] + r".*using model\.ckpt-2", out), out
  assert "decoding with %s" % (model_dir / "model.ckpt-2") in out
  assert len((tmp_path / "out.txt").read_text().splitlines()) == 1


def test_leftovers_of_killed_saves_and_prunes_are_removed_on_restart(trained, tmp_path,
                                                                     capsys):
  model_dir, corpus = _copy(trained, tmp_path)
  # A kill during a save leaves hidden temporaries (files.write_bundle's names) ...
  tmp = ".model.ckpt-6.tmp-%s" % uuid.uuid4().hex
  leftovers = [tmp + ".data-00000-of-00001", tmp + ".index",
               ".checkpoint.tmp-%s" % uuid.uuid4().hex]
  for name in leftovers:
    (model_dir / name).write_bytes(b"partial")
  # ... and a kill while pruning, after the state file dropped model.ckpt-2 and its
  # index was removed, leaves its data file.
  files.write_state(str(model_dir), [str(model_dir / "model.ckpt-4")])
  (model_dir / "model.ckpt-2.index").unlink()
  leftovers.append("model.ckpt-2.data-00000-of-00001")
  assert discovery.leftovers(str(model_dir)) == sorted(str(model_dir / n)
                                                        for n in leftovers)
  kept = _checkpoint_bytes(model_dir)
  capsys.readouterr()
  trainer_helpers.run_with(_params(model_dir, corpus, train_steps=5, save_every=5))
  out = capsys.readouterr().out
  assert "removed 4 file(s) left by an interrupted run" in out
  names = set(os.listdir(model_dir))
  assert not names & set(leftovers)
  assert not [n for n in names if ".tmp-" in n]
  for index in [n for n in names if n.endswith(".index")]:
    assert discovery.is_complete(str(model_dir / index[:-len(".index")]))
  assert all(_checkpoint_bytes(model_dir)[n] == kept[n] for n in kept
             if n.startswith("model.ckpt-4"))


def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "model"
  diverging = _params(model_dir, corpus, train_steps=30, save_every=2, keep=2,
                      log_every=1) + [
                          "utils.run.optimizer = @mesh_tf.optimize.SgdOptimizer",
                          "utils.run.learning_rate_schedule = 1e5"]
  with pytest.raises(NonFiniteError) as info:
    trainer_helpers.run_with(diverging)
  message = str(info.value)
  step = int(re.search(r"loss is (?:nan|inf|-inf) at step (\d+)", message).group(1))
  kept = mtf.CheckpointManager(str(model_dir), {}).checkpoints
  assert kept and "the last good checkpoint is %s" % kept[-1] in message
  assert all(files.step_from_prefix(p) < step for p in kept)
  assert "skip_nonfinite_updates" in message
  for prefix in kept:  # every checkpoint written is finite and loads
    reader = tf.train.load_checkpoint(prefix)
    for name, dtype in reader.get_variable_to_dtype_map().items():
      if dtype.is_floating:
        assert np.all(np.isfinite(reader.get_tensor(name))), (prefix, name)
  capsys.readouterr()


def _poison_step(monkeypatch, bad_step):
  """Makes the loss the trainer sees NaN at global step bad_step (0-based)."""
  real = shared_steps.lower_train_step

  def poisoned(lowering, loss, update_ops, skip_nonfinite=False):
    export = lowering.export_to_tf_tensor

    def export_poisoned(tensor):
      value = export(tensor)
      if tensor is loss:
        bad = tf.equal(mtf.optimize.get_global_step(), bad_step)
        value = value * tf.where(bad, float("nan"), 1.0)
      return value
    lowering.export_to_tf_tensor = export_poisoned
    return real(lowering, loss, update_ops, skip_nonfinite=skip_nonfinite)
  monkeypatch.setattr(shared_steps, "lower_train_step", poisoned)


def test_skip_nonfinite_updates_leaves_the_variables_unchanged(tmp_path, monkeypatch,
                                                               capsys):
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "model"
  _poison_step(monkeypatch, 2)
  params = _params(model_dir, corpus, train_steps=4, save_every=1, keep=4, log_every=1)
  with pytest.raises(NonFiniteError, match="loss is nan at step 3"):
    trainer_helpers.run_with(params)
  shutil.rmtree(model_dir)
  capsys.readouterr()
  trainer_helpers.run_with(params + ["utils.run.skip_nonfinite_updates = True"])
  assert "step 3: loss is nan; its update was skipped (1 step(s) skipped so far)" in (
      capsys.readouterr().out)

  def weights(step):
    reader = tf.train.load_checkpoint(str(model_dir / ("model.ckpt-%d" % step)))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if n != "global_step"}
  w2, w3, w4 = weights(2), weights(3), weights(4)
  for name in w2:
    np.testing.assert_array_equal(w3[name], w2[name], err_msg=name)  # skipped
  assert any(not np.array_equal(w4[n], w3[n]) for n in w3)  # step 4 updated again


def test_checkpoint_with_nonfinite_variable_is_not_written(tmp_path):
  impl = mtf.PlacementMeshImpl("", "", [""])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", [mtf.Dimension("a", 4)],
                       initializer=tf.zeros_initializer())
  lowering = mtf.Lowering(graph, {mesh: impl})
  manager = mtf.CheckpointManager(str(tmp_path), lowering, require_finite=True)
  first = manager.save(1)
  lowering.variables[w.operation].assign_full(tf.constant([0.0, np.inf, np.nan, 1.0]))
  with pytest.raises(NonFiniteError, match=r"variable 'w' holds 2 NaN/Inf value\(s\) "
                     "of 4"):
    manager.save(2)
  assert manager.checkpoints == [first]
  assert sorted(os.listdir(tmp_path)) == ["checkpoint", "model.ckpt-1.data-00000-of-00001",
                                          "model.ckpt-1.index"]


def test_a_save_never_writes_over_an_existing_checkpoint(tmp_path):
  impl = mtf.PlacementMeshImpl("", "", [""])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.get_variable(mesh, "w", [mtf.Dimension("a", 4)])
  lowering = mtf.Lowering(graph, {mesh: impl})
  prefix = mtf.save_checkpoint(str(tmp_path / "model.ckpt"), lowering, global_step=3)
  before = _checkpoint_bytes(tmp_path)
  with pytest.raises(CheckpointError, match="model.ckpt-3 already exists; refusing"):
    mtf.save_checkpoint(str(tmp_path / "model.ckpt"), lowering, global_step=3)
  with pytest.raises(CheckpointError, match="already exists"):
    mtf.CheckpointManager(str(tmp_path), lowering).save(3)
  assert _checkpoint_bytes(tmp_path) == before and prefix.endswith("model.ckpt-3")


def test_full_disk_while_writing_the_state_file(trained, tmp_path, monkeypatch):
  model_dir, _ = _copy(trained, tmp_path)
  state_before = (model_dir / "checkpoint").read_bytes()
  real_gfile = tf.io.gfile.GFile

  class FullDisk(real_gfile):
    def write(self, data):
      raise OSError(28, "No space left on device")
  monkeypatch.setattr(tf.io.gfile, "GFile", FullDisk)
  with pytest.raises(CheckpointError, match=r"could not write the checkpoint state file "
                     r"\S+checkpoint: .*No space left on device"):
    files.write_state(str(model_dir), [str(model_dir / "model.ckpt-2")])
  monkeypatch.setattr(tf.io.gfile, "GFile", real_gfile)
  assert (model_dir / "checkpoint").read_bytes() == state_before
  assert not [n for n in os.listdir(model_dir) if ".tmp-" in n]


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.mark.parametrize("binding,named", [
    ("utils.run.save_checkpoints_steps = 0", "save_checkpoints_steps = 0"),
    ("utils.run.save_checkpoints_steps = -5", "save_checkpoints_steps = -5"),
    ("utils.run.iterations_per_loop = 0", "iterations_per_loop = 0"),
    ("utils.run.eval_steps = -1", "eval_steps = -1"),
    ("utils.run.sequence_length = 0", "sequence_length = 0"),
    ("utils.run.mesh_shape = 'batch:0'", "mesh dim 'batch' has size 0"),
    ("utils.run.train_steps = 2.5", "train_steps = 2.5"),
    ("utils.run.train_steps = 'many'", "train_steps = 'many'"),
    ("utils.run.model_dir = ''", "model_dir = ''"),
])
def test_bad_values_get_one_line_errors_before_anything_is_built(tmp_path, binding,
                                                                 named):
  corpus = trainer_helpers.write_corpus(tmp_path)
  params = _params(tmp_path / "model", corpus) + [binding]
  with pytest.raises(MtfError) as info:
    trainer_helpers.run_with(params)
  first_line = str(info.value).splitlines()[0]
  assert "utils.run." in first_line and named in first_line, first_line
  assert not (tmp_path / "model").exists()


def test_blank_data_file_and_non_utf8_input_file_are_named(tmp_path):
  blank = tmp_path / "blank.txt"
  blank.write_text("  \n\n \t\n")
  with pytest.raises(MtfError, match="no text in %s: it is empty or only whitespace"
                     % re.escape(str(blank))):
    trainer_helpers.run_with(_params(tmp_path / "model", str(blank)))
  assert not os.path.exists(tmp_path / "model" / "checkpoint")
  binary = tmp_path / "prompts.txt"
  binary.write_bytes(b"hello\n\xff\xfeworld\n")
  with pytest.raises(MtfError, match=r"input file %s is not UTF-8 text: byte 6 is 0xff"
                     % re.escape(str(binary))):
    utils.get_inputs_from_file(str(binary))


def test_unwritable_model_dir_is_named(tmp_path):
  not_a_dir = tmp_path / "file"
  not_a_dir.write_text("x")
  corpus = trainer_helpers.write_corpus(tmp_path)
  with pytest.raises(CheckpointError, match="cannot write to model_dir %s"
                     % re.escape(str(not_a_dir / "model"))):
    trainer_helpers.run_with(_params(not_a_dir / "model", corpus))


def test_resuming_a_model_of_another_size_names_the_variable(trained, tmp_path):
  model_dir, corpus = _copy(trained, tmp_path)
  before = _checkpoint_bytes(model_dir)
  with pytest.raises(CheckpointError) as info:
    trainer_helpers.run_with(_params(model_dir, corpus, train_steps=6) + [
        "num_layers = 2"])
  message = str(info.value)
  assert re.search(r"has no variable '\S*block_001/\S+'", message), message
  assert "allow_missing" not in message and "new --model_dir" in message
  assert _checkpoint_bytes(model_dir) == before


def _skip_attention(name):
  return "SelfAttention" not in name


def test_warm_start_loads_only_the_variables_the_filter_accepts(trained, tmp_path):
  source, corpus = trained
  gin.external_configurable(_skip_attention, name="skip_attention_for_test")
  warm = tmp_path / "warm"
  trainer_helpers.run_with(_params(warm, corpus, train_steps=1, save_every=1) + [
      "utils.run.init_checkpoint = %r" % str(source / "model.ckpt-4"),
      "utils.run.learning_rate_schedule = 0.0",
      "utils.should_load_variable.filter_fn = @skip_attention_for_test"])
  loaded = tf.train.load_checkpoint(str(warm / "model.ckpt-1"))
  original = tf.train.load_checkpoint(str(source / "model.ckpt-4"))
  names = [n for n in loaded.get_variable_to_shape_map() if "slot" not in n
           and n != "global_step"]
  attention = [n for n in names if "SelfAttention" in n]
  assert attention and len(attention) < len(names)
  for name in names:
    same = np.array_equal(loaded.get_tensor(name), original.get_tensor(name))
    assert same == (name not in attention), name
