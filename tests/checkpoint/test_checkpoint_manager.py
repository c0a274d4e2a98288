"""CheckpointManager keeps the last K, keeps the state file right, survives a crash."""
import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf

CPUS = ["/cpu:%d" % i for i in range(8)]


def _impl():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  mtf.get_variable(mesh, "dense/kernel", [mtf.Dimension("d_model", 8),
                                          mtf.Dimension("d_ff", 4)])
  impl = mtf.PlacementMeshImpl("rows:2;cols:4", "d_model:cols;d_ff:rows", CPUS)
  mtf.Lowering(graph, {mesh: impl})
  return impl


def _set(impl, value):
  impl.variable_store["dense/kernel"].assign_full(tf.fill([8, 4], float(value)))


def _get(impl):
  return impl.variable_store["dense/kernel"].read_full().numpy()


def _state_paths(directory):
  state = tf.train.get_checkpoint_state(directory)
  return list(state.all_model_checkpoint_paths), state.model_checkpoint_path


def test_keeps_last_k_and_state_file(tmp_path):
  impl = _impl()
  d = str(tmp_path)
  manager = mtf.CheckpointManager(d, impl, max_to_keep=2)
  assert manager.latest_checkpoint is None and manager.checkpoints == []
  for step in range(1, 5):
    _set(impl, step)
    assert manager.save(step) == os.path.join(d, "model.ckpt-%d" % step)
  kept = [os.path.join(d, "model.ckpt-%d" % s) for s in (3, 4)]
  assert manager.checkpoints == kept and manager.latest_checkpoint == kept[-1]
  assert _state_paths(d) == (kept, kept[-1])
  assert tf.train.latest_checkpoint(d) == kept[-1]
  assert sorted(os.listdir(d)) == ["checkpoint"] + sorted(
      "model.ckpt-%d.%s" % (s, ext) for s in (3, 4)
      for ext in ("index", "data-00000-of-00001"))
  # A new manager (a restarted job) picks them up and restores the latest.
  _set(impl, 0)
  again = mtf.CheckpointManager(d, impl, max_to_keep=2)
  assert again.checkpoints == kept
  assert again.restore_or_initialize() == 4
  np.testing.assert_array_equal(_get(impl), np.full([8, 4], 4.0))
  again.save(5)
  assert again.checkpoints == kept[1:] + [os.path.join(d, "model.ckpt-5")]
  assert not os.path.exists(kept[0] + ".index")


def test_restore_or_initialize_without_checkpoint_keeps_initial_values(tmp_path):
  impl = _impl()
  before = _get(impl)
  assert mtf.CheckpointManager(str(tmp_path), impl).restore_or_initialize() is None
  np.testing.assert_array_equal(_get(impl), before)


def test_step_from_global_step_variable_and_keep_all(tmp_path):
  impl = _impl()
  step = tf.Variable(0, dtype=tf.int64)
  manager = mtf.CheckpointManager(str(tmp_path), impl, max_to_keep=None,
                                  checkpoint_basename="ckpt",
                                  extra_variables={"global_step": step})
  for _ in range(7):
    step.assign_add(10)
    manager.save()
  assert [os.path.basename(p) for p in manager.checkpoints] == [
      "ckpt-%d" % s for s in range(10, 80, 10)]
  step.assign(0)
  assert manager.restore_or_initialize() == 70 and int(step.numpy()) == 70
  with pytest.raises(mtf.CheckpointError, match="max_to_keep"):
    mtf.CheckpointManager(str(tmp_path), impl, max_to_keep=0)


@pytest.mark.parametrize("fail_at", [1, 2, 3], ids=["data-rename", "index-rename",
                                                    "state-file"])
def test_crash_mid_save_keeps_previous_latest(tmp_path, monkeypatch, fail_at):
  impl = _impl()
  d = str(tmp_path)
  manager = mtf.CheckpointManager(d, impl, max_to_keep=1)
  _set(impl, 1)
  first = manager.save(1)
  _set(impl, 2)
  calls = []
  real_replace = os.replace

  def crashing_replace(src, dst):
    calls.append(dst)
    if len(calls) == fail_at:
      raise OSError("simulated crash while renaming to %s" % dst)
    real_replace(src, dst)
  monkeypatch.setattr(os, "replace", crashing_replace)
  # A failed state-file write is a CheckpointError naming the file.
  with pytest.raises((OSError, mtf.CheckpointError), match="simulated crash"):
    manager.save(2)
  monkeypatch.setattr(os, "replace", real_replace)
  second = os.path.join(d, "model.ckpt-2")
  # The state file still names the previous checkpoint, complete and loadable.
  assert tf.train.latest_checkpoint(d) == first
  assert manager.checkpoints == [first]
  # A new manager also finds checkpoint 2 when it was renamed completely.
  found = mtf.CheckpointManager(d, impl)
  expected = [first] if fail_at < 3 else [first, second]
  assert found.checkpoints == expected
  assert (found.note is None) == (fail_at < 3)
  _set(impl, 0)
  assert found.restore_or_initialize() == len(expected)
  np.testing.assert_array_equal(_get(impl), np.full([8, 4], float(len(expected))))
  # No temporary files stay, and no index under the new name unless it is complete.
  leftovers = sorted(f for f in os.listdir(d) if ".tmp-" in f)
  assert leftovers == []
  if fail_at < 3:
    assert not any(f.startswith("model.ckpt-2") for f in os.listdir(d))
  else:  # renamed completely; only the state file update was lost
    assert dict(tf.train.list_variables(second))["dense/kernel"] == [8, 4]
  # The next save works and prunes as usual.
  _set(impl, 3)
  manager.save(3)
  assert manager.checkpoints == [os.path.join(d, "model.ckpt-3")]
  assert not os.path.exists(first + ".index")
