"""Which dims an op declares splittable / unsplittable, as the original reports them.

The base Operation's helpers sort every dim name of an op's inputs and outputs into the
two sets; convolutions and pooling name their spatial dims unsplittable, a slicewise op
names everything but its declared splittable dims, and the backprop / generic-gradient
ops declare everything splittable.
"""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf


@pytest.fixture
def mesh():
  return mtf.Mesh(mtf.Graph(), "m")


def _dims(spec):
  return [mtf.Dimension(n, int(s)) for n, s in (p.split(":") for p in spec.split(","))]


def test_helpers_split_the_names_of_inputs_and_outputs(mesh):
  x = mtf.zeros(mesh, _dims("rows:4,cols:6"))
  y = mtf.zeros(mesh, _dims("cols:6,depth:2"))
  op = mtf.Operation([x, y], name="two_inputs")
  assert op._initialize_all_dimensions_as_splittable() == (
      frozenset(["rows", "cols", "depth"]), frozenset())
  assert op._initialize_splittable_and_unsplittable_dims("unsplittable") == (
      frozenset(), frozenset(["rows", "cols", "depth"]))
  assert op._initialize_splittable_and_unsplittable_dims(
      "splittable", ["cols"]) == (frozenset(["rows", "depth"]), frozenset(["cols"]))
  # An exception that no tensor has is still listed, on the other side.
  assert op._initialize_splittable_and_unsplittable_dims(
      "unsplittable", ["depth", "ghost"]) == (frozenset(["depth", "ghost"]),
                                              frozenset(["rows", "cols"]))
  with pytest.raises(ValueError, match="splittable"):
    op._initialize_splittable_and_unsplittable_dims("sometimes")


def test_a_plain_op_reports_every_dim_splittable_and_keeps_what_it_is_told(mesh):
  x = mtf.zeros(mesh, _dims("rows:4,cols:6"))
  op = mtf.Operation([x], name="plain")
  assert op.splittable_dims == frozenset(["rows", "cols"])
  assert op.unsplittable_dims == frozenset()
  # Subclasses written for the original assign the pair; the assignment is reported.
  op._splittable_dims, op._unsplittable_dims = (
      op._initialize_splittable_and_unsplittable_dims("splittable", ["cols"]))
  assert op.splittable_dims == frozenset(["rows"])
  assert op.unsplittable_dims == frozenset(["cols"])


def test_slicewise_declares_only_its_splittable_dims_and_generic_grad_all(mesh):
  x = mtf.zeros(mesh, _dims("rows:4,cols:6"))
  rows = x.shape.dims[0]
  op = mtf.SlicewiseOperation(tf.math.cumsum, [x], [x.shape], [x.dtype],
                              splittable_dims=[rows], name="cumsum_cols")
  assert op.splittable_dims == frozenset(["rows"])
  assert op.unsplittable_dims == frozenset(["cols"])
  grad = mtf.GenericGradOperation(op, [mtf.ones(mesh, x.shape)])
  assert grad.splittable_dims == frozenset(["rows", "cols"])
  assert grad.unsplittable_dims == frozenset()


def test_generic_grad_still_gathers_what_its_forward_op_needs_whole(mesh):
  # cumsum along "cols" is wrong on a split "cols"; the gradient must gather it too,
  # although it declares every dim splittable.
  graph = mesh.graph
  x = mtf.import_tf_tensor(mesh, tf.reshape(tf.range(24, dtype=tf.float32), [4, 6]),
                           _dims("rows:4,cols:6"))
  rows = x.shape.dims[0]
  y = mtf.slicewise(lambda t: tf.math.cumsum(t, axis=1), [x], splittable_dims=[rows],
                    grad_function=lambda op, dys: mtf.GenericGradOperation(op, dys).outputs)
  (dx,) = mtf.gradients([mtf.reduce_sum(y)], [x])
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mtf.convert_to_shape("a:2"), mtf.convert_to_layout_rules("cols:a"), ["", ""])
  lowering = mtf.Lowering(graph, {mesh: impl})
  got = np.array(lowering.export_to_tf_tensor(dx))
  assert got.tolist() == [[6.0, 5.0, 4.0, 3.0, 2.0, 1.0]] * 4


def test_reduce_declares_every_dim_splittable(mesh):
  x = mtf.zeros(mesh, _dims("rows:4,cols:6"))
  op = mtf.ReduceOperation(x, mtf.Shape(_dims("cols:6")), "SUM")
  assert op.splittable_dims == frozenset(["rows", "cols"])
  assert op.unsplittable_dims == frozenset()


def test_conv2d_names_spatial_and_filter_dims_unsplittable_its_backprops_none(mesh):
  x = mtf.zeros(mesh, _dims("batch:2,h:8,w:8,cin:3"))
  f = mtf.zeros(mesh, _dims("kh:3,kw:3,cin:3,cout:4"))
  conv = mtf.Conv2dOperation(x, f, [1, 1, 1, 1], "SAME")
  assert conv.splittable_dims == frozenset(["batch", "cin", "cout"])
  assert conv.unsplittable_dims == frozenset(["h", "w", "kh", "kw"])
  dy = mtf.zeros(mesh, conv.outputs[0].shape)
  every = frozenset(["batch", "h", "w", "cin", "cout", "kh", "kw"])
  dx = mtf.Conv2or3dBackpropInputOperation(2, False, x.shape, f, dy, [1, 1, 1, 1], "SAME")
  df = mtf.Conv2or3dBackpropFilterOperation(2, False, x, f.shape, dy, [1, 1, 1, 1],
                                            "SAME")
  for op in (dx, df):
    assert op.splittable_dims == every
    assert op.unsplittable_dims == frozenset()


def test_pool_names_its_spatial_dims_unsplittable_and_its_backprop_none(mesh):
  x = mtf.zeros(mesh, _dims("batch:2,h:8,w:8,c:3"))
  pool = mtf.PoolOperation(x, [2, 2], [2, 2], "AVG_2D")
  # Even though 2x2 windows tile 8x8 exactly, the op declares h and w unsplittable.
  assert pool.splittable_dims == frozenset(["batch", "c"])
  assert pool.unsplittable_dims == frozenset(["h", "w"])
  y = pool.outputs[0]
  back = mtf.PoolBackPropOperation(x, y, y, [2, 2], [2, 2], "AVG_2D")
  assert back.splittable_dims == frozenset(["batch", "h", "w", "c"])
  assert back.unsplittable_dims == frozenset()
