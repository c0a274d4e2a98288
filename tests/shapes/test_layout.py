"""Tests for mesh_tf.shapes LayoutRules and TensorLayout."""

import pickle

import pytest

from mesh_tf.errors import LayoutError
from mesh_tf.shapes import (
    LayoutRules, Shape, TensorLayout, convert_to_layout_rules, convert_to_shape)

MESH = convert_to_shape("rows:2;cols:8")


# LayoutRules basics.

def test_layout_rules_basics():
  r = LayoutRules([("batch", "rows"), ("d_ff", "cols")])
  assert list(r) == [("batch", "rows"), ("d_ff", "cols")]
  assert len(r) == 2
  assert str(r) == "batch:rows;d_ff:cols"
  assert convert_to_layout_rules(str(r)) == r
  assert hash(r) == hash(LayoutRules([["batch", "rows"], ["d_ff", "cols"]]))
  assert r != LayoutRules([("d_ff", "cols"), ("batch", "rows")])
  assert pickle.loads(pickle.dumps(r)) == r
  with pytest.raises(AttributeError):
    r.x = 1


def test_layout_rules_bad_pairs():
  with pytest.raises(LayoutError, match="convert_to_layout_rules"):
    LayoutRules("batch:rows")
  with pytest.raises(LayoutError, match=r"bad layout rule \('batch', ''\)"):
    LayoutRules([("batch", "")])
  with pytest.raises(LayoutError, match=r"bad layout rule \('a', 'b', 'c'\)"):
    LayoutRules([("a", "b", "c")])


@pytest.mark.parametrize("text", [
    "batch:rows;d_ff:cols", "batch:rows,d_ff:cols", "batch:rows.d_ff:cols",
    "batch:rows d_ff:cols", "batch:rows; d_ff:cols",
    "  batch:rows ;d_ff:cols;"])
def test_convert_to_layout_rules_separators(text):
  assert list(convert_to_layout_rules(text)) == [
      ("batch", "rows"), ("d_ff", "cols")]


def test_convert_to_layout_rules_other_inputs():
  r = LayoutRules([("a", "rows")])
  assert convert_to_layout_rules(r) is r
  assert convert_to_layout_rules(None) == LayoutRules()
  assert convert_to_layout_rules("") == LayoutRules()
  assert convert_to_layout_rules("  ") == LayoutRules()
  assert convert_to_layout_rules([("a", "rows")]) == r
  assert convert_to_layout_rules((("a", "rows"),)) == r
  assert list(convert_to_layout_rules({"a": "rows", "b": "cols"})) == [
      ("a", "rows"), ("b", "cols")]
  with pytest.raises(LayoutError, match=r"cannot convert 3 \(int\)"):
    convert_to_layout_rules(3)


@pytest.mark.parametrize("piece", ["batchrows", ":rows", "batch:", "a:b:c"])
def test_convert_to_layout_rules_malformed(piece):
  text = "x:cols;" + piece
  with pytest.raises(LayoutError) as e:
    convert_to_layout_rules(text)
  assert repr(text) in str(e.value)
  assert repr(piece) in str(e.value)
  assert e.value.rule == piece


def test_mesh_dimension_name_to_tensor_dimension_names():
  r = convert_to_layout_rules("batch:rows;d_ff:cols;heads:cols")
  assert r.mesh_dimension_name_to_tensor_dimension_names("cols") == [
      "d_ff", "heads"]
  assert r.mesh_dimension_name_to_tensor_dimension_names("rows") == ["batch"]
  assert r.mesh_dimension_name_to_tensor_dimension_names("zz") == []


# tensor_dimension_to_mesh_axis.

def test_tensor_dimension_to_mesh_axis():
  r = convert_to_layout_rules("batch:rows;d_ff:cols")
  assert r.tensor_dimension_to_mesh_axis(("batch", 4), MESH) == 0
  assert r.tensor_dimension_to_mesh_axis(("d_ff", 16), "rows:2;cols:8") == 1
  assert r.tensor_dimension_to_mesh_axis("d_ff", MESH) == 1
  assert r.tensor_dimension_to_mesh_axis(("other", 3), MESH) is None


def test_rule_for_missing_mesh_dim_is_ignored():
  # Only rules whose mesh dim exists in the mesh count.
  r = convert_to_layout_rules("heads:cores;heads:cols")
  assert r.tensor_dimension_to_mesh_axis(("heads", 8), MESH) == 1
  assert r.tensor_dimension_to_mesh_axis(("heads", 8), "cores:4") == 0


def test_tensor_dimension_on_two_mesh_dims():
  r = convert_to_layout_rules("heads:rows;heads:cols")
  with pytest.raises(LayoutError) as e:
    r.tensor_dimension_to_mesh_axis(("heads", 16), MESH)
  msg = str(e.value)
  for part in ["heads", "rows", "cols", "heads:rows;heads:cols"]:
    assert part in msg
  assert e.value.dim == "heads"


# tensor_layout.

