"""The SIMD emulation's program does not grow with the mesh on the peer LM either: the
train step of models.tiny_lm at benchmarks/step_time.py's sizes with 32 heads (so that
heads divide a 32-way split), batch split over rows and heads / d_ff / vocab over cols,
traced at 8, 64 and 512 emulated cores has the same ops at 8 and 64 and no more at 512
(where the speed layer writes some transposes as reshapes, one op for one), and from
the same weights and data computes the same loss at 8 and at 64 cores."""
import collections

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.tiny_lm import config, mtf_model

LAYOUT = "batch:rows;heads:cols;d_ff:cols;vocab:cols"
SIZES = dict(batch=32, length=128, vocab=2048, d_model=256, heads=32, d_kv=8, d_ff=1024,
             num_layers=2, learning_rate=0.05)


@pytest.fixture(scope="module")
def lm():
  c = config.TinyLmConfig(**SIZES)
  batch = config.synthetic_batch(c)
  return c, config.initial_weights(c), tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])


def _traced(lm, mesh_shape):
  c, weights, inputs, targets = lm
  impl = mtf.SimdMeshImpl(mesh_shape, LAYOUT)
  step = mtf_model.TinyLmModel(c, weights).make_train_step(impl)
  return step, step.get_concrete_function(inputs, targets).graph, impl


def _op_types(graph):
  return collections.Counter(op.type for op in graph.get_operations())


@pytest.fixture(scope="module")
def programs(lm):
  """{cores: op type counts} of the step traced at 8, 64 and 512 cores, and {cores: loss}
  of one step at 8 and 64."""
  _, _, inputs, targets = lm
  kinds, losses = {}, {}
  for mesh_shape in ("rows:2;cols:4", "rows:8;cols:8", "rows:16;cols:32"):
    step, graph, impl = _traced(lm, mesh_shape)
    kinds[impl.size] = _op_types(graph)
    # the model-parallel einsums and the data-parallel gradients communicate
    assert {"allreduce"} <= {r.kind for r in impl.comm_log}, mesh_shape
    if impl.size < 512:
      losses[impl.size] = float(step(inputs, targets))
  return kinds, losses


def test_lm_step_has_the_same_ops_at_8_and_64_cores_no_more_at_512_and_the_same_loss(
    programs):
  kinds, losses = programs
  assert kinds[8] == kinds[64]
  assert sum(kinds[512].values()) <= sum(kinds[8].values())
  # one program for every core: no per-core loop
  assert not {"While", "StatelessWhile"} & set(kinds[512])
  # a real loss (about log(vocab) from these initial weights), equal on both meshes
  assert 6.0 < losses[8] < 10.0, losses
  np.testing.assert_allclose(losses[64], losses[8], rtol=0, atol=1e-5)


def test_lm_step_at_512_cores_writes_some_transposes_as_reshapes_and_is_otherwise_equal(
    programs):
  """At 512 cores a core holds one head, and the fused attention's slice function writes
  the transposes that then only move dims of size 1 as reshapes (one op for one, with
  the speed layer's vectorizer; TF's pfor, with the layer off, also drops the ops that
  permuted each transpose's axes)."""
  kinds, _ = programs
  assert sum(kinds[8].values()) == sum(kinds[512].values())
  moves = lambda k: k["Transpose"] + k["Reshape"]
  assert moves(kinds[512]) == moves(kinds[8])
  assert +(kinds[512] - kinds[8]) <= collections.Counter(Reshape=moves(kinds[8]))
  assert {t: n for t, n in kinds[512].items() if t not in ("Transpose", "Reshape")} == {
      t: n for t, n in kinds[8].items() if t not in ("Transpose", "Reshape")}
