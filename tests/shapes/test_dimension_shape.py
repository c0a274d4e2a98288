"""Tests for mesh_tf.shapes Dimension and Shape."""

import pickle

import numpy as np
import pytest

from mesh_tf.errors import MtfError, ShapeError
from mesh_tf.shapes import (
    Dimension, Shape, anonymous_shape, combined_dimension, convert_to_dimension,
    convert_to_shape, is_subsequence, list_product, shape_union,
    transpose_list_of_lists)

A, B, C = Dimension("a", 2), Dimension("b", 3), Dimension("c", 4)


# Dimension.

def test_dimension_is_a_tuple():
  d = Dimension("a", 4)
  assert d == ("a", 4)
  assert d.name == "a" and d.size == 4
  assert str(d) == "a:4"
  assert repr(d) == "Dimension(name='a', size=4)"
  assert hash(d) == hash(("a", 4))


def test_dimension_accepts_numpy_ints():
  d = Dimension("a", np.int64(4))
  assert d.size == 4 and type(d.size) is int
  assert Dimension("a", 0).size == 0


@pytest.mark.parametrize("name", ["", None, 3, b"a"])
def test_dimension_bad_name(name):
  with pytest.raises(ShapeError, match="name must be a non-empty str"):
    Dimension(name, 3)


@pytest.mark.parametrize("size,text", [
    (-1, "-1"), (2.0, "2.0"), (True, "True"), ("3", "'3'"),
    (None, "None"), (np.float32(2), "2.0")])
def test_dimension_bad_size(size, text):
  with pytest.raises(ShapeError, match="'a'.*" + text.replace(".", r"\.")):
    Dimension("a", size)


def test_shape_errors_are_value_errors():
  with pytest.raises(ValueError):
    Dimension("a", -1)
  assert issubclass(ShapeError, MtfError)


def test_convert_to_dimension():
  assert convert_to_dimension(None) is None
  assert convert_to_dimension(A) is A
  assert convert_to_dimension(("a", 2)) == A
  assert isinstance(convert_to_dimension(["a", 2]), Dimension)
  with pytest.raises(ShapeError, match=r"'a:2'.*\(name, size\) pair"):
    convert_to_dimension("a:2")
  with pytest.raises(ShapeError, match=r"\('a', 2, 3\)"):
    convert_to_dimension(("a", 2, 3))


# Shape.

def test_shape_properties():
  s = Shape([A, ("b", 3), C])
  assert s.dims == [A, B, C]
  assert s.ndims == 3 and len(s) == 3
  assert s.size == 24
  assert s.to_integer_list == [2, 3, 4]
  assert s.dimension_names == ["a", "b", "c"]
  assert s.cumprod == [12, 4, 1]
  assert Shape([]).size == 1 and Shape([]).cumprod == []


def test_shape_dims_is_a_copy_and_shape_is_immutable():
  s = Shape([A, B])
  s.dims.append(C)
  assert s == [A, B]
  with pytest.raises(AttributeError):
    s.foo = 1


def test_shape_indexing_and_iteration():
  s = Shape([A, B, C])
  assert s[0] == A and s[-1] == C
  assert isinstance(s[1:], Shape) and s[1:] == [B, C]
  assert list(s) == [A, B, C]
  assert B in s


def test_shape_eq_hash():
  assert Shape([A, B]) == Shape([A, B])
  assert Shape([A, B]) == [A, B]
  assert Shape([A, B]) == [("a", 2), ("b", 3)]
  assert Shape([A, B]) != Shape([B, A])
  assert Shape([A, B]) != "a:2;b:3"
  assert len({Shape([A, B]), Shape([A, B]), Shape([A])}) == 2
  s = Shape([A, B])
  assert pickle.loads(pickle.dumps(s)) == s


def test_shape_from_shape():
  s = Shape([A])
  assert Shape(s) == s


def test_shape_duplicate_names():
  with pytest.raises(ShapeError,
                     match=r"'a' appears twice in shape \[a:2, b:3, a:5\]"):
    Shape([A, B, ("a", 5)])


def test_shape_rejects_strings_and_none():
  with pytest.raises(ShapeError, match="convert_to_shape"):
    Shape("a:2")
  with pytest.raises(ShapeError, match="None"):
    Shape([A, None])


def test_shape_add():
  assert Shape([A]) + Shape([B]) == [A, B]
  assert Shape([A]) + [B, ("c", 4)] == [A, B, C]
  assert [A] + Shape([B]) == [A, B]
  with pytest.raises(ShapeError, match="'a' appears twice"):
    Shape([A]) + [("a", 7)]


def test_shape_sub():
  s = Shape([A, B, C])
  assert s - Shape([B]) == [A, C]
  assert s - [A, C] == [B]
  assert s - ["a", "c"] == [B]
  assert s - B == [A, C]
  assert s - "b" == [A, C]
  assert s - None == s
  assert s - [Dimension("zz", 1), "yy"] == s
  # A Dimension is only removed when its size also matches.
  assert s - Dimension("a", 7) == s


