"""Communication accounting: the collectives the placement backend emits while it lowers
(the backend's own record, not a count of traced ops) equal the cost model's prediction,
and for the MLP also the paper's closed-form minimum."""
import collections

import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import analysis
from models import train_steps
from models.mlp import model as mlp
from models.tiny_lm import config as lm_config
from models.tiny_lm import mtf_model as lm

LAYOUTS = {
    "dp": ("all:8", "batch:all"),
    "mp": ("all:8", "hidden:all;d_ff:all;heads:all"),
    "dp+mp": ("rows:2;cols:4", "batch:rows;hidden:cols;d_ff:cols;heads:cols"),
}


def _placement(mesh_shape, layout):
  n = mtf.convert_to_shape(mesh_shape).size
  return mtf.PlacementMeshImpl(mesh_shape, layout, ["/cpu:%d" % i for i in range(n)])


def _emitted_records(model, impl, feeds):
  """The Lowering made while tracing one train step in a tf.function."""
  lowerings = []

  @tf.function
  def step(*args):
    lowering = model.lowering(impl, *args)
    lowerings.append(lowering)
    return train_steps.lower_train_step(lowering, model.loss, model.update_ops)
  model.lowering(impl)
  step.get_concrete_function(*feeds)  # tracing emits (and records) the collectives
  assert len(lowerings) == 1
  return lowerings[0]


def _key(r):
  return (r.op, r.kind, r.mesh_axes, r.group_size, r.slice_bytes)


def _mlp():
  model = mlp.MlpModel(batch_size=32, hidden_size=64)
  images, labels = mlp.synthetic_digits(32)
  return model, (images, labels)


def _tiny_lm():
  c = lm_config.TinyLmConfig(num_layers=1, heads=8)
  model = lm.TinyLmModel(c)
  batch = lm_config.synthetic_batch(c)
  return model, (batch[:, :-1], batch[:, 1:])


@pytest.mark.parametrize("build", [_mlp, _tiny_lm], ids=["mlp", "transformer_layer"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_emitted_collectives_equal_predicted(build, layout):
  model, feeds = build()
  mesh_shape, rules = LAYOUTS[layout]
  lowering = _emitted_records(model, _placement(mesh_shape, rules), feeds)
  predicted = analysis.estimate_cost(model.graph, mesh_shape, rules,
                                     fetches=[model.loss] + model.update_ops)
  emitted = collections.Counter(_key(r) for r in lowering.comm_records)
  assert emitted, "a parallel layout must communicate"
  assert emitted == collections.Counter(_key(r) for r in predicted.comm_records)
  assert predicted.unmodelled_ops == []
  assert analysis.total_bytes_per_processor(lowering.comm_records) == pytest.approx(
      predicted.comm_bytes_per_processor)


def _allreduce(n, nbytes):
  return 2.0 * (n - 1) / n * nbytes


def test_mlp_communication_is_the_closed_form_minimum():
  # f32 weights w1 [28, 28, 64], w2 [64, 10]; batch 32; classes 10.
  w1, w2, logits, scalar = 28 * 28 * 64 * 4, 64 * 10 * 4, 32 * 10 * 4, 4
  expected = {
      # Data parallel: allreduce every weight gradient, and the mean loss.
      "dp": _allreduce(8, w1) + _allreduce(8, w2) + _allreduce(8, scalar),
      # Model parallel (hidden split): one allreduce of the logits; backward needs none.
      "mp": _allreduce(8, logits),
      # Both: logits allreduced over cols on a quarter batch... per row of processors.
      "dp+mp": (_allreduce(4, logits // 2) + _allreduce(2, scalar)
                + _allreduce(2, w1 // 4) + _allreduce(2, w2 // 4)),
  }
  for layout, want in expected.items():
    model, feeds = _mlp()
    mesh_shape, rules = LAYOUTS[layout]
    lowering = _emitted_records(model, _placement(mesh_shape, rules), feeds)
    got = analysis.total_bytes_per_processor(lowering.comm_records)
    assert got == pytest.approx(want), layout


def test_transformer_layer_model_parallel_is_the_closed_form_minimum():
  # Heads and d_ff split over 8: the paper's minimum is 2 allreduces of [batch, length,
  # d_model] forward (after the attention output and the FFN output projections) and 2
  # backward (the input gradients of attention and FFN). The attention input gradient
  # gets contributions from q, k and v: their partial sums are added before the one
  # allreduce (lazy allreduce), as in the original library.
  c = lm_config.TinyLmConfig(num_layers=1, heads=8)
  model, feeds = _tiny_lm()
  mesh_shape, rules = "all:8", "d_ff:all;heads:all"
  lowering = _emitted_records(model, _placement(mesh_shape, rules), feeds)
  activation = c.batch * c.length * c.d_model * 4
  big = [r for r in lowering.comm_records if r.slice_bytes == activation]
  assert len(big) == 4
  assert all(r.kind == "allreduce" for r in big)
  assert any(r.op.startswith("add_n") for r in big)  # the q/k/v partial sums, once
  # Everything else is small: vectors of the norm scales and the scalar loss.
  rest = [r for r in lowering.comm_records if r.slice_bytes != activation]
  assert all(r.slice_bytes <= c.d_model * 4 for r in rest), rest


def test_summary_and_report_name_kinds_axes_and_ops():
  model, feeds = _mlp()
  lowering = _emitted_records(model, _placement(*LAYOUTS["dp+mp"]), feeds)
  summary = lowering.communication_summary()
  assert set(summary) == {("allreduce", "cols"), ("allreduce", "rows")}
  assert sum(summary.values()) == pytest.approx(
      analysis.total_bytes_per_processor(lowering.comm_records))
  report = lowering.communication_report()
  assert "allreduce" in report and "rows" in report and "TOTAL" in report
  for r in lowering.comm_records:
    assert r.op in report


def test_each_collective_kind_has_its_ring_formula():
  rec = mtf.lowering.mesh_impl.CollectiveRecord
  assert analysis.bytes_sent_per_processor(rec("allreduce", (0,), 4, 100)) == 150
  assert analysis.bytes_sent_per_processor(rec("allconcat", (0,), 4, 100)) == 300
  assert analysis.bytes_sent_per_processor(rec("alltoall", (0,), 4, 100)) == 75
  assert analysis.bytes_sent_per_processor(rec("receive", (0,), 4, 100)) == 100
  assert analysis.bytes_sent_per_processor(rec("allreduce", (0,), 1, 100)) == 0


def test_single_device_step_records_nothing():
  model, feeds = _mlp()
  lowering = _emitted_records(model, mtf.PlacementMeshImpl("", ""), feeds)
  assert lowering.comm_records == []
