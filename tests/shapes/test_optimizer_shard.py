"""Optimizer-shard dims: MeshLayout splits them over the data-parallel mesh axes."""
import pytest

from mesh_tf.errors import LayoutError
from mesh_tf.shapes import Dimension, Shape, optimizer_shard
from mesh_tf.shapes.mesh_layout import MeshLayout
from tf_free import run_without_tensorflow

D_IN = Dimension("d_in", 8)
HIDDEN = Dimension("hidden", 16)
ODD = Dimension("odd", 5)


def _layout(mesh_shape, rules, shape):
  return tuple(MeshLayout(mesh_shape, rules).tensor_layout(shape))


@pytest.mark.parametrize("mesh_shape,rules,variable,expected", [
    # 8-way data parallel: the first dim divisible by 8 takes the batch's mesh axis
    ("all:8", "batch:all", [D_IN, HIDDEN], (0, None)),
    ("all:8", "batch:all", [ODD, HIDDEN], (None, 0)),
    # nothing divisible: the slot stays whole
    ("all:8", "batch:all", [ODD], (None,)),
    # dp+mp: the model-parallel split is kept, the dp axis goes to another dim
    ("rows:2;cols:4", "batch:rows;hidden:cols", [D_IN, HIDDEN], (0, 1)),
    ("rows:2;cols:4", "batch:rows;hidden:cols", [HIDDEN, D_IN], (1, 0)),
    ("rows:2;cols:4", "batch:rows;hidden:cols", [HIDDEN], (1,)),
    # no data-parallel rule (or a size-1 one): laid out like the variable
    ("all:8", "hidden:all", [D_IN, HIDDEN], (None, 0)),
    ("rows:1;cols:8", "batch:rows;hidden:cols", [D_IN, HIDDEN], (None, 1)),
    # the variable already split over the batch's mesh axis: nothing more to split
    ("all:8", "batch:all;hidden:all", [D_IN, HIDDEN], (None, 0)),
])
def test_shard_dims_layout(mesh_shape, rules, variable, expected):
  shape = optimizer_shard.shard_shape(variable)
  assert shape.to_integer_list == Shape(variable).to_integer_list
  assert _layout(mesh_shape, rules, shape) == expected
  # each dim alone answers the same (a dim is laid out alike in every tensor)
  layout = MeshLayout(mesh_shape, rules)
  assert tuple(layout.tensor_dimension_to_mesh_axis(d) for d in shape.dims) == expected
  # and the variable itself keeps its own layout
  assert _layout(mesh_shape, rules, variable) == tuple(
      layout.tensor_dimension_to_mesh_axis(d) for d in variable)


def test_a_sub_shape_keeps_each_dims_axis():
  shape = optimizer_shard.shard_shape([D_IN, HIDDEN])
  assert _layout("rows:2;cols:4", "batch:rows;hidden:cols", [shape.dims[0]]) == (0,)
  assert _layout("rows:2;cols:4", "batch:rows;hidden:cols", [shape.dims[1]]) == (1,)


def test_parse_round_trip():
  shape = optimizer_shard.shard_shape([D_IN, HIDDEN])
  base, variable = optimizer_shard.parse(shape.dims[1].name)
  assert base == "hidden" and variable == Shape([D_IN, HIDDEN])
  assert optimizer_shard.is_shard_dim(shape.dims[0].name)
  assert not optimizer_shard.is_shard_dim("hidden")


def test_shard_dim_beside_a_batch_dim_names_both():
  shard = optimizer_shard.shard_shape([D_IN]).dims[0]
  with pytest.raises(LayoutError, match=r"dims .*d_in.* and batch are both split over "
                     r"mesh dim \"all\""):
    MeshLayout("all:8", "batch:all").tensor_layout(
        Shape([shard, Dimension("batch", 8)]), tensor_name="x")


def test_shard_shape_of_a_shard_shape_is_an_error():
  shape = optimizer_shard.shard_shape([D_IN])
  with pytest.raises(LayoutError, match="already has optimizer-shard dim"):
    optimizer_shard.shard_shape(shape)


def test_needs_no_tensorflow():
  out = run_without_tensorflow(
      "from mesh_tf.shapes import optimizer_shard\n"
      "from mesh_tf.shapes.mesh_layout import MeshLayout\n"
      "s = optimizer_shard.shard_shape('a:8;b:6')\n"
      "print(MeshLayout('r:2', 'batch:r').slice_shape(s))")
  assert out.strip() == "[4, 6]"
