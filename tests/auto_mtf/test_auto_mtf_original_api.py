"""mtf.auto_mtf with the original's API: modules, signatures, the memory objective, the
graph view, the scheduler and the validity of assignments."""
import inspect
import json
import os

import pytest

import mesh_tf as mtf
from mesh_tf import analysis
from mesh_tf.auto_mtf import (api, graph_interface, layout_optimizer, memory_estimator,
                              print_cp_model_solution, scheduler, valid_layouts)
from models.mlp import model as mlp
from models.tiny_lm import config as lm_config
from models.tiny_lm import mtf_model as lm

_API = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "api",
                    "original_api.json")
_MODULES = {"api": api, "graph_interface": graph_interface,
            "layout_optimizer": layout_optimizer, "memory_estimator": memory_estimator,
            "print_cp_model_solution": print_cp_model_solution, "scheduler": scheduler,
            "valid_layouts": valid_layouts}


def _params(fn):
  return [(p.name, None if p.default is inspect.Parameter.empty else repr(p.default))
          for p in inspect.signature(fn).parameters.values()]


def _original(entry):
  return [(name, default) for name, _, default in entry["params"]]


def test_every_original_name_and_parameter_exists():
  with open(_API) as f:
    spec = json.load(f)
  assert mtf.auto_mtf.layout is api.layout
  for module_name, module in _MODULES.items():
    assert getattr(mtf.auto_mtf, module_name) is module
    for name, entry in spec["mesh_tensorflow.auto_mtf." + module_name].items():
      obj = getattr(module, name)
      if entry["kind"] == "function":
        assert _params(obj) == _original(entry), name
        continue
      for member, m in entry.get("members", {}).items():
        attr = getattr(obj, member)
        if m["kind"] == "method":
          assert _params(attr) == _original(m), (name, member)
        else:
          assert isinstance(attr, property), (name, member)


def _mlp():
  m = mlp.MlpModel(batch_size=32, hidden_size=64)
  return m, [m.loss] + m.update_ops


def _transformer_layer():
  m = lm.TinyLmModel(lm_config.TinyLmConfig(num_layers=1, heads=8))
  return m, [m.loss] + m.update_ops


def test_validator_rejects_indivisible_and_unsplittable_dims():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, [mtf.Dimension("batch", 12), mtf.Dimension("vocab", 10)])
  # top_k needs its k dim whole on every processor.
  mtf.top_k(x, reduced_dim=x.shape.dims[1], k_dim=mtf.Dimension("k", 6))
  v = valid_layouts.LayoutValidator(graph, "a:4;b:3")
  assert v.mesh_dimension_name_to_size == {"a": 4, "b": 3}
  assert "batch" in v.splittable_mtf_dimension_names
  assert "k" not in v.splittable_mtf_dimension_names
  assert v.is_valid_assignment("batch", "a") and v.is_valid_assignment("batch", "b")
  assert not v.is_valid_assignment("k", "b")  # unsplittable, though 3 divides 6
  assert not v.is_valid_assignment("batch", "nope")  # no such mesh dim
  v8 = valid_layouts.LayoutValidator(graph, "a:8")
  assert not v8.is_valid_assignment("batch", "a")  # 8 does not divide 12


def test_a_name_with_two_sizes_is_checked_against_their_gcd():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.zeros(mesh, [mtf.Dimension("heads", 64)])
  mtf.zeros(mesh, [mtf.Dimension("heads", 4)])
  v = valid_layouts.LayoutValidator(graph, "a:4;b:8")
  assert v.is_valid_assignment("heads", "a")
  assert not v.is_valid_assignment("heads", "b")