def test_tensor_layout_examples():
  r = convert_to_layout_rules("batch:rows;d_ff:cols")
  assert r.tensor_layout("batch:4;d_ff:16", MESH) == TensorLayout([0, 1])
  assert r.tensor_layout("d_ff:16;batch:4", MESH) == TensorLayout([1, 0])
  assert r.tensor_layout("d_ff:16;d_model:3", MESH) == TensorLayout([1, None])
  assert r.tensor_layout("d_model:3", MESH).is_fully_replicated
  assert r.tensor_layout(Shape([]), MESH) == TensorLayout([])
  assert r.tensor_layout([("batch", 2)], [("rows", 2)]) == TensorLayout([0])


def test_tensor_layout_shared_mesh_dim_for_different_tensors():
  # Two rules on one mesh dim are fine as long as no tensor has both dims.
  r = convert_to_layout_rules("batch:rows;d_ff:rows")
  assert r.tensor_layout("batch:4;d_model:3", MESH) == TensorLayout([0, None])
  assert r.tensor_layout("d_model:3;d_ff:4", MESH) == TensorLayout([None, 0])


def test_tensor_layout_conflict():
  r = convert_to_layout_rules("batch:rows;d_ff:rows")
  with pytest.raises(LayoutError) as e:
    r.tensor_layout("batch:4;d_ff:16", MESH, tensor_name="w")
  msg = str(e.value)
  assert 'tensor "w" [batch:4, d_ff:16]' in msg
  assert "dims batch and d_ff" in msg
  assert 'mesh dim "rows"' in msg
  assert '"batch:rows"' in msg and '"d_ff:rows"' in msg
  assert "batch:rows;d_ff:rows" in msg
  assert "drop one of the two rules" in msg
  assert (e.value.tensor, e.value.dim, e.value.mesh_dim, e.value.rule) == (
      "w", "d_ff", "rows", "d_ff:rows")


def test_tensor_layout_conflict_without_name():
  r = convert_to_layout_rules("batch:rows;d_ff:rows")
  with pytest.raises(LayoutError, match=r'^tensor \[batch:4, d_ff:16\]: dims'):
    r.tensor_layout("batch:4;d_ff:16", MESH)


def test_tensor_layout_dim_on_two_mesh_dims_names_tensor():
  r = convert_to_layout_rules("heads:rows;heads:cols")
  with pytest.raises(LayoutError, match=r'tensor "q" \[heads:16\].*heads') as e:
    r.tensor_layout("heads:16", MESH, tensor_name="q")
  assert e.value.tensor == "q"


def test_tensor_layout_not_divisible():
  r = convert_to_layout_rules("b:rows;heads:cols")
  with pytest.raises(LayoutError) as e:
    r.tensor_layout("b:8;heads:12", MESH, tensor_name="x")
  assert str(e.value) == (
      'tensor "x" [b:8, heads:12]: dim heads=12 is split over mesh dim "cols" '
      '(size 8) by rule "heads:cols"; 8 does not divide 12 -- change the mesh '
      "shape, pad heads, or drop the rule")
  assert (e.value.tensor, e.value.dim, e.value.mesh_dim, e.value.rule) == (
      "x", "heads", "cols", "heads:cols")


def test_tensor_layout_not_divisible_match():
  r = convert_to_layout_rules("b:rows")
  with pytest.raises(LayoutError,
                     match=r'dim b=3 .*"rows" \(size 2\).*"b:rows"'):
    r.tensor_layout("b:3", MESH)


# TensorLayout.

def test_tensor_layout_object():
  t = TensorLayout([0, None, 1])
  assert len(t) == 3 and t[0] == 0 and t[1] is None
  assert list(t) == [0, None, 1]
  assert str(t) == "TensorLayout(0, None, 1)"
  assert str(TensorLayout([0, None])) == "TensorLayout(0, None)"
  assert t == TensorLayout((0, None, 1))
  assert hash(t) == hash(TensorLayout([0, None, 1]))
  assert t != TensorLayout([None, 0, 1])
  assert not t.is_fully_replicated
  assert TensorLayout([None, None]).is_fully_replicated
  assert TensorLayout([]).is_fully_replicated
  assert t.mesh_axes == [0, 1]
  assert TensorLayout([2, None, 0]).mesh_axes == [2, 0]
  assert pickle.loads(pickle.dumps(t)) == t
  with pytest.raises(AttributeError):
    t.x = 1


def test_mesh_axis_to_tensor_axis():
  # A tuple, as in the original; mesh axes past mesh_ndims are not looked at.
  assert TensorLayout([1, None]).mesh_axis_to_tensor_axis(3) == (None, 0, None)
  assert TensorLayout([None, 0, 1]).mesh_axis_to_tensor_axis(2) == (1, 2)
  assert TensorLayout([]).mesh_axis_to_tensor_axis(2) == (None, None)
  assert TensorLayout([0, 2, 1]).mesh_axis_to_tensor_axis(0) == ()
  assert TensorLayout([0, 2, 1]).mesh_axis_to_tensor_axis(1) == (0,)
  assert TensorLayout([0, 2, 1]).mesh_axis_to_tensor_axis(2) == (0, 2)
  assert TensorLayout([2]).mesh_axis_to_tensor_axis(2) == (None, None)


def test_tensor_layout_bad_entries():
  with pytest.raises(LayoutError, match="'0'"):
    TensorLayout(["0"])
  with pytest.raises(LayoutError, match="-1"):
    TensorLayout([-1])
