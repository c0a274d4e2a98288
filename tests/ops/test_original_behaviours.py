"""Behaviours of the original library that the port reproduces, each checked against
numpy / plain TF: convert_to_dimension's inputs, reduction names in any case, layouts on
an empty mesh, NumpyConverter's (lowering, tensor) pair, gather with an int index,
stack with a negative axis, dense onto a dim named like a reduced one, and
import_laid_out_tensor from a bare list of slices."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.test_utils import NumpyConverter

A = mtf.Dimension("a", 2)
B = mtf.Dimension("b", 3)


def _placement(shape="", layout=""):
  n = mtf.convert_to_shape(shape).size if shape else 1
  return mtf.placement_mesh_impl.PlacementMeshImpl(shape=shape, layout=layout,
                                                   devices=[""] * n)


def _lower(graph, mesh, impl, *tensors):
  lowering = mtf.Lowering(graph, {mesh: impl})
  return [lowering.export_to_tf_tensor(t).numpy() for t in tensors]


# ---- 1. convert_to_dimension ----

def test_convert_to_dimension_generic_inputs():
  assert mtf.convert_to_dimension(None) is None
  d = mtf.Dimension("x", 5)
  assert mtf.convert_to_dimension(d) is d
  for pair in (("x", 5), ["x", 5], iter(["x", 5])):
    got = mtf.convert_to_dimension(pair)
    assert isinstance(got, mtf.Dimension) and (got.name, got.size) == ("x", 5)
  # The original unpacked `name, size = d`: an int is a TypeError ...
  with pytest.raises(TypeError, match="cannot convert 5 .*Dimension"):
    mtf.convert_to_dimension(5)
  # ... and still a ValueError, as every port error is.
  with pytest.raises(ValueError):
    mtf.convert_to_dimension(5)
  # Strings are not parsed here (ValueError, as in the original).
  with pytest.raises(ValueError, match="convert_to_shape"):
    mtf.convert_to_dimension("x:5")
  with pytest.raises(ValueError, match="2 items, got 3"):
    mtf.convert_to_dimension(("x", 5, 1))
  with pytest.raises(ValueError):
    mtf.convert_to_dimension(("x", "5"))


# ---- 2. reduction names in any case ----

def test_reduction_fns_take_lower_case_names():
  a, b = tf.constant([1.0, 5.0]), tf.constant([3.0, 2.0])
  for name, np_fn in (("sum", np.add), ("max", np.maximum), ("min", np.minimum)):
    for spelled in (name, name.upper(), name.capitalize()):
      np.testing.assert_array_equal(mtf.binary_reduction_fn(spelled)(a, b).numpy(),
                                    np_fn(a.numpy(), b.numpy()))
  # reduction_fn is the original's tf.reduce_* (one tensor, reduced over axes).
  assert mtf.reduction_fn("sum") is tf.reduce_sum
  assert mtf.reduction_fn("MAX") is tf.reduce_max
  assert mtf.reduction_fn("min") is tf.reduce_min
  with pytest.raises(ValueError, match="unknown reduction 'prod'"):
    mtf.binary_reduction_fn("prod")


def test_reduce_operation_and_allreduce_take_lower_case_names():
  x_np = np.array([[1.0, -4.0, 2.0], [3.0, 0.5, -1.0]], np.float32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, x_np, [A, B])
  outs = [mtf.ReduceOperation(x, mtf.Shape([A]), name).outputs[0]
          for name in ("sum", "max", "min", "mean")]
  impl = _placement("p:3", "b:p")  # b split: every reduction needs an allreduce
  got = _lower(graph, mesh, impl, *outs)
  for g, want in zip(got, (x_np.sum(1), x_np.max(1), x_np.min(1), x_np.mean(1))):
    np.testing.assert_allclose(g, want, rtol=1e-6)
  # The backend's allreduce itself, called directly with a lower-case name.
  slices = [tf.constant([1.0, 7.0]), tf.constant([4.0, 2.0]), tf.constant([0.0, 9.0])]
  laid = impl.LaidOutTensor(slices)
  for name, want in (("sum", [5.0, 18.0]), ("max", [4.0, 9.0]), ("min", [0.0, 2.0])):
    reduced = impl.allreduce(laid, [0], name)
    for s in reduced.tensor_list:
      np.testing.assert_array_equal(s.numpy(), want)


def test_simd_allreduce_takes_lower_case_names():
  impl = mtf.simd_mesh_impl.SimdMeshImpl(shape="p:2", layout="")
  stacked = tf.constant([[1.0, 8.0], [3.0, 2.0]])  # core 0's slice, core 1's slice
  laid = impl.LaidOutTensor([stacked])
  got = impl.allreduce(laid, [0], "max")
  np.testing.assert_array_equal(got.tensor_list[0].numpy(), [[3.0, 8.0], [3.0, 8.0]])


# ---- 3. layouts on a mesh with no dimensions ----

def test_tensor_layout_on_an_empty_mesh():
  layout = mtf.TensorLayout([None, None])
  assert layout.mesh_axis_to_tensor_axis(0) == ()
  assert layout.is_fully_replicated and len(layout) == 2
  assert mtf.TensorLayout([]).mesh_axis_to_tensor_axis(0) == ()
  assert mtf.TensorLayout([]).is_fully_replicated
  # The original's own example: axes past mesh_ndims are not looked at.
  assert mtf.TensorLayout([0, 2, 1]).mesh_axis_to_tensor_axis(2) == (0, 2)
  rules = mtf.LayoutRules([("a", "rows")])
  assert rules.tensor_layout(mtf.Shape([A, B]), mtf.Shape([])) == mtf.TensorLayout(
      [None, None])


@pytest.mark.parametrize("kind", ["placement", "simd"])
def test_mesh_impl_tensor_layout_with_no_mesh_dims(kind):
  if kind == "placement":
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(shape=[], layout={}, devices=[""])
  else:
    impl = mtf.simd_mesh_impl.SimdMeshImpl(shape=[], layout={})
  assert impl.ndims == 0 and impl.size == 1
  layout = impl.tensor_layout(mtf.Shape([A, B]))
  assert layout == mtf.TensorLayout([None, None])
  assert layout.mesh_axis_to_tensor_axis(impl.ndims) == ()
  assert impl.tensor_layout(mtf.Shape([])) == mtf.TensorLayout([])
  assert impl.slice_shape(mtf.Shape([A, B])) == [2, 3]
  # and a computation on it gives plain TF's numbers
  x_np = np.arange(6, dtype=np.float32).reshape(2, 3)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, x_np, [A, B])
  (got,) = _lower(graph, mesh, impl, mtf.reduce_sum(x * 2.0, reduced_dim=A))
  np.testing.assert_allclose(got, (x_np * 2.0).sum(0))


# ---- 4. NumpyConverter ----

def test_numpy_converter_returns_lowering_and_full_tensor():
  converter = NumpyConverter()
  x_np = np.arange(6, dtype=np.int32).reshape(2, 3)
  x = converter.convert_np_array_to_mtf_tensor(x_np, dim_names=["a", "b"])
  assert x.shape == mtf.Shape([A, B])
  lowering, x_tf = converter.convert_mtf_tensor_to_tf_tensor(x)
  assert isinstance(lowering, mtf.Lowering)
  assert tuple(x_tf.shape) == (2, 3)
  np.testing.assert_array_equal(x_tf.numpy(), x_np)
  np.testing.assert_array_equal(converter.convert_mtf_tensor_to_np_array(x), x_np)
  assert converter.mesh.name == "mtf_mesh"
  # empty dim_names: default names, as with None
  y = converter.convert_np_array_to_mtf_tensor(x_np, dim_names=[])
  assert y.shape.dimension_names == ["dim0", "dim1"]


# ---- 5. gather with a Python int ----

def test_gather_with_an_int_index_removes_the_dim():
  w_np = np.arange(6, dtype=np.float32).reshape(2, 3)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.import_tf_tensor(mesh, w_np, [A, B])
  row = mtf.gather(w, 1, A)
  col = mtf.gather(w, 2, B)
  assert row.shape == mtf.Shape([B]) and col.shape == mtf.Shape([A])
  bools = mtf.gather(mtf.greater(w, 2.0), 0, A)
  for impl in (_placement(), _placement("p:2", "a:p"), _placement("p:3", "b:p")):
    got_row, got_col, got_bool = _lower(graph, mesh, impl, row, col, bools)
    np.testing.assert_array_equal(got_row, tf.gather(w_np, 1, axis=0).numpy())
    np.testing.assert_array_equal(got_col, tf.gather(w_np, 2, axis=1).numpy())
    np.testing.assert_array_equal(got_bool, w_np[0] > 2.0)


# ---- 6. stack with a negative axis ----

def test_stack_with_negative_axis_counts_from_the_end():
  x_np = np.arange(6, dtype=np.float32).reshape(2, 3)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, x_np, [A, B])
  last = mtf.stack([x, x * 2.0], "n", axis=-1)
  middle = mtf.stack([x, x * 2.0], "n", axis=-2)
  first = mtf.stack([x, x * 2.0], "n", axis=-3)
  assert last.shape.dimension_names == ["a", "b", "n"]
  assert middle.shape.dimension_names == ["a", "n", "b"]
  assert first.shape.dimension_names == ["n", "a", "b"]
  xs = [x_np, x_np * 2.0]
  for impl in (_placement(), _placement("p:2", "a:p")):
    got = _lower(graph, mesh, impl, last, middle, first)
    for g, axis in zip(got, (-1, -2, -3)):
      np.testing.assert_array_equal(g, tf.stack(xs, axis=axis).numpy())
  with pytest.raises(ValueError, match="axis -4 is out of range"):
    mtf.stack([x, x], "n", axis=-4)


# ---- 7. dense onto a dim named like the reduced one ----

def test_dense_to_a_new_dim_named_like_the_reduced_dim():
  batch = mtf.Dimension("batch", 4)
  channels_in, channels_out = mtf.Dimension("channels", 3), mtf.Dimension("channels", 8)
  rng = np.random.RandomState(0)
  x_np = rng.randn(4, 3).astype(np.float32)
  k_np = rng.randn(3, 8).astype(np.float32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, x_np, [batch, channels_in])
  y = mtf.layers.dense(x, channels_out, reduced_dims=[channels_in], use_bias=False,
                       kernel_initializer=tf.constant_initializer(k_np), name="proj")
  assert y.shape == mtf.Shape([batch, channels_out])
  (var,) = graph.trainable_variables
  assert var.shape.to_integer_list == [3, 8]
  loss = mtf.reduce_sum(mtf.square(y))
  dx, dk = mtf.gradients([loss], [x, var.outputs[0]])
  got_y, got_dx, got_dk = _lower(graph, mesh, _placement("p:2", "batch:p"), y, dx, dk)
  x_tf, k_tf = tf.constant(x_np), tf.Variable(k_np)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(x_tf)
    want_y = tf.matmul(x_tf, k_tf)
    want_loss = tf.reduce_sum(tf.square(want_y))
  np.testing.assert_allclose(got_y, want_y.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_dx, tape.gradient(want_loss, x_tf).numpy(), rtol=1e-5,
                             atol=1e-4)
  np.testing.assert_allclose(got_dk, tape.gradient(want_loss, k_tf).numpy(), rtol=1e-5,
                             atol=1e-4)


def test_dense_to_the_same_dim_it_reduces():
  """The original's case: new dim == reduced dim (channels:3 -> channels:3)."""
  channels = mtf.Dimension("channels", 3)
  rng = np.random.RandomState(1)
  x_np = rng.randn(2, 3).astype(np.float32)
  k_np = rng.randn(3, 3).astype(np.float32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, x_np, [A, channels])
  y = mtf.layers.dense(x, [channels], reduced_dims=[channels],
                       kernel_initializer=tf.constant_initializer(k_np))
  assert y.shape == mtf.Shape([A, channels])
  (got,) = _lower(graph, mesh, _placement(), y)
  np.testing.assert_allclose(got, x_np @ k_np, rtol=1e-5, atol=1e-5)