def _chain():
  """x [b=8, h=16] f32 -> y = relu(x) -> s = reduce_sum(y) [b]."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  b, h = mtf.Dimension("b", 8), mtf.Dimension("h", 16)
  x = mtf.zeros(mesh, [b, h])
  y = mtf.relu(x)
  s = mtf.reduce_sum(y, reduced_dim=h)
  return graph, x, y, s


def test_graph_interface_names_sizes_and_memory_contents():
  graph, x, y, s = _chain()
  g = graph_interface.GraphInterface(graph)
  assert g.get_num_operations() == 3
  assert g.get_all_operation_names() == [x.operation.name, y.operation.name,
                                         s.operation.name]
  assert g.get_operation_input_names(y.operation.name) == [x.name]
  assert g.get_operation_output_names(y.operation.name) == [y.name]
  assert g.get_tensor_shape(x.name).as_list() == [8, 16]
  assert g.get_tensor_mtf_dimension_names(x.name) == ["b", "h"]
  assert g.get_operation_mtf_dimension_names(s.operation.name) == {"b", "h"}
  assert g.get_tensor_size(x.name) == 8 * 16 * 4
  assert g.get_tensor_num_entries(x.name, {"h": "m"}, {"m": 4}) == 8 * 4
  assert g.get_tensor_size(x.name, {"b": "m", "h": "n"}, {"m": 2, "n": 4}) == 4 * 4 * 4
  assert g.get_tensor_device(x.name) is None and g.is_tensor_on_canonical_device(x.name)
  assert not g.is_tensor_final(s.name)
  g.set_tensor_final(s.name)
  assert g.is_tensor_final(s.name)
  contents = g.compute_memory_contents_under_schedule([0, 1, 2])
  assert contents == [frozenset([x.name]), frozenset([x.name, y.name]),
                      frozenset([y.name, s.name])]
  cost_graph = g.compute_cost_graph()
  assert [n.name for n in cost_graph.node] == g.get_all_operation_names()
  assert cost_graph.node[1].input_info[0].preceding_node == 0
  assert cost_graph.node[1].output_info[0].size == 8 * 16 * 4
  with pytest.raises(mtf.MtfError, match="nope"):
    g.get_tensor_size("nope")


def test_list_scheduler_is_topological_and_not_worse_than_graph_order():
  m, fetches = _transformer_layer()
  est = memory_estimator.MemoryEstimator(m.graph, "", fetches)
  g = est.get_graph_interface()
  naive = scheduler.minimize_peak_memory(g, "NAIVE")
  listed = scheduler.minimize_peak_memory(g, "LIST")
  assert naive == list(range(g.get_num_operations()))
  assert sorted(listed) == naive
  position = {i: step for step, i in enumerate(listed)}
  for i, preds in enumerate(g.operation_predecessors()):
    assert all(position[p] < position[i] for p in preds)

  def peak(schedule):
    return max(sum(g.get_tensor_size(t) for t in c)
               for c in g.compute_memory_contents_under_schedule(schedule))
  assert peak(listed) <= peak(naive)
  peak_model = memory_estimator.PeakMemoryModel(g, listed)
  assert peak_model.peak_bytes({}, {}) == peak(listed)
  with pytest.raises(mtf.MtfError, match="LIST"):
    scheduler.minimize_peak_memory(g, "FASTEST")


def test_peak_memory_of_a_layout_is_the_sum_of_the_live_slices():
  graph, x, y, s = _chain()
  est = memory_estimator.MemoryEstimator(graph, "m:4", [s])
  opt = layout_optimizer.LayoutOptimizer(est, scheduler_alg="NAIVE")
  # f32 slices; peak = max(x + y while y runs, y + s while s runs).
  def peak(b, h):
    return max(2 * b * h * 4, (b * h + b) * 4)
  assert opt.evaluate_layout("") == peak(8, 16)
  assert opt.evaluate_layout("h:m") == peak(8, 4)
  assert opt.evaluate_layout("b:m") == peak(2, 16)


@pytest.mark.parametrize("build", [_mlp, _transformer_layer], ids=["mlp", "layer"])
def test_memory_objective_is_legal_and_beats_hand_written_layouts(build):
  m, fetches = build()
  mesh_shape = "rows:2;cols:4"
  est = memory_estimator.MemoryEstimator(m.graph, mesh_shape, fetches)
  opt = layout_optimizer.LayoutOptimizer(est)
  rules = opt.solve()
  assert rules == str(api.layout(m.graph, mesh_shape, fetches))
  analysis.estimate_cost(m.graph, mesh_shape, rules, fetches=fetches)  # lowers legally
  best = opt.evaluate_layout(rules)
  for hand in ["", "batch:rows", "hidden:cols;d_ff:cols;heads:cols",
               "batch:rows;hidden:cols;d_ff:cols;heads:cols;vocab:cols"]:
    assert best <= opt.evaluate_layout(hand), hand
  assert best < opt.evaluate_layout("")


def test_memory_objective_never_puts_two_dims_of_one_op_on_one_mesh_dim():
  # Splitting both batch and hidden over "all" would hold least memory, but they meet
  # in one tensor; the choice must keep one of them whole.
  m, fetches = _mlp()
  rules = mtf.convert_to_layout_rules(api.layout(m.graph, "all:8", fetches))
  g = memory_estimator.MemoryEstimator(m.graph, "all:8", fetches).get_graph_interface()
  split = {d for d, _ in rules}
  for name in g.get_all_operation_names():
    assert len(split & g.get_operation_mtf_dimension_names(name)) <= 1, (name, rules)
  with pytest.raises(mtf.LayoutError, match="both split"):
    analysis.estimate_cost(m.graph, "all:8", "batch:all;hidden:all", fetches=fetches)


def test_layout_and_mesh_shape_searches_the_factorizations():
  m, fetches = _mlp()
  rules, shape = api.layout_and_mesh_shape(m.graph, 8, fetches, 2)
  assert isinstance(rules, mtf.LayoutRules) and isinstance(shape, mtf.Shape)
  assert shape.size == 8 and shape.ndims <= 2
  best = None
  for other in ["mesh_0:8", "mesh_0:4;mesh_1:2"]:
    o = layout_optimizer.LayoutOptimizer(memory_estimator.MemoryEstimator(
        m.graph, other, fetches))
    peak = o.evaluate_layout(o.solve())
    best = peak if best is None else min(best, peak)
  o = layout_optimizer.LayoutOptimizer(memory_estimator.MemoryEstimator(
      m.graph, shape, fetches))
  assert o.evaluate_layout(rules) == best


def test_print_solution_lists_the_chosen_pairs(capsys):
  m, fetches = _mlp()
  est = memory_estimator.MemoryEstimator(m.graph, "all:8", fetches)
  rules = layout_optimizer.LayoutOptimizer(est).solve(print_solution=True)
  out = capsys.readouterr().out
  assert "Objective value" in out
  for pair in rules.split(";"):
    assert "x_(%s) = 1" % pair in out
