"""The analytic cost model: FLOPs and memory per processor from shapes and layouts."""
import pytest

import mesh_tf as mtf
from mesh_tf import analysis
from models.mlp import model as mlp
from models.tiny_lm import config as lm_config
from models.tiny_lm import mtf_model as lm


def _mlp_cost(mesh_shape, layout, forward_only=False):
  m = mlp.MlpModel(batch_size=32, hidden_size=64)
  fetches = [m.loss] if forward_only else [m.loss] + m.update_ops
  return analysis.estimate_cost(m.graph, mesh_shape, layout, fetches=fetches)


def test_data_parallel_divides_flops_and_activations_not_weights():
  one = _mlp_cost("", "")
  dp = _mlp_cost("all:8", "batch:all")
  assert dp.flops_per_processor < one.flops_per_processor / 4
  assert dp.variable_bytes_per_processor == one.variable_bytes_per_processor
  # Forward activations are all batch-shaped; the backward adds weight-shaped gradients.
  one_fwd, dp_fwd = _mlp_cost("", "", True), _mlp_cost("all:8", "batch:all", True)
  assert dp_fwd.activation_bytes_per_processor * 8 == pytest.approx(
      one_fwd.activation_bytes_per_processor, rel=0.01)


def test_model_parallel_divides_the_weights():
  one = _mlp_cost("", "")
  mp = _mlp_cost("all:8", "hidden:all")
  # w1 [28,28,64] and w2 [64,10] are both split on hidden.
  assert mp.variable_bytes_per_processor * 8 == one.variable_bytes_per_processor
  assert one.variable_bytes_per_processor == (28 * 28 * 64 + 64 * 10) * 4


def test_einsum_flops_match_the_closed_form():
  m = mlp.MlpModel(batch_size=32, hidden_size=64)
  forward = [op for op in m.graph.operations
             if isinstance(op, mtf.EinsumOperation)][:2]
  for mesh_shape, layout, share in [("", "", 1), ("all:8", "batch:all", 8),
                                    ("rows:2;cols:4", "batch:rows;hidden:cols", 8),
                                    ("rows:2;cols:4", "batch:rows", 2)]:
    est = analysis.estimate_cost(m.graph, mesh_shape, layout, fetches=forward)
    # images*w1: 2*32*28*28*64; relu: 32*64; hidden*w2: 2*32*64*10.
    want = (2 * 32 * 28 * 28 * 64 + 32 * 64 + 2 * 32 * 64 * 10) / share
    assert est.flops_per_processor == pytest.approx(want), (mesh_shape, layout)


def test_optimizer_state_counted_apart_from_weights():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  d = mtf.Dimension("hidden", 64)
  mtf.get_variable(mesh, "w", [d])
  mtf.get_variable(mesh, "w_slot_v", [d], trainable=False)
  est = analysis.estimate_cost(graph, "all:8", "hidden:all")
  assert est.variable_bytes_per_processor == 64 * 4 // 8
  assert est.optimizer_bytes_per_processor == 64 * 4 // 8


def test_illegal_layout_raises_naming_the_tensor():
  c = lm_config.TinyLmConfig(num_layers=1, heads=8)
  m = lm.TinyLmModel(c)
  with pytest.raises(mtf.LayoutError, match="heads"):
    analysis.estimate_cost(m.graph, "all:8", "heads:all;d_kv:all")


def test_paper_scale_graph_is_costed_without_running():
  # A 1-layer LM with d_ff 65536 on 512 processors: only Python objects are built.
  c = lm_config.TinyLmConfig(batch=512, length=8, vocab=512, d_model=256, heads=64,
                             d_kv=16, d_ff=65536, num_layers=1)
  weights = {n: None for n in lm_config.weight_shapes(c)}
  m = lm.TinyLmModel(c, weights=weights)
  est = analysis.estimate_cost(m.graph, "b:16;m:32", "batch:b;d_ff:m;heads:m;vocab:m",
                               fetches=[m.loss] + m.update_ops)
  one = analysis.estimate_cost(m.graph, "", "", fetches=[m.loss] + m.update_ops)
  assert est.variable_bytes_per_processor < one.variable_bytes_per_processor / 20
  assert est.comm_bytes_per_processor > 0
