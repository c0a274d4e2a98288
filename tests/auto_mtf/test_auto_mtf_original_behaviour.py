"""auto_mtf behaves as the original: its private helpers, the layout program and its
tie-breaking, the graph view over TF and mtf graphs, the list scheduler's order and the
validator's treatment of anonymous dims."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import cost_graph_pb2

import mesh_tf as mtf
from mesh_tf.auto_mtf import (api, graph_interface, layout_optimizer, memory_estimator,
                              scheduler, valid_layouts)


# --- api._mesh_shape_iterator ---------------------------------------------------

def test_mesh_shape_iterator_lists_power_of_two_factorizations_largest_first():
  assert list(api._mesh_shape_iterator(1)) == [[1]]
  assert list(api._mesh_shape_iterator(16)) == [
      [16], [8, 2], [4, 4], [4, 2, 2], [2, 2, 2, 2]]
  assert list(api._mesh_shape_iterator(16, 2)) == [[16], [8, 2], [4, 4]]
  shapes = list(api._mesh_shape_iterator(1024))
  assert len(shapes) == len({tuple(s) for s in shapes}) == 42  # partitions of 10
  for s in shapes:
    assert int(np.prod(s)) == 1024 and s == sorted(s, reverse=True)
    assert all(f >= 2 and f & (f - 1) == 0 for f in s)
  assert shapes == sorted(shapes, reverse=True)


def test_layout_and_mesh_shape_names_mesh_dims_and_takes_the_first_best_shape():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "p:12,q:7")
  y = mtf.zeros(mesh, "q:7,r:40")
  out = mtf.einsum([x, y], "p:12,r:40")
  rules, shape = api.layout_and_mesh_shape(graph, 4, [out])
  # [4]: p and r meet in the einsum, so one of them is split 4 ways; r:4 holds
  # 84 + 70 + 120 entries at the einsum. [2, 2]: p:2 and r:2 hold 42 + 140 + 120.
  assert shape == mtf.Shape([mtf.Dimension("mesh_0", 4)])
  assert list(rules) == [("r", "mesh_0")]
  rules, shape = api.layout_and_mesh_shape(graph, 4, [out], None)
  assert shape == mtf.Shape([mtf.Dimension("mesh_0", 4)])


# --- layout_optimizer helpers -----------------------------------------------------

def test_variable_names():
  assert layout_optimizer._global_var_name("batch", "rows") == "x_(batch:rows)"
  assert layout_optimizer._local_var_name(frozenset(), {}) == "y_()"
  assert layout_optimizer._local_var_name(
      frozenset(["zeta", "alpha", "mid"]), {"zeta": "m2", "alpha": "m1"}) == (
          "y_(alpha:m1,mid,zeta:m2)")


def test_generate_assignments_is_every_injective_partial_map():
  got = layout_optimizer._generate_assignments({"d1", "d2"}, {"m1": 2, "m2": 2, "m3": 4})
  # 1 empty + 2 dims * 3 mesh dims + 3 * 2 ordered pairs of mesh dims for both dims.
  assert len(got) == 1 + 6 + 6
  assert got[0] == {}
  assert {"d1": "m3", "d2": "m1"} in got
  assert all(len(set(a.values())) == len(a) for a in got)
  assert len({tuple(sorted(a.items())) for a in got}) == len(got)
  assert layout_optimizer._generate_assignments(["d1", "d2", "d3"], {"m": 2}) == [
      {}, {"d1": "m"}, {"d2": "m"}, {"d3": "m"}]


# --- LayoutOptimizer ------------------------------------------------------------------

def _matmul_graph(repeats=1):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "p:12,q:7")
  y = mtf.zeros(mesh, "q:7,r:40")
  outs = [mtf.einsum([x, y], "p:12,r:40") for _ in range(repeats)]
  return graph, outs


def _optimizer(graph, mesh_shape, outputs=()):
  return layout_optimizer.LayoutOptimizer(
      memory_estimator.MemoryEstimator(graph, mtf.convert_to_shape(mesh_shape), outputs))


def test_program_variables_grow_with_dim_sets_not_with_operations():
  graph, _ = _matmul_graph(repeats=60)
  opt = _optimizer(graph, "m1:4,m2:2")
  assert len(list(opt._graph.get_all_operation_names())) >= 60
  names = [v.name for v in opt._model.Proto().variables]
  # 6 global, the local assignments of {p,q,r}, {p,q}, {q,r}, {p,r}, and z.
  assert len(names) == 6 + 13 + 3 * 7 + 1
  assert "x_(q:m2)" in names and "y_(p:m2,q,r:m1)" in names and names[-1] == "z"
  assert opt.solve() == "p:m2;r:m1"


def test_solution_minimizes_peak_then_splits_as_many_dims_as_possible():
  graph, _ = _matmul_graph()
  opt = _optimizer(graph, "m1:4,m2:2,one:1")
  # A size-1 mesh dim saves nothing, but splitting over it still counts.
  assert opt.solve() == "p:m2;q:one;r:m1"
  assert opt.evaluate_layout("p:m2;q:one;r:m1") == opt.evaluate_layout("p:m2;r:m1")
  for other in ["", "p:m1", "r:m2", "p:m1;r:m2", "p:m2"]:
    assert opt.evaluate_layout("p:m2;r:m1") <= opt.evaluate_layout(other)


def test_ties_go_to_the_rules_string_that_sorts_first():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.zeros(mesh, "u:8")
  mtf.zeros(mesh, "v:8")
  # u and v never meet, so u:a;v:b and u:b;v:a and u:a;v:a all hold the same.
  opt = _optimizer(graph, "a:2,b:2")
  assert opt.solve() == "u:a;v:a"


def test_nothing_is_split_when_nothing_is_splittable():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "p:12,q:7")
  mtf.UnstackOperation(x, mtf.Dimension("p", 12))
  opt = _optimizer(graph, "m1:4,m2:2")
  assert opt.solve() == ""  # p is unstacked, 7 has no divisor among 4 and 2


def test_print_solution_shows_the_program_variables(capsys):
  graph, outs = _matmul_graph()
  _optimizer(graph, "m1:4,m2:2", outs).solve(print_solution=True)
  out = capsys.readouterr().out
  assert "x_(p:m2) = 1" in out and "x_(r:m1) = 1" in out and "x_(p:m1)" not in out
  assert "y_(p:m2,q,r:m1) = 1" in out


# --- GraphInterface ---------------------------------------------------------------------

def _tf_graph():
  graph = tf.Graph()
  with graph.as_default(), tf.device("/device:CPU:0"):
    a = tf.zeros([2, 3], dtype=tf.float32, name="A")
    b = tf.zeros([3, 5], dtype=tf.float32, name="B")
    tf.matmul(a, b, name="AB")
  return graph


def test_graph_interface_reads_a_tf2_graph():
  g = graph_interface.GraphInterface(_tf_graph(), canonical_device="/device:CPU:0")
  assert list(g.get_all_operation_names()) == ["A", "B", "AB"]
  assert list(g.get_operation_input_names("AB")) == ["A:0", "B:0"]
  assert list(g.get_all_tensor_names()) == ["A:0", "B:0", "AB:0"]
  assert g.get_tensor_shape("AB:0") == tf.TensorShape([2, 5])
  assert g.get_tensor_dtype("A:0") == tf.float32
  assert g.get_tensor_num_entries("B:0") == 15
  assert g.get_tensor_size("AB:0") == 40
  assert g.get_tensor_device("A:0") == "/device:CPU:0"
  assert g.get_operation_device("AB") == "/device:CPU:0"
  assert g.is_tensor_on_canonical_device("AB:0")
  assert g.get_operation_mtf_dimension_names("AB") == set()
  assert g.get_tensor_mtf_dimension_names("AB:0") == []
  assert g.compute_memory_contents_under_schedule([1, 0, 2]) == [
      frozenset(["B:0"]), frozenset(["A:0", "B:0"]), frozenset(["A:0", "B:0", "AB:0"])]
  other = graph_interface.GraphInterface(_tf_graph(), canonical_device="/device:GPU:0")
  assert not other.is_tensor_on_canonical_device("A:0")


def test_cost_graph_of_a_tf_graph_drops_sizes_off_the_listed_devices():
  g = graph_interface.GraphInterface(_tf_graph())
  full = g.compute_cost_graph()
  assert [n.name for n in full.node] == ["A", "B", "AB"]
  assert full.node[2].device == "/device:CPU:0"
  assert [(i.preceding_node, i.preceding_port) for i in full.node[2].input_info] == [
      (0, 0), (1, 0)]
  assert full.node[2].output_info[0].size == 40
  assert [d.size for d in full.node[2].output_info[0].shape.dim] == [2, 5]
  bare = g.compute_cost_graph(devices=[])
  assert bare.node[2].output_info[0].size == 0
  assert not bare.node[2].output_info[0].HasField("shape")
  assert g.compute_cost_graph(devices=["/device:CPU:0"]) == full


def test_cost_graph_of_an_mtf_graph_matches_a_hand_built_one():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.Constant(mesh, 0, mtf.convert_to_shape("p:2,q:3"), tf.int32, name="X").outputs[0]
  mtf.EinsumOperation([x, x], mtf.convert_to_shape("p:2"), name="Y")
  g = graph_interface.GraphInterface(graph)
  g.set_tensor_final("Y:0")
  want = cost_graph_pb2.CostGraphDef()
  node = want.node.add(name="X", id=0)
  node.output_info.add(size=24, alias_input_port=-1, dtype=tf.int32.as_datatype_enum,
                       shape=tf.TensorShape([2, 3]).as_proto())
  node = want.node.add(name="Y", id=1, is_final=True)
  node.input_info.add(preceding_node=0, preceding_port=0)
  node.input_info.add(preceding_node=0, preceding_port=0)
  node.output_info.add(size=8, alias_input_port=-1, dtype=tf.int32.as_datatype_enum,
                       shape=tf.TensorShape([2]).as_proto())
  assert g.compute_cost_graph().SerializeToString() == want.SerializeToString()
  assert g.compute_cost_graph(devices=[]).SerializeToString() == (
      want.SerializeToString())


@pytest.mark.parametrize("not_a_graph", ["hello", 3, None, [1, 2]])
def test_graph_interface_refuses_a_non_graph_with_a_type_error(not_a_graph):
  with pytest.raises(TypeError):
    graph_interface.GraphInterface(not_a_graph)


# --- scheduler ---------------------------------------------------------------------------

def _three_constants(final=()):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.Constant(mesh, 0, mtf.convert_to_shape("a:6"), tf.int32, name="Unused")
  y = mtf.Constant(mesh, 0, mtf.convert_to_shape("b:2"), tf.int32, name="Small").outputs[0]
  mtf.BroadcastOperation(y, mtf.convert_to_shape("b:2,c:5"), name="Wide")
  g = graph_interface.GraphInterface(graph)
  for name in final:
    g.set_tensor_final(name)
  return g


def test_a_tensor_nobody_uses_costs_nothing_to_the_list_scheduler():
  # "Unused" frees nothing and costs nothing (its output is dropped at once), so it
  # goes before "Small", which costs 8 bytes.
  assert scheduler.minimize_peak_memory(_three_constants(), "LIST") == [0, 1, 2]


def test_a_final_tensor_costs_its_bytes_to_the_list_scheduler():
  # Now "Unused" (24 bytes, final) costs more than "Small" (8 bytes); once Small ran,
  # "Wide" costs 40 - 8 = 32 bytes, more than Unused's 24, so Unused goes second.
  order = scheduler.minimize_peak_memory(
      _three_constants(final=["Unused:0", "Wide:0"]), "LIST")
  assert order == [1, 0, 2]


def test_list_scheduler_breaks_ties_by_operation_name_and_naive_is_graph_order():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  for name in ["zz", "aa", "mm"]:
    mtf.Constant(mesh, 0, mtf.convert_to_shape("d:4"), tf.float32, name=name)
  g = graph_interface.GraphInterface(graph)
  for name in ["zz:0", "aa:0", "mm:0"]:
    g.set_tensor_final(name)
  assert scheduler.minimize_peak_memory(g, "LIST") == [1, 2, 0]
  assert list(scheduler.minimize_peak_memory(g, "NAIVE")) == [0, 1, 2]
  with pytest.raises(NotImplementedError):
    scheduler.minimize_peak_memory(g, "RANDOM")


# --- valid_layouts --------------------------------------------------------------------------

def test_anonymous_dims_are_never_splittable():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  shape = mtf.convert_to_shape("p:8,q:4")
  mtf.zeros(mesh, mtf.anonymous_shape(shape))
  mtf.zeros(mesh, mtf.convert_to_shape("q:4,_anonymousish:8"))
  v = valid_layouts.LayoutValidator(graph, "m:2")
  assert v.splittable_mtf_dimension_names == {"q", "_anonymousish"}
  assert not v.is_valid_assignment("_anonymous_0", "m")
  assert v.is_valid_assignment("q", "m")
