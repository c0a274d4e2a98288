"""The layout report: splits per tensor, unused and conflicting rules, warnings."""
import mesh_tf as mtf
from mesh_tf import analysis
from models.mlp import model as mlp
from models.tiny_lm import config as lm_config
from models.tiny_lm import mtf_model as lm


def _mlp_graph():
  return mlp.MlpModel(batch_size=32, hidden_size=64).graph


def test_lists_which_rule_split_which_dim():
  report = analysis.layout_report(_mlp_graph(), "rows:2;cols:4", "batch:rows;hidden:cols")
  by_name = {t.name: t for t in report.tensors}
  w1 = [t for n, t in by_name.items() if n.startswith("w1")][0]
  assert w1.splits == [("hidden", "cols", "hidden:cols")]
  images = by_name["images:0"] if "images:0" in by_name else [
      t for n, t in by_name.items() if n.startswith("images")][0]
  assert images.splits == [("batch", "rows", "batch:rows")]
  assert report.unused_rules == [] and report.conflicts == []
  text = str(report)
  assert "hidden over cols (rule hidden:cols)" in text


def test_a_mesh_layout_gives_the_same_report_as_its_pair():
  graph = _mlp_graph()
  pair = analysis.layout_report(graph, "rows:2;cols:4", "batch:rows;hidden:cols;x:planes")
  layout = mtf.shapes.MeshLayout("rows:2;cols:4", "batch:rows;hidden:cols;x:planes")
  assert str(analysis.layout_report(graph, layout)) == str(pair)
  assert pair.unused_rules == ["x:planes (mesh has no dim planes)"]


def test_unused_rules_and_missing_mesh_dims_are_listed():
  report = analysis.layout_report(_mlp_graph(), "rows:2;cols:4",
                                  "batch:rows;d_ff:cols;heads:planes")
  assert "d_ff:cols" in report.unused_rules
  assert "heads:planes (mesh has no dim planes)" in report.unused_rules


def test_conflicting_rules_are_reported_not_raised():
  # hidden and classes both want "cols" in w2 [hidden, classes] (classes=10 is not
  # divisible by 4 either, so use a 2-wide mesh dim).
  report = analysis.layout_report(_mlp_graph(), "rows:4;cols:2", "hidden:cols;classes:cols")
  assert any("classes:cols skipped, mesh dim cols already splits hidden" in c
             for c in report.conflicts)
  # Lowering the same layout raises, naming the rules.
  impl = mtf.PlacementMeshImpl("rows:4;cols:2", "hidden:cols;classes:cols")
  graph = _mlp_graph()
  mesh = graph.operations[0].mesh
  try:
    mtf.Lowering(graph, {mesh: impl})
  except mtf.LayoutError as e:
    assert "classes:cols" in str(e)
  else:
    raise AssertionError("the conflicting layout lowered")


def test_indivisible_rule_is_reported():
  report = analysis.layout_report(_mlp_graph(), "all:8", "classes:all")
  assert any("does not divide classes=10" in c for c in report.conflicts)


def test_warns_about_heavy_compute_replicated_over_an_unused_mesh_dim():
  report = analysis.layout_report(_mlp_graph(), "rows:2;cols:4", "batch:rows")
  assert any("computed identically on every processor of mesh dims ['cols']" in w
             for w in report.warnings)
  fine = analysis.layout_report(_mlp_graph(), "rows:2;cols:4", "batch:rows;hidden:cols")
  assert not any("identically" in w for w in fine.warnings)


def test_warns_about_a_large_allconcat():
  c = lm_config.TinyLmConfig(num_layers=1, heads=8)
  graph = lm.TinyLmModel(c).graph
  # Splitting length forces rename_dimension(length -> memory_length) to gather it.
  report = analysis.layout_report(graph, "all:8", "length:all", large_allconcat_bytes=1)
  assert any("allconcat over mesh dim all" in w for w in report.warnings)
  quiet = analysis.layout_report(graph, "all:8", "length:all")
  assert not any("allconcat" in w for w in quiet.warnings)
