"""choose_layout: profiles, the search space, the fast predictor against the cost model,
and the choice against the hand-written layouts of gin_configs/layouts/."""
import math
import pathlib
import random
import re
import subprocess
import sys

import gin
import pytest

import mesh_tf as mtf
from mesh_tf import analysis
from mesh_tf import auto_mtf
from mesh_tf.auto_mtf import candidates, hardware
from benchmarks import overhead
from models.mlp import model as mlp
from models.tiny_lm import config as lm_config
from models.tiny_lm import mtf_model as lm

LAYOUTS_DIR = pathlib.Path(__file__).resolve().parents[2] / "gin_configs" / "layouts"


def hand_written_layouts(num_devices):
  """{file name: (mesh shape, rules)} of gin_configs/layouts/ for num_devices (or 1)."""
  out = {}
  for path in sorted(LAYOUTS_DIR.glob("*.gin")):
    text = path.read_text()
    mesh = re.search(r"utils\.run\.mesh_shape\s*=\s*'([^']*)'", text).group(1)
    rules = re.search(r"utils\.run\.layout_rules\s*=\s*'([^']*)'", text).group(1)
    if mtf.convert_to_shape(mesh).size in (1, num_devices):
      out[path.name] = (mesh, rules)
  return out


def _mlp():
  m = mlp.MlpModel(batch_size=32, hidden_size=64)
  return m.graph, [m.loss] + m.update_ops


def _lm():
  m = lm.TinyLmModel(lm_config.TinyLmConfig(num_layers=1, heads=8))
  return m.graph, [m.loss] + m.update_ops


def _make_train_lm():
  g = overhead.build_mtf_lm("small", mtf.optimize.AdafactorOptimizer())
  return g.graph, [g.loss] + g.update_ops


def test_profiles_are_data_selectable_by_name_and_gin():
  assert set(hardware.PROFILES) == {"tpu_v2", "tpu_v3", "gpu_h100", "cpu_host"}
  assert hardware.hardware_profile("tpu_v3").memory_bytes == 16 << 30
  assert hardware.hardware_profile("tpu_v2", memory_bytes=5).memory_bytes == 5
  with pytest.raises(mtf.MtfError, match="tpu_v2"):
    hardware.hardware_profile("abacus")
  gin.clear_config()
  try:
    gin.parse_config("auto_mtf.choose_layout.profile = %auto_mtf.GPU_H100")
    graph, fetches = _mlp()
    _, _, report = auto_mtf.choose_layout(graph, fetches, 8)
    assert report.profile.name == "gpu_h100"
  finally:
    gin.clear_config()


def test_gpu_links_are_fast_inside_a_node_only():
  gpu = hardware.GPU_H100
  # 16 GPUs as [2, 8]: the inner mesh dim stays in one node of 8, the outer crosses.
  assert gpu.axis_bandwidth((2, 8), [1]) == gpu.fast_group_bandwidth
  assert gpu.axis_bandwidth((2, 8), [0]) == gpu.link_bandwidth
  assert gpu.axis_bandwidth((2, 8), [0, 1]) == gpu.link_bandwidth
  assert not gpu.is_axis_uniform and hardware.TPU_V2.is_axis_uniform


def test_mesh_shapes_are_the_factorizations():
  assert candidates.mesh_shapes(1, 3) == [()]
  assert sorted(candidates.mesh_shapes(8, 3)) == sorted(
      [(8,), (4, 2), (2, 4), (2, 2, 2)])
  assert sorted(candidates.mesh_shapes(8, 3, ordered=False)) == [(2, 2, 2), (4, 2), (8,)]
  # 512 = 2^9: 1 + 8 + 28 ordered shapes; 1 + 4 + 7 partitions of 9 into <= 3 parts.
  assert len(candidates.mesh_shapes(512, 3)) == 37
  assert len(candidates.mesh_shapes(512, 3, ordered=False)) == 12
  for s in candidates.mesh_shapes(96, 3):
    assert math.prod(s) == 96 and all(f > 1 for f in s)


