"""Reading "the latest checkpoint" of a model_dir while a trainer saves and prunes it."""
import subprocess
import time

import pytest
import tensorflow as tf

import mesh_tf as mtf
import trainer_helpers
from mesh_tf.checkpoint import discovery, files, save_restore
from models.transformer import utils


def _variables_like(model_dir):
  """{name: tf.Variable} of every key of model_dir's checkpoints (zeros)."""
  for _ in range(100):  # the checkpoint may be pruned before this reads it
    try:
      reader = tf.train.load_checkpoint(discovery.find_checkpoints(model_dir)
                                        .checkpoints[-1])
      break
    except tf.errors.NotFoundError:
      continue
  dtypes = reader.get_variable_to_dtype_map()
  return {name: tf.Variable(tf.zeros(shape, dtypes[name]))
          for name, shape in reader.get_variable_to_shape_map().items()}


def _wait_for_checkpoint(model_dir, proc, timeout=180):
  deadline = time.time() + timeout
  while time.time() < deadline:
    found = discovery.find_checkpoints(model_dir).checkpoints
    if found:
      return found[-1]
    assert proc.poll() is None, "trainer exited early with %s" % proc.returncode
    time.sleep(0.2)
  raise AssertionError("no checkpoint within %d s" % timeout)


def test_reading_latest_while_trainer_saves_every_step_keeping_one(tmp_path):
  corpus = trainer_helpers.write_corpus(tmp_path)
  model_dir = str(tmp_path / "model")
  params = trainer_helpers.tiny_lm_bindings(model_dir, corpus, train_steps=100000,
                                            save_every=1, keep=1, log_every=50)
  proc = trainer_helpers.start_main(params, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
  failures, steps, reads = [], [], 0
  try:
    _wait_for_checkpoint(model_dir, proc)
    variables = _variables_like(model_dir)
    deadline = time.time() + 30
    for _ in range(150):
      if time.time() > deadline:
        break
      reads += 2
      try:
        result = mtf.restore_checkpoint(model_dir, None, extra_variables=variables)
        steps.append(result.global_step)
        assert result.global_step == files.step_from_prefix(result.path)
      except mtf.MtfError as e:  # a CheckpointError, or no checkpoint found
        failures.append("directory: %s" % e)
      try:  # the path the original's checkpoint iterator gives for "the latest"
        for path in utils.get_checkpoint_iterator(None, model_dir):
          mtf.restore_checkpoint(path, None, extra_variables=variables)
      except mtf.MtfError as e:
        failures.append("iterator: %s" % e)
      assert proc.poll() is None, "trainer exited with %s" % proc.returncode
  finally:
    proc.kill()
    proc.wait()
  assert len(steps) >= 20, "only %d reads" % len(steps)
  assert len(set(steps)) > 5, "the trainer hardly moved: %s" % sorted(set(steps))
  assert steps == sorted(steps)
  assert not failures, "%d of %d reads failed (%d of the directory), e.g. %s" % (
      len(failures), reads, sum(f.startswith("directory") for f in failures),
      failures[0])


def _two_checkpoints(directory):
  """Saves steps 1 and 2 of {w, global_step} in directory (both kept)."""
  w = tf.Variable([1.0, 2.0, 3.0])
  step = tf.Variable(0, dtype=tf.int64)
  manager = mtf.CheckpointManager(directory, {"w": w}, max_to_keep=2,
                                  extra_variables={"global_step": step})
  for value in (1, 2):
    w.assign([float(value)] * 3)
    step.assign(value)
    manager.save()
  return manager.checkpoints


@pytest.fixture
def prune_on_read(monkeypatch):
  """Deletes the checkpoint about to be read (once per prefix given) and saves a newer
  one first, as a trainer keeping one checkpoint does between resolve and read."""
  real_open = save_restore._open_reader
  pruned = []

  def install(prefixes, before_delete=None):
    def open_reader(prefix):
      if prefix in prefixes and prefix not in pruned:
        pruned.append(prefix)
        if before_delete:
          before_delete()
        files.delete_checkpoint(prefix)
      return real_open(prefix)
    monkeypatch.setattr(save_restore, "_open_reader", open_reader)
    return pruned
  return install


def test_directory_read_falls_back_to_newer_checkpoint_when_resolved_one_is_pruned(
    tmp_path, prune_on_read, capsys):
  old, new = _two_checkpoints(str(tmp_path))
  pruned = prune_on_read([new])
  # Step 2 is resolved, then pruned before it is read; the newest complete one left is
  # step 1 (a trainer would have saved a newer one: see the next test).
  w = tf.Variable([0.0, 0.0, 0.0])
  result = mtf.restore_checkpoint(str(tmp_path), {"w": w})
  assert pruned == [new]
  assert result.path == old and result.global_step == 1
  assert w.numpy().tolist() == [1.0, 1.0, 1.0]
  out = capsys.readouterr().out
  assert "model.ckpt-2" in out and "model.ckpt-1" in out and "deleted" in out
  assert len(out.strip().splitlines()) == 1


def test_directory_read_takes_the_checkpoint_that_replaced_the_pruned_one(
    tmp_path, prune_on_read, capsys):
  old, new = _two_checkpoints(str(tmp_path))
  w = tf.Variable([0.0, 0.0, 0.0])
  step = tf.Variable(0, dtype=tf.int64)
  manager = mtf.CheckpointManager(str(tmp_path), {"w": w}, max_to_keep=1,
                                  extra_variables={"global_step": step})

  def trainer_saves_step_3():
    w.assign([3.0] * 3)
    step.assign(3)
    manager.save()
  prune_on_read([new], before_delete=trainer_saves_step_3)
  target = tf.Variable([0.0, 0.0, 0.0])
  result = mtf.restore_checkpoint(str(tmp_path), {"w": target})
  assert result.global_step == 3 and result.path.endswith("model.ckpt-3")
  assert target.numpy().tolist() == [3.0, 3.0, 3.0]
  assert "model.ckpt-3" in capsys.readouterr().out
  del old


def test_latest_from_checkpoint_iterator_falls_back_too(tmp_path, prune_on_read):
  old, new = _two_checkpoints(str(tmp_path))
  (path,) = utils.get_checkpoint_iterator(None, str(tmp_path))
  assert path == new
  prune_on_read([new])
  w = tf.Variable([0.0, 0.0, 0.0])
  assert mtf.restore_checkpoint(path, {"w": w}).path == old


def test_data_file_pruned_after_index_opened_falls_back(tmp_path, monkeypatch):
  old, new = _two_checkpoints(str(tmp_path))
  real_read = save_restore._read_value

  def read_value(reader, name, prefix):
    if prefix == new:
      files.delete_checkpoint(new)
    return real_read(reader, name, prefix)
  monkeypatch.setattr(save_restore, "_read_value", read_value)
  w = tf.Variable([0.0, 0.0, 0.0])
  result = mtf.restore_checkpoint(str(tmp_path), {"w": w})
  assert result.path == old and w.numpy().tolist() == [1.0, 1.0, 1.0]


def test_explicit_prefix_pruned_while_reading_is_a_one_line_error(tmp_path,
                                                                 prune_on_read):
  old, new = _two_checkpoints(str(tmp_path))
  prune_on_read([new])
  w = tf.Variable([5.0, 5.0, 5.0])
  with pytest.raises(mtf.CheckpointError) as info:
    mtf.restore_checkpoint(new, {"w": w})
  message = str(info.value)
  assert new + ".index" in message and "\n" not in message
  assert "model.ckpt-1" not in message
  assert info.value.file == new + ".index"
  assert w.numpy().tolist() == [5.0, 5.0, 5.0]  # nothing was loaded from another step
  del old


def test_fallback_gives_up_after_bounded_attempts(tmp_path, monkeypatch):
  _two_checkpoints(str(tmp_path))
  real_open = save_restore._open_reader

  def open_reader(prefix):  # everything is pruned as soon as it is resolved
    files.delete_checkpoint(prefix)
    return real_open(prefix)
  monkeypatch.setattr(save_restore, "_open_reader", open_reader)
  with pytest.raises(mtf.CheckpointError):
    mtf.restore_checkpoint(str(tmp_path), {"w": tf.Variable([0.0, 0.0, 0.0])})
