"""Saved checkpoints are plain name-based TF bundles: mtf names, full shapes, state file."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf

CPUS = ["/cpu:%d" % i for i in range(8)]


def _build(mesh_shape="rows:2;cols:4", layout="a:rows;c:cols", devices=CPUS):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  a, b, c = mtf.Dimension("a", 4), mtf.Dimension("b", 3), mtf.Dimension("c", 8)
  with mtf.variable_scope("model"):
    mtf.get_variable(mesh, "w", [a, b, c])
    with mtf.variable_scope("layer_000"):
      mtf.get_variable(mesh, "scale", [c], master_dtype=tf.bfloat16,
                       slice_dtype=tf.float32, activation_dtype=tf.float32)
    mtf.get_variable(mesh, "bias", [b], initializer=tf.zeros_initializer())
  impl = mtf.PlacementMeshImpl(mesh_shape, layout, devices)
  return mtf.Lowering(graph, {mesh: impl}), impl


def test_list_variables_shows_mtf_names_and_full_shapes(tmp_path):
  lowering, _ = _build()
  step = tf.Variable(7, dtype=tf.int64)
  prefix = mtf.save_checkpoint(str(tmp_path / "model.ckpt"), lowering,
                               extra_variables={"global_step": step})
  assert prefix == str(tmp_path / "model.ckpt")
  assert dict(tf.train.list_variables(prefix)) == {
      "model/w": [4, 3, 8], "model/layer_000/scale": [8], "model/bias": [3],
      "global_step": []}
  reader = tf.train.load_checkpoint(prefix)
  dtypes = reader.get_variable_to_dtype_map()
  assert dtypes["model/layer_000/scale"] == tf.bfloat16  # master dtype, not slice dtype
  assert dtypes["model/w"] == tf.float32
  assert reader.get_tensor("global_step") == 7


def test_saved_values_are_the_full_variables(tmp_path):
  lowering, impl = _build()
  prefix = mtf.save_checkpoint(str(tmp_path), impl)
  reader = tf.train.load_checkpoint(prefix)
  for name, var in impl.variable_store.items():
    np.testing.assert_array_equal(reader.get_tensor(name), var.read_full().numpy())
  assert lowering.variables  # the Lowering made them


def test_directory_prefix_step_and_state_file(tmp_path):
  _, impl = _build()
  first = mtf.save_checkpoint(str(tmp_path) + "/", impl, global_step=3)
  second = mtf.save_checkpoint(str(tmp_path / "model.ckpt"), impl, global_step=5)
  assert first == str(tmp_path / "model.ckpt-3")
  assert second == str(tmp_path / "model.ckpt-5")
  assert tf.train.latest_checkpoint(str(tmp_path)) == second
  state = tf.train.get_checkpoint_state(str(tmp_path))
  assert list(state.all_model_checkpoint_paths) == [first, second]
  # The step is stored as the original trainer stores it.
  assert tf.train.load_checkpoint(second).get_tensor("global_step") == 5
  assert (tmp_path / "checkpoint").read_text().startswith(
      'model_checkpoint_path: "model.ckpt-5"')
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "checkpoint", "model.ckpt-3.data-00000-of-00001", "model.ckpt-3.index",
      "model.ckpt-5.data-00000-of-00001", "model.ckpt-5.index"]


def test_restore_from_directory_uses_latest(tmp_path):
  _, impl = _build()
  w = impl.variable_store["model/w"]
  saved = w.read_full().numpy()
  mtf.save_checkpoint(str(tmp_path), impl, global_step=1)
  w.assign_full(tf.zeros_like(saved))
  result = mtf.restore_checkpoint(str(tmp_path), impl)
  np.testing.assert_array_equal(w.read_full().numpy(), saved)
  assert result.path == str(tmp_path / "model.ckpt-1")
  assert result.global_step == 1
  assert result.names == sorted(impl.variable_store)
  assert result.missing == []


def test_restore_casts_bfloat16_master_to_float32_slices(tmp_path):
  _, impl = _build()
  scale = impl.variable_store["model/layer_000/scale"]
  scale.assign_full(tf.constant(np.linspace(-1, 1, 8), tf.float32) / 3)
  prefix = mtf.save_checkpoint(str(tmp_path), impl)
  stored = tf.train.load_checkpoint(prefix).get_tensor("model/layer_000/scale")
  scale.assign_full(tf.zeros([8]))
  mtf.restore_checkpoint(prefix, impl)
  for v in scale.slice_variables:
    assert v.dtype == tf.float32
  np.testing.assert_array_equal(
      tf.concat([v for v in scale.slice_variables[:4]], 0).numpy(),
      stored.astype(np.float32))


def test_save_inside_tf_function_is_refused(tmp_path):
  _, impl = _build("", "", [""])

  @tf.function(autograph=False)
  def save():
    mtf.save_checkpoint(str(tmp_path), impl)
  with pytest.raises(mtf.CheckpointError, match="outside tf.function"):
    save()