def test_layouts_are_legal_and_complete_on_a_small_case():
  conflicts = {frozenset(("a", "b"))}
  got = set(candidates.layouts(["a", "b", "c"], [2, 2], lambda d, m: d != "c" or m == 0,
                               conflicts))
  # Brute force: each dim on mesh dim 0, 1 or none; c only on 0; a and b not together.
  want = set()
  for pa in (None, 0, 1):
    for pb in (None, 0, 1):
      for pc in (None, 0):
        if pa is not None and pa == pb:
          continue
        place = {"a": pa, "b": pb, "c": pc}
        want.add(tuple(tuple(sorted(d for d in place if place[d] == m)) for m in (0, 1)))
  assert got == want
  symmetric = set(candidates.layouts(["a", "b", "c"], [2, 2],
                                     lambda d, m: True, conflicts, symmetric=True))
  assert all(l[0] <= l[1] for l in symmetric)


@pytest.mark.parametrize("build", [_mlp, _lm], ids=["mlp", "transformer_layer"])
def test_fast_prediction_equals_the_cost_model(build):
  graph, fetches = build()
  _, _, report = auto_mtf.choose_layout(graph, fetches, 8, profile="cpu_host")
  sample = list(report.candidates)
  random.Random(0).shuffle(sample)
  profile = hardware.CPU_HOST
  for c in sample[:60]:
    cost = analysis.estimate_cost(graph, c.mesh_shape, c.layout_rules, fetches=fetches)
    p = c.prediction
    assert p.comm_bytes == pytest.approx(cost.comm_bytes_per_processor), c
    assert p.flops == pytest.approx(cost.flops_per_processor), c
    assert p.variable_bytes == cost.variable_bytes_per_processor
    assert p.activation_bytes == cost.activation_bytes_per_processor
    records = [r for r in cost.comm_records if r.group_size > 1]
    assert p.num_collectives == len(records)
    sizes = mtf.convert_to_shape(c.mesh_shape).to_integer_list
    want = sum(profile.collective_latency_s + analysis.bytes_sent_per_processor(r)
               / profile.axis_bandwidth(sizes, r.mesh_axes) for r in records)
    assert p.comm_time == pytest.approx(want)
    assert p.step_time == pytest.approx(want + cost.flops_per_processor
                                        / profile.flops_per_second)


@pytest.mark.parametrize("build", [_mlp, _lm, _make_train_lm],
                         ids=["mlp", "transformer_layer", "make_train_lm"])
@pytest.mark.parametrize("tight", [False, True], ids=["no_cap", "tight_cap"])
def test_no_hand_written_layout_that_fits_is_faster(build, tight):
  graph, fetches = build()
  search = auto_mtf.LayoutSearch(graph, fetches, "cpu_host")
  hand = {}
  for name, (mesh, rules) in hand_written_layouts(8).items():
    try:
      hand[name] = search.score(mesh, rules)
    except mtf.LayoutError as e:  # e.g. 8-way heads on the 4-head make-train LM
      assert "does not divide" in str(e), e
  cap = None
  if tight:  # the least hand-written peak: only the leanest hand layouts fit
    cap = min(h.peak_memory for h in hand.values())
  shape, rules, report = auto_mtf.choose_layout(graph, fetches, 8, profile="cpu_host",
                                                memory_cap=cap)
  assert report.chosen.fits and shape.size == 8
  chosen = search.score(shape, rules, cap)
  assert chosen.prediction == report.chosen.prediction
  fitting = 0
  for name, h in hand.items():
    if cap is None or h.peak_memory <= cap:
      fitting += 1
      assert chosen.prediction.step_time <= h.prediction.step_time, (name, report)
  assert fitting >= 1
  if cap:
    assert report.chosen.peak_memory <= cap
    # Layouts over the cap are pruned before timing.
    assert all((c.prediction is None) == (not c.fits) for c in report.candidates)
    assert all(c.peak_memory <= cap for c in report.candidates if c.fits)