# ---- 8. import_laid_out_tensor from slices ----

class _SlicesOnly:
  """A laid-out value as the original's tests build one: just a tensor_list."""

  def __init__(self, tensor_list):
    self.tensor_list = tensor_list


def test_import_laid_out_tensor_from_all_slices():
  full = np.arange(12, dtype=np.float32).reshape(4, 3)
  shape = [mtf.Dimension("a", 4), B]
  impl = _placement("p:2", "a:p")
  slices = [tf.constant(full[:2]), tf.constant(full[2:])]
  for laid in (impl.LaidOutTensor(slices), _SlicesOnly(slices)):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.import_laid_out_tensor(mesh, laid, shape)
    assert x.dtype == tf.float32
    (got,) = _lower(graph, mesh, impl, x * 2.0 + 1.0)
    np.testing.assert_array_equal(got, full * 2.0 + 1.0)
  # A backend value's own all_slices go back in as they came out.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  y = mtf.import_tf_tensor(mesh, full, shape)
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.export_to_tf_tensor(y)
  all_slices = lowering.tensors[y].to_laid_out_tensor().all_slices
  graph2 = mtf.Graph()
  mesh2 = mtf.Mesh(graph2, "m")
  z = mtf.import_laid_out_tensor(mesh2, _SlicesOnly(all_slices), shape)
  (got,) = _lower(graph2, mesh2, impl, mtf.reduce_sum(z, reduced_dim=B))
  np.testing.assert_array_equal(got, full.sum(1))
  with pytest.raises(ValueError, match="no tensor_list"):
    mtf.import_laid_out_tensor(mesh2, object(), shape)


def test_import_laid_out_tensor_operation_splittability():
  """As the original's test: the value's slices may even be mtf Tensors (only the dtype
  is read before lowering), and no dim of the import may be re-split."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, [A, B])
  op = mtf.ImportLaidOutTensorOperation(mesh, _SlicesOnly([x]), mtf.Shape([A, B]))
  assert op.outputs[0].dtype == tf.float32
  assert op.splittable_dims == frozenset()
  assert op.unsplittable_dims == frozenset(["a", "b"])