def test_shape_str_and_to_string_round_trip():
  s = Shape([A, B])
  assert str(s) == "Shape[a=2, b=3]"
  assert s.to_string == "a:2;b:3"
  assert convert_to_shape(s.to_string) == s
  assert Shape([]).to_string == ""
  assert convert_to_shape(Shape([]).to_string) == Shape([])


def test_get_dim_by_name_and_index_of():
  s = Shape([A, B])
  assert s.get_dim_by_name("b") == B
  assert s.index_of("b") == 1
  assert s.has_dim("a") and not s.has_dim("z")
  with pytest.raises(ShapeError, match=r"'z'.*valid names: \['a', 'b'\]"):
    s.get_dim_by_name("z")
  with pytest.raises(ShapeError, match=r"'z'.*valid names: \['a', 'b'\]"):
    s.index_of("z")


def test_rename_and_resize():
  s = Shape([A, B])
  assert s.rename_dimension("a", "x") == [("x", 2), B]
  assert s.resize_dimension("b", 9) == [A, ("b", 9)]
  assert s == [A, B]
  with pytest.raises(ShapeError, match="'b' appears twice"):
    s.rename_dimension("a", "b")
  with pytest.raises(ShapeError, match=r"'q'.*valid names"):
    s.rename_dimension("q", "x")
  with pytest.raises(ShapeError, match=r"'q'.*valid names"):
    s.resize_dimension("q", 3)


def test_cumprod_to_tensor_axis():
  s = Shape([A, B, C])
  assert s.cumprod_to_tensor_axis(12) == 0
  assert s.cumprod_to_tensor_axis(4) == 1
  assert s.cumprod_to_tensor_axis(1) == 2
  assert s.cumprod_to_tensor_axis(5) is None


# convert_to_shape.

@pytest.mark.parametrize("text", [
    "x:4;y:8", "x:4,y:8", "x:4.y:8", "x:4 y:8", "x:4; y:8", " x:4 ;\ty:8;\n",
    "x:4, y:8", "x:4;;y:8"])
def test_convert_to_shape_separators(text):
  assert convert_to_shape(text) == [("x", 4), ("y", 8)]


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_convert_to_shape_empty(text):
  assert convert_to_shape(text) == Shape([])


def test_convert_to_shape_other_inputs():
  s = Shape([A])
  assert convert_to_shape(None) is None
  assert convert_to_shape(s) is s
  assert convert_to_shape([A, ("b", 3)]) == [A, B]
  assert convert_to_shape((A,)) == [A]
  with pytest.raises(ShapeError, match=r"cannot convert 5 \(int\) to a Shape"):
    convert_to_shape(5)


@pytest.mark.parametrize("piece,why", [
    ("b3", "missing ':'"), ("b:x", "not an integer"), (":3", "empty"),
    ("b:-3", "negative"), ("b:", "not an integer"), ("b:3:4", "not an integer"),
    ("b:1e3", "not an integer")])
def test_convert_to_shape_malformed(piece, why):
  text = "a:2;" + piece
  with pytest.raises(ShapeError) as e:
    convert_to_shape(text)
  msg = str(e.value)
  assert repr(text) in msg
  assert repr(piece) in msg
  assert why in msg


def test_convert_to_shape_duplicate():
  with pytest.raises(ShapeError, match="'a' appears twice"):
    convert_to_shape("a:2;a:3")


# Helpers.

def test_list_product():
  assert list_product([]) == 1
  assert list_product([2, 3, 4]) == 24
  assert list_product(iter([5])) == 5


def test_is_subsequence():
  assert is_subsequence([], [1, 2])
  assert is_subsequence([1, 3], [1, 2, 3])
  assert not is_subsequence([3, 1], [1, 2, 3])
  assert not is_subsequence([1, 1], [1, 2])
  assert is_subsequence("ac", "abc")


def test_transpose_list_of_lists():
  assert transpose_list_of_lists([[1, 2, 3], [4, 5, 6]]) == [
      [1, 4], [2, 5], [3, 6]]
  assert transpose_list_of_lists([]) == []
  with pytest.raises(ShapeError, match="different lengths"):
    transpose_list_of_lists([[1], [1, 2]])


def test_combined_dimension():
  assert combined_dimension([A, B]) == ("a_b", 6)
  assert combined_dimension([A, ("c", 4)], name="z") == ("z", 8)
  assert combined_dimension([], name="one") == ("one", 1)
  with pytest.raises(ShapeError, match="needs a name"):
    combined_dimension([])


def test_anonymous_shape():
  assert anonymous_shape(Shape([A, B])) == [
      ("_anonymous_0", 2), ("_anonymous_1", 3)]
  assert anonymous_shape("x:5") == [("_anonymous_0", 5)]


def test_shape_union():
  u = shape_union([Shape([A, B]), [C, A], "b:3;d:1"])
  assert u == [A, B, C, ("d", 1)]
  assert shape_union([]) == Shape([])


def test_shape_union_conflict():
  with pytest.raises(ShapeError, match=r"'b' has size 3 .* and 5 .*b:3 vs b:5"):
    shape_union([Shape([A, B]), Shape([("b", 5)])])
