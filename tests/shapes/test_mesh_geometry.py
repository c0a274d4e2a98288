"""Tests for mesh_tf.shapes mesh geometry helpers."""

import pytest

from mesh_tf.errors import LayoutError, MtfError
from mesh_tf.shapes import (
    Dimension, Shape, pnum_to_group, pnum_to_processor_coordinates,
    processor_coordinates_to_pnum, processor_groups,
    tensor_dim_to_mesh_dim_size, tensor_dim_to_size_per_split)

MESH_FORMS = [
    [2, 4],
    Shape([("rows", 2), ("cols", 4)]),
    [Dimension("rows", 2), Dimension("cols", 4)],
    "rows:2;cols:4",
]


@pytest.mark.parametrize("mesh", MESH_FORMS)
def test_coordinates_round_trip(mesh):
  assert pnum_to_processor_coordinates(mesh, 0) == [0, 0]
  assert pnum_to_processor_coordinates(mesh, 5) == [1, 1]
  assert pnum_to_processor_coordinates(mesh, 7) == [1, 3]
  for pnum in range(8):
    coord = pnum_to_processor_coordinates(mesh, pnum)
    assert processor_coordinates_to_pnum(mesh, coord) == pnum


def test_coordinates_three_axes():
  mesh = [2, 3, 4]
  assert pnum_to_processor_coordinates(mesh, 23) == [1, 2, 3]
  assert processor_coordinates_to_pnum(mesh, [1, 0, 2]) == 14
  assert pnum_to_processor_coordinates([], 0) == []


def test_coordinate_errors():
  with pytest.raises(MtfError, match="processor number 8 is out of range"):
    pnum_to_processor_coordinates([2, 4], 8)
  with pytest.raises(MtfError, match=r"\[0, 4\] do not fit .*\[2, 4\]"):
    processor_coordinates_to_pnum([2, 4], [0, 4])
  with pytest.raises(MtfError, match=r"\[0\] do not fit"):
    processor_coordinates_to_pnum([2, 4], [0])
  with pytest.raises(MtfError, match="negative"):
    pnum_to_processor_coordinates([2, -4], 0)


@pytest.mark.parametrize("mesh", MESH_FORMS)
@pytest.mark.parametrize("group_dims,expected", [
    ([1], [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ([0], [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ([0, 1], [[0, 1, 2, 3, 4, 5, 6, 7]]),
    ([1, 0], [[0, 1, 2, 3, 4, 5, 6, 7]]),
    ([], [[0], [1], [2], [3], [4], [5], [6], [7]]),
])
def test_processor_groups_2x4(mesh, group_dims, expected):
  groups = processor_groups(mesh, group_dims)
  assert groups == expected
  for i, group in enumerate(groups):
    for pnum in group:
      assert pnum_to_group(mesh, group_dims, pnum) == i


def test_processor_groups_three_axes():
  mesh = [2, 2, 2]
  assert processor_groups(mesh, [1]) == [[0, 2], [1, 3], [4, 6], [5, 7]]
  assert processor_groups(mesh, [0, 2]) == [[0, 1, 4, 5], [2, 3, 6, 7]]
  assert pnum_to_group(mesh, [1], 5) == 3


def test_group_dims_errors():
  with pytest.raises(MtfError, match=r"group_dims \[2\]: 2 is not a mesh axis"):
    processor_groups([2, 4], [2])
  with pytest.raises(MtfError, match="is not a mesh axis"):
    pnum_to_group([2, 4], [-1], 0)
  with pytest.raises(MtfError, match="out of range"):
    pnum_to_group([2, 4], [0], 9)


MESH = "rows:2;cols:8"


def test_tensor_dim_to_mesh_dim_size():
  rules = "batch:rows;heads:cols"
  assert tensor_dim_to_mesh_dim_size(rules, MESH, ("batch", 4)) == 2
  assert tensor_dim_to_mesh_dim_size(rules, MESH, ("heads", 16)) == 8
  assert tensor_dim_to_mesh_dim_size(rules, MESH, ("d_model", 5)) == 1
  assert tensor_dim_to_mesh_dim_size(None, MESH, ("batch", 4)) == 1


def test_tensor_dim_to_size_per_split():
  rules = {"batch": "rows", "heads": "cols"}
  assert tensor_dim_to_size_per_split(rules, MESH, ("batch", 4)) == 2
  assert tensor_dim_to_size_per_split(rules, MESH, ("heads", 16)) == 2
  assert tensor_dim_to_size_per_split(rules, MESH, ("d_model", 5)) == 5
  with pytest.raises(LayoutError) as e:
    tensor_dim_to_size_per_split(rules, MESH, ("heads", 12))
  assert str(e.value).startswith(
      'dim heads=12 is split over mesh dim "cols" (size 8) by rule '
      '"heads:cols"; 8 does not divide 12')
  assert (e.value.dim, e.value.mesh_dim, e.value.rule) == (
      "heads", "cols", "heads:cols")