def test_memory_objective_picks_the_least_peak_memory():
  graph, fetches = _mlp()
  _, _, report = auto_mtf.choose_layout(graph, fetches, 8, objective="memory")
  assert report.chosen.peak_memory == min(c.peak_memory for c in report.candidates)


def test_given_mesh_shape_searches_rules_only():
  graph, fetches = _lm()
  shape, rules, report = auto_mtf.choose_layout(graph, fetches, "rows:2;cols:4",
                                                profile="tpu_v2")
  assert shape == mtf.convert_to_shape("rows:2;cols:4") and report.num_mesh_shapes == 1
  analysis.estimate_cost(graph, shape, rules, fetches=fetches)  # legal


def test_too_small_a_cap_raises_naming_the_least_memory():
  graph, fetches = _mlp()
  with pytest.raises(auto_mtf.SolverError, match="least memory"):
    auto_mtf.choose_layout(graph, fetches, 8, memory_cap=1000)
  with pytest.raises(mtf.MtfError, match="objective"):
    auto_mtf.choose_layout(graph, fetches, 8, objective="speed")


def test_report_explains_the_choice_and_the_runner_ups():
  graph, fetches = _lm()
  _, rules, report = auto_mtf.choose_layout(graph, fetches, 8, profile="tpu_v2",
                                            num_runner_ups=3)
  text = str(report)
  assert "Chosen: mesh %s, rules %s" % (report.mesh_shape, report.layout_rules) in text
  assert len(report.runner_ups) == 3
  for c, reason in report.runner_ups:
    assert c.layout_rules in text and reason in text
    assert c.prediction.step_time >= report.chosen.prediction.step_time
  assert "Layout report of the choice" in text
  for d, m in rules:
    assert "rule %s:%s" % (d, m) in text
  # Bytes by collective are the cost model's records of the choice.
  total = sum(analysis.bytes_sent_per_processor(r) for r in report.cost.comm_records)
  assert total == pytest.approx(report.chosen.prediction.comm_bytes)


def test_scoring_an_illegal_layout_raises_naming_the_rule():
  graph, fetches = _mlp()
  search = auto_mtf.LayoutSearch(graph, fetches, "cpu_host")
  with pytest.raises(mtf.LayoutError, match="both split"):
    search.score("all:8", "batch:all;hidden:all")
  with pytest.raises(mtf.LayoutError, match="does not divide"):
    search.score("all:8", "classes:all")


def test_gpu_profile_searches_both_mesh_dim_orders():
  # 16 GPUs, 8 per node: the inner mesh dim of [2, 8] stays in a node, the outer one
  # crosses nodes, so [2, 8] and [8, 2] are different meshes and both are searched.
  graph, fetches = _mlp()
  _, _, report = auto_mtf.choose_layout(graph, fetches, 16, profile="gpu_h100")
  found = {(c.mesh_shape, c.layout_rules): c for c in report.candidates}
  inner_hidden = found[("mesh_0:2;mesh_1:8", "batch:mesh_0;hidden:mesh_1")]
  outer_hidden = found[("mesh_0:8;mesh_1:2", "hidden:mesh_0;batch:mesh_1")]
  assert inner_hidden.prediction.comm_bytes == outer_hidden.prediction.comm_bytes
  assert inner_hidden.prediction.comm_time != outer_hidden.prediction.comm_time
  best = min(c.prediction.step_time for c in report.candidates if c.fits)
  assert report.chosen.prediction.step_time == best


def test_benchmark_script_prints_the_choice_and_emitted_bytes():
  result = subprocess.run(
      [sys.executable, "-m", "benchmarks.auto_layout", "--cases=mlp8"],
      capture_output=True, text=True, timeout=600,
      cwd=pathlib.Path(__file__).resolve().parents[2])
  assert result.returncode == 0, result.stderr[-3000:]
  auto = [l.split() for l in result.stdout.splitlines() if l.startswith("auto ")]
  assert len(auto) == 1
  # Columns: label, mesh, rules, step, compute, comm, predicted B, emitted B, ...
  assert auto[0][6] == auto[0][7], result.stdout
