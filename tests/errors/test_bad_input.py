"""Bad input raises an MtfError whose message names the tensor, dim, rule or device."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf

DEVICES = ["/cpu:%d" % i for i in range(8)]
BATCH = mtf.Dimension("batch", 8)
HIDDEN = mtf.Dimension("hidden", 12)


def _graph_with(shape):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, np.zeros(mtf.convert_to_shape(shape).to_integer_list,
                                          np.float32), shape, name="x")
  return graph, mesh, x


def test_two_dims_of_one_tensor_on_one_mesh_dim():
  graph, mesh, x = _graph_with([BATCH, HIDDEN])
  impl = mtf.PlacementMeshImpl("rows:2;cols:4", "batch:rows;hidden:rows", DEVICES)
  with pytest.raises(mtf.LayoutError, match=r"x.*batch.*hidden.*rows") as info:
    mtf.Lowering(graph, {mesh: impl})
  assert info.value.mesh_dim == "rows"


def test_dim_not_divisible_by_mesh_dim():
  graph, mesh, x = _graph_with([BATCH, HIDDEN])
  impl = mtf.PlacementMeshImpl("rows:2;cols:8", "hidden:cols", [""] * 16)
  with pytest.raises(mtf.LayoutError, match=r"hidden.*12.*cols.*8") as info:
    mtf.Lowering(graph, {mesh: impl})
  assert info.value.dim == "hidden"
  assert "hidden:cols" in str(info.value)


def test_einsum_output_dim_in_no_input():
  _, _, x = _graph_with([BATCH, HIDDEN])
  other = mtf.Dimension("classes", 3)
  with pytest.raises(mtf.ShapeError, match=r"classes.*no input"):
    mtf.einsum([x], output_shape=[BATCH, other])


def test_dim_name_reused_with_two_sizes():
  graph, mesh, x = _graph_with([BATCH, HIDDEN])
  y = mtf.import_tf_tensor(mesh, np.zeros([8, 5], np.float32),
                           [BATCH, mtf.Dimension("hidden", 5)], name="y")
  with pytest.raises(mtf.ShapeError, match=r"hidden.*12.*5|hidden.*5.*12"):
    x + y
  with pytest.raises(mtf.ShapeError, match=r"hidden"):
    mtf.einsum([x, y], output_shape=[BATCH])


def test_dtype_mismatch_in_binary_op():
  graph, mesh, x = _graph_with([BATCH])
  n = mtf.import_tf_tensor(mesh, np.zeros([8], np.int32), [BATCH], name="n")
  with pytest.raises(mtf.ShapeError, match=r"dtype.*x.*float32.*n.*int32"):
    mtf.add(x, n)


def test_mesh_size_differs_from_device_count():
  with pytest.raises(mtf.LayoutError, match=r"rows:2;cols:4.*8 processors.*3 devices"):
    mtf.PlacementMeshImpl("rows:2;cols:4", "", DEVICES[:3])


def test_unknown_device():
  with pytest.raises(mtf.LayoutError, match=r"/gpu:7.*does not exist"):
    mtf.PlacementMeshImpl("all:2", "", ["/cpu:0", "/gpu:7"])


def test_reshape_to_other_total_size():
  _, _, x = _graph_with([BATCH, HIDDEN])
  with pytest.raises(mtf.ShapeError, match=r"x.*96.*size 48|size 96.*48"):
    mtf.reshape(x, [BATCH, mtf.Dimension("hidden", 6)])


@pytest.mark.parametrize("text", ["batch:8;hidden", "batch:eight", ":4", "batch:-2"])
def test_malformed_shape_string(text):
  with pytest.raises(mtf.ShapeError, match=r"batch|:4"):
    mtf.convert_to_shape(text)


@pytest.mark.parametrize("text", ["batch;rows", "batch:rows:cols", ":rows"])
def test_malformed_layout_string(text):
  with pytest.raises(mtf.LayoutError):
    mtf.convert_to_layout_rules(text)


def test_unknown_reduced_dim_lists_valid_names():
  _, _, x = _graph_with([BATCH, HIDDEN])
  with pytest.raises(mtf.ShapeError, match=r"d_model.*batch.*hidden"):
    mtf.reduce_sum(x, reduced_dim=mtf.Dimension("d_model", 4))


def test_assign_shape_mismatch_names_variable():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", [BATCH, HIDDEN])
  with pytest.raises(mtf.ShapeError, match=r"variable 'w'.*shapes differ"):
    mtf.assign(w, mtf.zeros(mesh, [HIDDEN, BATCH]))


def test_duplicate_variable_name():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.get_variable(mesh, "w", [BATCH])
  with pytest.raises(mtf.ShapeError, match=r"variable 'w' already exists"):
    mtf.get_variable(mesh, "w", [HIDDEN])


def test_unfed_placeholder():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, tf.TensorSpec([8], tf.float32), [BATCH], name="images")
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", [""])})
  with pytest.raises(mtf.ShapeError, match=r"images.*not fed"):
    lowering.export_to_tf_tensor(x)


def test_mesh_without_impl():
  graph, mesh, x = _graph_with([BATCH])
  other = mtf.Mesh(graph, "other")
  with pytest.raises(mtf.LayoutError, match=r"Mesh\('m'\).*no MeshImpl"):
    mtf.Lowering(graph, {other: mtf.PlacementMeshImpl("", "", [""])})


def test_import_shape_mismatch():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  with pytest.raises(mtf.ShapeError, match=r"\(8, 3\).*batch"):
    mtf.import_tf_tensor(mesh, np.zeros([8, 3], np.float32), [BATCH, HIDDEN])
