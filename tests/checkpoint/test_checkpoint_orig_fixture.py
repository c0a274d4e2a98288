"""The original library's checkpoint (TF1 Saver, name-based, 2 shards) restores by name."""
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf

FIXTURE = (pathlib.Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures"
           / "orig_mtf_lm")
CKPT = str(FIXTURE / "model.ckpt-20")
CPUS = ["/cpu:%d" % i for i in range(8)]

pytestmark = pytest.mark.skipif(not (FIXTURE / "variables.txt").exists(),
                                reason="fixture %s is not present" % FIXTURE)


def _listed_variables():
  """(name, shape, dtype) of every line of variables.txt."""
  out = []
  for line in (FIXTURE / "variables.txt").read_text().splitlines():
    name, shape, dtype = line.split("\t")
    out.append((name, [int(s) for s in shape.strip("[]").split(",") if s.strip()],
                tf.as_dtype(dtype)))
  return out


def _dim_name(var_name, size):
  if size == 64:
    return "heads" if "SelfAttention" in var_name else "d_ff"
  return {32: "d_model", 128: "vocab", 16: "length"}[size]


def _build(mesh_shape, layout, devices):
  """mtf variables named, shaped and typed as in the checkpoint (global_step aside)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  for name, shape, dtype in _listed_variables():
    if name == "global_step":
      continue
    dims = [mtf.Dimension(_dim_name(name, s), s) for s in shape]
    if dtype == tf.bfloat16:  # the trainer's defaults: bfloat16 master, float32 slices
      mtf.get_variable(mesh, name, dims, master_dtype=tf.bfloat16, slice_dtype=tf.float32,
                       activation_dtype=tf.float32)
    else:
      mtf.get_variable(mesh, name, dims, dtype=dtype)
  impl = mtf.PlacementMeshImpl(mesh_shape, layout, devices)
  return mtf.Lowering(graph, {mesh: impl}), impl


@pytest.mark.parametrize("mesh_shape,layout,devices", [
    ("", "", [""]),
    ("rows:2;cols:4", "d_model:rows;heads:cols;d_ff:cols;vocab:cols", CPUS),
], ids=["mesh=[]", "mesh=2x4"])
def test_original_checkpoint_loads_by_name(mesh_shape, layout, devices):
  lowering, impl = _build(mesh_shape, layout, devices)
  step = tf.Variable(0, dtype=tf.int64)
  result = mtf.restore_checkpoint(str(FIXTURE), lowering,
                                  extra_variables={"global_step": step})
  assert result.path == CKPT
  assert int(step.numpy()) == 20 and result.global_step == 20
  names = [n for n, _, _ in _listed_variables()]
  assert sorted(result.names) == sorted(names)
  reader = tf.train.load_checkpoint(CKPT)
  for name, var in impl.variable_store.items():
    expected = reader.get_tensor(name).astype(np.float32)
    shape = var.shape
    sizes = impl.slice_shape(shape)
    for pnum, slice_var in enumerate(var.slice_variables):
      assert slice_var.dtype == tf.float32
      begin = impl.slice_begin(shape, pnum)
      index = tuple(slice(b, b + s) for b, s in zip(begin, sizes))
      np.testing.assert_array_equal(slice_var.numpy(), expected[index], err_msg=name)
  assert impl.slice_shape(impl.variable_store["transformer/embedding"].shape) == (
      [128, 32] if not mesh_shape else [32, 16])


def test_resaved_original_checkpoint_keeps_names_dtypes_and_values(tmp_path):
  lowering, _ = _build("rows:2;cols:4", "d_model:rows;heads:cols;d_ff:cols", CPUS)
  step = tf.Variable(0, dtype=tf.int64)
  mtf.restore_checkpoint(CKPT, lowering, extra_variables={"global_step": step})
  prefix = mtf.save_checkpoint(str(tmp_path), lowering,
                               extra_variables={"global_step": step})
  original = tf.train.load_checkpoint(CKPT)
  resaved = tf.train.load_checkpoint(prefix)
  assert resaved.get_variable_to_dtype_map() == original.get_variable_to_dtype_map()
  assert resaved.get_variable_to_shape_map() == original.get_variable_to_shape_map()
  for name in original.get_variable_to_shape_map():
    np.testing.assert_array_equal(resaved.get_tensor(name), original.get_tensor(name),
                                  err_msg=name)
