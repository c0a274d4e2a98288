"""On 8 emulated CPUs: the bytes a backend sends for the chosen layout (and for other
candidates) equal the search's prediction, and predicted and emitted bytes (the backend's record of what it sent) rank the
candidates alike (placement backend for the MLP; SIMD emulation, which traces one
program instead of eight, for the LM). Models: the README MLP and the `make train` Transformer LM
(gin_configs/models/lm_cpu_small.gin with readme_lm.gin's batch of 16 x 64)."""
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import auto_mtf
from benchmarks import auto_layout
from benchmarks import overhead
from models.mlp import model as mlp


def _spread(report, count):
  """The chosen candidate and others spread over the ranking, of distinct bytes."""
  picked, seen = [report.chosen], {report.chosen.prediction.comm_bytes}
  fitting = [c for c in report.candidates if c.fits]
  for i in range(1, count * 4):
    c = fitting[min(len(fitting) - 1, i * len(fitting) // (count * 4))]
    if c.prediction.comm_bytes not in seen and len(picked) < count:
      picked.append(c)
      seen.add(c.prediction.comm_bytes)
  return picked


def _check(candidates, measure):
  measured = {}
  for c in candidates:
    measured[c] = measure(c.mesh_shape, c.layout_rules)
    assert measured[c] == pytest.approx(c.prediction.comm_bytes), c
  by_prediction = sorted(candidates, key=lambda c: c.prediction.comm_bytes)
  by_measurement = sorted(candidates, key=lambda c: measured[c])
  assert by_prediction == by_measurement


def test_mlp_chosen_layout_sends_what_was_predicted():
  m = mlp.MlpModel(batch_size=32, hidden_size=64)
  images, labels = mlp.synthetic_digits(32)
  _, _, report = auto_mtf.choose_layout(m.graph, [m.loss] + m.update_ops, 8,
                                        profile="cpu_host")
  picked = _spread(report, 5)
  assert len(picked) == 5

  def measure(mesh_shape, rules):
    return auto_layout.emitted_bytes(mesh_shape, rules, m.lowering, m.loss, m.update_ops,
                           (images, labels))
  _check(picked, measure)


def test_transformer_lm_chosen_layout_sends_what_was_predicted():
  g = overhead.build_mtf_lm("small", mtf.optimize.AdafactorOptimizer())
  targets = tf.constant(overhead.synthetic_targets("small"))
  _, _, report = auto_mtf.choose_layout(g.graph, [g.loss] + g.update_ops, 8,
                                        profile="cpu_host")
  # Three traces of the step (a few seconds each on 2 cores): the choice and two
  # candidates further down the ranking.
  picked = _spread(report, 3)
  assert len(picked) == 3

  def make_lowering(impl, t=None):
    return g.lowering(impl, None if t is None else {"targets": t})

  def measure(mesh_shape, rules):
    return auto_layout.emitted_bytes(mesh_shape, rules, make_lowering, g.loss, g.update_ops,
                           (targets,), backend="simd")
  _check(picked, measure)
