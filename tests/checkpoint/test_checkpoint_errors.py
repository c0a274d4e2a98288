"""Bad checkpoints and mismatched variables raise CheckpointErrors saying what and where."""
import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf


def _impl(shapes, mesh_shape="", layout="", devices=("",)):
  """A MeshImpl holding variables {name: [(dim, size), ...]} (float32, zeros if 'z')."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  for name, dims in shapes.items():
    mtf.get_variable(mesh, name, [mtf.Dimension(d, s) for d, s in dims])
  impl = mtf.PlacementMeshImpl(mesh_shape, layout, list(devices))
  mtf.Lowering(graph, {mesh: impl})
  return impl


@pytest.fixture
def saved(tmp_path):
  impl = _impl({"model/w": [("a", 4), ("b", 3)], "model/v": [("b", 3)]})
  prefix = mtf.save_checkpoint(str(tmp_path / "model.ckpt"), impl, global_step=1)
  return prefix, {n: v.read_full().numpy() for n, v in impl.variable_store.items()}


def test_shape_mismatch_names_variable_both_shapes_and_file(saved):
  prefix, _ = saved
  impl = _impl({"model/w": [("a", 4), ("b", 6)], "model/v": [("b", 3)]})
  with pytest.raises(mtf.CheckpointError) as info:
    mtf.restore_checkpoint(prefix, impl)
  message = str(info.value)
  assert "'model/w'" in message
  assert "[4, 3]" in message and "[4, 6]" in message
  assert prefix + ".index" in message
  assert info.value.tensor == "model/w" and info.value.file == prefix + ".index"


def test_failed_restore_assigns_nothing(saved):
  prefix, _ = saved
  impl = _impl({"model/w": [("a", 4), ("b", 6)], "model/v": [("b", 3)]})
  before = impl.variable_store["model/v"].read_full().numpy()
  with pytest.raises(mtf.CheckpointError):
    mtf.restore_checkpoint(prefix, impl)
  np.testing.assert_array_equal(impl.variable_store["model/v"].read_full().numpy(), before)


def test_missing_variable_is_an_error_unless_allowed(saved):
  prefix, values = saved
  impl = _impl({"model/w": [("a", 4), ("b", 3)], "model/u": [("b", 3)]})
  with pytest.raises(mtf.CheckpointError) as info:
    mtf.restore_checkpoint(prefix, impl)
  message = str(info.value)
  assert "'model/u'" in message and prefix in message
  assert "'model/v'" in message  # the closest available key
  assert "allow_missing" in message
  u_before = impl.variable_store["model/u"].read_full().numpy()
  result = mtf.restore_checkpoint(prefix, impl, allow_missing=True)
  assert result.missing == ["model/u"] and result.names == ["model/w"]
  np.testing.assert_array_equal(impl.variable_store["model/w"].read_full().numpy(),
                                values["model/w"])
  np.testing.assert_array_equal(impl.variable_store["model/u"].read_full().numpy(),
                                u_before)


def test_missing_extra_variable_and_dtype_kind_mismatch(saved):
  prefix, _ = saved
  impl = _impl({"model/w": [("a", 4), ("b", 3)]})
  with pytest.raises(mtf.CheckpointError, match="'opt/step'"):
    mtf.restore_checkpoint(prefix, impl, extra_variables={"opt/step": tf.Variable(0)})
  with pytest.raises(mtf.CheckpointError, match=r"'model/v' is float32 .* but int32"):
    mtf.restore_checkpoint(prefix, {}, extra_variables={"model/v": tf.Variable([0, 0, 0])})
  step = tf.Variable(0, dtype=tf.int32)  # int64 stored: ints cast to ints
  mtf.restore_checkpoint(prefix, {}, extra_variables={"global_step": step})
  assert int(step.numpy()) == 1


def test_no_checkpoint_names_the_file(tmp_path):
  impl = _impl({"w": [("a", 2)]})
  missing = str(tmp_path / "model.ckpt-9")
  with pytest.raises(mtf.CheckpointError) as info:
    mtf.restore_checkpoint(missing, impl)
  assert info.value.file == missing + ".index" and missing + ".index" in str(info.value)
  with pytest.raises(mtf.CheckpointError) as info:
    mtf.restore_checkpoint(str(tmp_path), impl)
  assert info.value.file == str(tmp_path / "checkpoint")
  assert "no checkpoint in directory" in str(info.value)
  (tmp_path / "checkpoint").write_text("not a text proto {{")
  with pytest.raises(mtf.CheckpointError, match="state file .*checkpoint is garbled "
                     r"\(line 1: 'not a text proto"):
    mtf.restore_checkpoint(str(tmp_path), impl)


def _damage(path, how):
  data = open(path, "rb").read()
  if how == "truncate":
    data = data[:len(data) // 2]
  else:  # flip bytes in the middle
    middle = len(data) // 2
    data = data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 8]) + data[
        middle + 8:]
  with open(path, "wb") as f:
    f.write(data)


@pytest.mark.parametrize("how", ["truncate", "flip"])
@pytest.mark.parametrize("which", ["index", "data"])
def test_corrupt_file_is_named(saved, which, how):
  prefix, _ = saved
  path = prefix + (".index" if which == "index" else ".data-00000-of-00001")
  _damage(path, how)
  impl = _impl({"model/w": [("a", 4), ("b", 3)], "model/v": [("b", 3)]})
  with pytest.raises(mtf.CheckpointError) as info:
    mtf.restore_checkpoint(prefix, impl)
  assert info.value.file == path
  assert path in str(info.value)


def test_deleted_data_file_is_named(saved):
  prefix, _ = saved
  os.remove(prefix + ".data-00000-of-00001")
  impl = _impl({"model/w": [("a", 4), ("b", 3)], "model/v": [("b", 3)]})
  with pytest.raises(mtf.CheckpointError) as info:
    mtf.restore_checkpoint(prefix, impl)
  assert prefix + ".data-" in str(info.value)


def test_duplicate_names_and_bad_source_are_refused(tmp_path):
  impl = _impl({"w": [("a", 2)]})
  with pytest.raises(mtf.CheckpointError, match="'w'"):
    mtf.save_checkpoint(str(tmp_path), impl, extra_variables={"w": tf.Variable([1., 2.])})
  with pytest.raises(mtf.CheckpointError, match="cannot take checkpoint variables"):
    mtf.save_checkpoint(str(tmp_path), 3)
