"""MoE1D and transformer_moe_layer_v1: routing against an independent numpy version,
layout independence (placement, SIMD emulation; the all-to-all), training inside a
Unitransformer, and errors naming the layer and dim."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from mesh_tf.errors import LayoutError, MtfError, ShapeError
from models.transformer import moe

D_MODEL = mtf.Dimension("d_model", 8)


def _hparams(**overrides):
  hp = moe.set_default_moe_hparams(moe.HParams())
  hp.set_hparam("moe_num_experts", 4)
  hp.set_hparam("moe_hidden_size", 16)
  hp.set_hparam("moe_group_size", 8)
  hp.set_hparam("moe_min_expert_capacity", 1)
  hp.set_hparam("moe_capacity_factor_train", 1.0)
  hp.set_hparam("moe_capacity_factor_eval", 1.0)
  hp.set_hparam("moe_second_policy_train", "all")
  hp.set_hparam("moe_second_policy_eval", "all")
  for name, value in overrides.items():
    hp.set_hparam(name, value)
  return hp


# ------------------------------------------------------------ the numpy reference
def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def np_top_2_routing(x, w_gate, capacity, policy="all", threshold=0.2, loss_coef=1e-2):
  """Routing of x [groups, group, d] written token by token.

  Returns (dispatch [g, s, e, c], combine [g, s, e, c], loss, first-choice counts
  attempted [g, e]).
  """
  groups, size, _ = x.shape
  num_experts = w_gate.shape[1]
  gates = _softmax(np.einsum("gsd,de->gse", x, w_gate).astype(np.float64))
  dispatch = np.zeros((groups, size, num_experts, capacity))
  combine = np.zeros_like(dispatch)
  first = gates.argmax(-1)
  density = np.zeros((groups, num_experts))
  for g in range(groups):
    for s in range(size):
      density[g, first[g, s]] += 1.0 / size
  loss = num_experts ** 2 * np.mean(density * gates.mean(1)) * loss_coef
  for g in range(groups):
    filled = np.zeros(num_experts, int)
    choices = []
    for s in range(size):
      order = np.argsort(-gates[g, s], kind="stable")
      e1, e2 = order[0], order[1]
      p1, p2 = gates[g, s, e1], gates[g, s, e2]
      p1, p2 = p1 / (p1 + p2 + 1e-9), p2 / (p1 + p2 + 1e-9)
      choices.append((s, e1, p1, e2, p2))
    for s, e1, p1, _, _ in choices:  # all first choices queue before second choices
      if filled[e1] < capacity:
        dispatch[g, s, e1, filled[e1]] = 1.0
        combine[g, s, e1, filled[e1]] = p1
      filled[e1] += 1
    filled = np.minimum(filled, capacity)
    for s, _, _, e2, p2 in choices:
      if policy == "none" or (policy == "threshold" and p2 <= threshold):
        continue
      if filled[e2] < capacity:
        dispatch[g, s, e2, filled[e2]] = 1.0
        combine[g, s, e2, filled[e2]] = p2
      filled[e2] += 1
  return dispatch, combine, loss


def np_experts(x, combine, dispatch, wi, wo):
  """Output [g, s, d] of relu experts given routing tensors and per-expert weights."""
  expert_in = np.einsum("gsd,gsec->egcd", x, dispatch)
  h = np.maximum(np.einsum("egcd,edh->egch", expert_in, wi), 0.0)
  expert_out = np.einsum("egch,eho->egco", h, wo)
  return np.einsum("egco,gsec->gso", expert_out, combine)


def _lower(graph, mesh, impl, tensors, weights=None):
  """Lowers on impl (assigning weights {variable name suffix: value} first)."""
  lowering = mtf.Lowering(graph, {mesh: impl})
  for v, laid in lowering.variables.items():
    for suffix, value in (weights or {}).items():
      if v.name.endswith(suffix):
        laid.assign_full(value)
  vals = [lowering.export_to_tf_tensor(t).numpy() for t in tensors]
  full = {v.name: lowering.variables[v].read_full().numpy() for v in lowering.variables}
  return vals, full, lowering


def _var(full, suffix):
  (name,) = [n for n in full if n.endswith(suffix)]
  return full[name]


# ------------------------------------------------------------ routing vs numpy
@pytest.mark.parametrize("policy", ["all", "threshold", "none"])
def test_top_2_gating_matches_numpy(policy):
  groups, size = mtf.Dimension("batch", 3), mtf.Dimension("group", 8)
  outer = mtf.Dimension("outer_batch", 1)
  experts, capacity = mtf.Dimension("expert_unsplit", 4), mtf.Dimension("expert_capacity", 2)
  x = np.random.RandomState(0).normal(size=(1, 3, 8, 8)).astype(np.float32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  hp = _hparams(moe_second_policy_eval=policy, moe_second_threshold_eval=0.3)
  xt = mtf.import_tf_tensor(mesh, x, [outer, groups, size, D_MODEL])
  dispatch, combine, loss = moe._top_2_gating(
      xt, None, experts, capacity, hp, train=False,
      variable_dtype=mtf.VariableDType(tf.float32))
  (d, c, l), full, _ = _lower(graph, mesh, mtf.PlacementMeshImpl("", "", [""]),
                              [dispatch, combine, loss])
  ref_d, ref_c, ref_l = np_top_2_routing(x[0], _var(full, "top_2_gating/kernel"), 2,
                                         policy=policy, threshold=0.3)
  np.testing.assert_allclose(d[0], ref_d, err_msg="dispatch")
  np.testing.assert_allclose(c[0], ref_c, rtol=1e-5, atol=1e-6, err_msg="combine")
  np.testing.assert_allclose(l, ref_l, rtol=1e-5, err_msg="balancing loss")
  per_expert = d[0].sum(axis=(1, 3))  # tokens each expert takes from each group
  assert per_expert.max() <= 2, per_expert
  assert np.all(d[0].sum(axis=1) <= 1), "two tokens in one expert slot"
  routed = d[0].sum(axis=(2, 3))
  if policy == "all":
    # 16 choices for 8 slots per group: some tokens must lose their second expert.
    assert routed.min() < 2 and routed.max() == 2, routed
  if policy == "none":
    assert routed.max() <= 1 and routed.min() == 0, "overflow should drop some tokens"


def test_switch_gating_matches_numpy():
  groups, size = mtf.Dimension("batch", 2), mtf.Dimension("group", 8)
  outer = mtf.Dimension("outer_batch", 1)
  experts, capacity = mtf.Dimension("expert_unsplit", 4), mtf.Dimension("expert_capacity", 2)
  x = np.random.RandomState(1).normal(size=(1, 2, 8, 8)).astype(np.float32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  xt = mtf.import_tf_tensor(mesh, x, [outer, groups, size, D_MODEL])
  dispatch, combine, loss = moe._switch_gating(
      xt, None, experts, capacity, _hparams(moe_switch_policy_eval="argmax"), train=False,
      variable_dtype=mtf.VariableDType(tf.float32))
  (d, c, l), full, _ = _lower(graph, mesh, mtf.PlacementMeshImpl("", "", [""]),
                              [dispatch, combine, loss])
  gates = _softmax(np.einsum("gsd,de->gse", x[0], _var(full, "switch_gating/kernel")))
  ref_d, ref_c = np.zeros_like(d[0]), np.zeros_like(c[0])
  for g in range(2):
    filled = [0] * 4
    for s in range(8):
      e = gates[g, s].argmax()
      if filled[e] < 2:
        ref_d[g, s, e, filled[e]] = 1.0
        ref_c[g, s, e, filled[e]] = gates[g, s, e]
      filled[e] += 1
  density = np.eye(4)[gates.argmax(-1)].mean(1)
  np.testing.assert_allclose(d[0], ref_d, err_msg="dispatch")
  np.testing.assert_allclose(c[0], ref_c, rtol=1e-5, atol=1e-6, err_msg="combine")
  np.testing.assert_allclose(l, 16 * np.mean(density * gates.mean(1)) * 1e-2, rtol=1e-5)


def test_layer_output_matches_numpy_experts():
  """transformer_moe_layer_v1 on [batch 2, length 16]: 4 groups of 8 tokens."""
  batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 16)
  x = np.random.RandomState(2).normal(size=(2, 16, 8)).astype(np.float32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  xt = mtf.import_tf_tensor(mesh, x, [batch, length, D_MODEL])
  y, loss = moe.transformer_moe_layer_v1(xt, D_MODEL, _hparams(), False,
                                         mtf.VariableDType(tf.float32))
  assert y.shape == xt.shape
  (got, got_loss), full, _ = _lower(graph, mesh, mtf.PlacementMeshImpl("", "", [""]),
                                    [y, loss])
  grouped = x.reshape(4, 8, 8)
  d, c, ref_loss = np_top_2_routing(grouped, _var(full, "top_2_gating/kernel"), 2)
  wi, wo = _var(full, "wi/kernel"), _var(full, "wo/kernel")
  assert wi.shape == (4, 8, 16) and wo.shape == (4, 16, 8)
  ref = np_experts(grouped, c, d, wi, wo).reshape(2, 16, 8)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got_loss, ref_loss, rtol=1e-5)
  dropped = d.sum(axis=(2, 3)) == 0
  np.testing.assert_allclose(got.reshape(4, 8, 8)[dropped], 0.0,
                             err_msg="a token routed nowhere must give zeros")


def test_expert_capacity_and_groups():
  assert moe.expert_capacity(1024, 1.25, 16, 4) == 80
  assert moe.expert_capacity(8, 1.0, 32, 4) == 4
  assert moe._split_into_groups(64, 8, 8) == (8, 8)
  assert moe._split_into_groups(64, 1024, 4) == (4, 16)
  assert moe._split_into_groups(48, 10, 1) == (4, 12)


# ------------------------------------------------------------ layout independence
# 128 tokens in 16 groups of 8: regrouping keeps the batch split (no allconcat).
BATCH8, LENGTH16 = mtf.Dimension("batch", 8), mtf.Dimension("length", 16)

LAYOUTS = [
    ("placement", "", ""),
    ("placement", "rows:2;cols:4", "batch:rows;experts:cols"),
    ("placement", "all:8", "batch:all;experts:all"),
    ("simd", "rows:2;cols:4", "batch:rows;experts:rows;expert_hidden:cols"),
]


def _moe_graph(layout, mesh_shape, x, w_out):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  xt = mtf.import_tf_tensor(mesh, x, [BATCH8, LENGTH16, D_MODEL])
  hp = _hparams(moe_num_experts=8, moe_second_policy_train="random",
                moe_second_threshold_train=0.2, moe_capacity_factor_train=1.5)
  y, loss = moe.transformer_moe_layer_v1(xt, D_MODEL, hp, True,
                                         mtf.VariableDType(tf.float32), layout=layout,
                                         mesh_shape=mesh_shape)
  objective = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, w_out, y.shape)) + loss
  variables = graph.trainable_variables
  grads = mtf.gradients([objective], [xt] + [v.outputs[0] for v in variables])
  return graph, mesh, [y, loss] + grads, [v.name for v in variables]


def test_outputs_and_gradients_do_not_depend_on_layout():
  rng = np.random.RandomState(3)
  x = rng.normal(size=(8, 16, 8)).astype(np.float32)
  w_out = rng.normal(size=(8, 16, 8)).astype(np.float32)
  weights = None
  results = []
  for backend, mesh_shape, layout in LAYOUTS:
    graph, mesh, fetches, names = _moe_graph(layout, mesh_shape, x, w_out)
    vals, full, lowering = _lower(graph, mesh, mtf_testing.backend_mesh_impl(backend, mesh_shape, layout),
                                  fetches, weights)
    if weights is None:  # every layout runs with the first one's initial weights
      weights = {n: full[n] for n in names}
    results.append((backend, mesh_shape, layout, vals, lowering))
  labels = ["output", "loss", "d/d inputs", "d/d gate", "d/d wi", "d/d wo"]
  _, _, _, ref, _ = results[0]
  assert np.abs(ref[0]).max() > 0 and ref[1] > 0
  for backend, mesh_shape, layout, vals, _ in results[1:]:
    for label, got, want in zip(labels, vals, ref):
      np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5, err_msg="%s on %s %s %s" % (
          label, backend, mesh_shape, layout))
  summaries = {(b, m, l): lw.communication_summary() for b, m, l, _, lw in results}
  assert ("alltoall", "all") in summaries[LAYOUTS[2]], summaries[LAYOUTS[2]]
  assert ("alltoall", "rows") in summaries[LAYOUTS[3]], summaries[LAYOUTS[3]]
  assert not any(k[0] == "alltoall" for k in summaries[LAYOUTS[1]]), summaries[LAYOUTS[1]]
  for layout in LAYOUTS[2:]:  # tokens and experts on one mesh dim: nothing is gathered
    assert not any(k[0] == "allconcat" for k in summaries[layout]), summaries[layout]


def test_padding_tokens_are_not_routed_and_leave_the_loss():
  batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 8)
  x = np.random.RandomState(4).normal(size=(2, 8, 8)).astype(np.float32)
  nonpad = np.ones((2, 8), np.float32)
  nonpad[0, 5:] = 0.0
  nonpad[1, 7:] = 0.0
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  xt = mtf.import_tf_tensor(mesh, x, [batch, length, D_MODEL])
  y, loss = moe.transformer_moe_layer_v1(
      xt, D_MODEL, _hparams(moe_capacity_factor_eval=4.0), False,
      mtf.VariableDType(tf.float32),
      nonpadding=mtf.import_tf_tensor(mesh, nonpad, [batch, length]))
  (got, got_loss), full, _ = _lower(graph, mesh, mtf.PlacementMeshImpl("", "", [""]),
                                    [y, loss])
  np.testing.assert_allclose(got[nonpad == 0], 0.0, err_msg="padding got an expert output")
  assert np.all(np.abs(got[nonpad == 1]).sum(-1) > 0)
  gates = _softmax(np.einsum("gsd,de->gse", x, _var(full, "top_2_gating/kernel")))
  real = nonpad[..., None]
  density = (np.eye(4)[gates.argmax(-1)] * real).mean(1)
  proxy = (gates * real).mean(1)
  np.testing.assert_allclose(got_loss, 16 * np.mean(density * proxy) * 1e-2, rtol=1e-5)


# ------------------------------------------------------------ inside a Unitransformer
VOCAB = 16


def _lm(moe_layer, layout=None, mesh_shape=None):
  from models.transformer import transformer, transformer_layers  # pylint: disable=g-import-not-at-top
  attention = transformer_layers.SelfAttention(num_heads=2, key_value_size=8)
  attention.set_name("block_000/layer_000")
  moe_layer.set_name("block_000/layer_001")
  return transformer.Unitransformer(
      layer_stack=transformer.LayerStack([attention, moe_layer]), d_model=16,
      input_vocab_size=VOCAB, output_vocab_size=VOCAB, autoregressive=True, max_length=8,
      vocab_divisor=8, layout=layout, mesh_shape=mesh_shape, z_loss=0.0)


def _lm_graph(moe_layer, targets, mode, layout=None, mesh_shape=None):
  from models.transformer import transformer  # pylint: disable=g-import-not-at-top
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  dims = [mtf.Dimension("batch", targets.shape[0]), mtf.Dimension("length", 8)]
  ids = mtf.import_tf_tensor(mesh, tf.TensorSpec(targets.shape, tf.int32), dims)
  _, loss = _lm(moe_layer, layout, mesh_shape).call_simple(
      transformer.autoregressive_inputs(ids), ids, True, mode=mode)
  return graph, mesh, ids, loss


def _lm_targets(batch):
  rng = np.random.RandomState(5)
  return rng.randint(2, VOCAB, size=(batch, 8)).astype(np.int32)


def test_moe_lm_trains_with_experts_split_like_the_batch():
  from models.transformer.context import ModeKeys  # pylint: disable=g-import-not-at-top
  layout, mesh_shape = "batch:all;experts:all", "all:4"
  targets = _lm_targets(4)
  layer = moe.MoE1D(num_experts=4, hidden_size=16, group_size=8, min_expert_capacity=1)
  graph, mesh, ids, loss = _lm_graph(layer, targets, ModeKeys.TRAIN, layout, mesh_shape)
  names = sorted(v.name for v in graph.trainable_variables)
  assert "transformer/block_000/layer_001/MoE1D/wi/kernel" in names, names
  assert "transformer/block_000/layer_001/MoE1D/top_2_gating/kernel" in names, names
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = mtf.optimize.AdafactorOptimizer(learning_rate=0.05, decay_rate=0.8).apply_grads(
      grads, variables)
  impl = mtf_testing.backend_mesh_impl("placement", mesh_shape, layout)
  summaries, losses = [], []
  for _ in range(5):  # eagerly: tracing this graph costs more than a few eager steps
    lowering = mtf.Lowering(graph, {mesh: impl}, feeds={ids: tf.constant(targets)})
    losses.append(float(lowering.export_to_tf_tensor(loss)))
    for op in updates:
      lowering.lowered_operation(op)
    summaries.append(lowering.communication_summary())
  assert np.all(np.isfinite(losses))
  assert losses[-1] < 0.7 * losses[0], losses
  assert ("alltoall", "all") in summaries[0], summaries[0]


def test_moe_loss_reaches_the_model_loss():
  """The model loss minus the same model's loss with loss_coef=0 is the MoE loss."""
  from models.transformer.context import ModeKeys  # pylint: disable=g-import-not-at-top
  tf.random.set_seed(0)  # the initial weights, whatever ran before in this process
  targets = _lm_targets(2)
  values = []
  weights = None
  for coef in (0.0, 1.0):
    layer = moe.MoE1D(num_experts=4, hidden_size=16, group_size=8, loss_coef=coef,
                      second_policy_eval="all")
    graph, mesh, ids, loss = _lm_graph(layer, targets, ModeKeys.EVAL)
    lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", [""])},
                            feeds={ids: tf.constant(targets)})
    if weights is None:
      weights = {v.name: lowering.variables[v].read_full() for v in lowering.variables}
    for v, laid in lowering.variables.items():
      laid.assign_full(weights[v.name])
    values.append(float(lowering.export_to_tf_tensor(loss)))
  # A freshly initialized router is near uniform: balance loss close to 1.
  assert 0.7 < values[1] - values[0] < 1.5, values


# ------------------------------------------------------------ bad input
def _context(model_dim=D_MODEL, layout=None, mesh_shape=None):
  from models.transformer.context import Context  # pylint: disable=g-import-not-at-top

  class _Model:
    pass
  model = _Model()
  model.model_dim, model.layout, model.mesh_shape = model_dim, layout, mesh_shape
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  batch, length = mtf.Dimension("batch", 4), mtf.Dimension("length", 8)
  ctx = Context(model, mesh, [batch], length, mtf.VariableDType(tf.float32), losses=[])
  x = mtf.import_tf_tensor(mesh, np.zeros((4, 8, 8), np.float32), [batch, length, D_MODEL])
  return ctx, x, graph, mesh


def test_moe1d_call_adds_its_loss_to_context_and_keeps_shape():
  ctx, x, graph, mesh = _context()
  with mtf.variable_scope("layer"):
    y = moe.MoE1D(num_experts=4, hidden_size=8, group_size=8).call(ctx, x)
  assert y.shape == x.shape and len(ctx.losses) == 1
  assert ctx.losses[0].shape.ndims == 0


def test_experts_not_divisible_by_their_mesh_dim_names_layer_and_dim():
  ctx, x, _, _ = _context(layout="batch:rows;experts:cols", mesh_shape="rows:2;cols:4")
  with mtf.variable_scope("block_000/layer_001/MoE1D"):
    with pytest.raises(LayoutError, match="MoE1D.*num_experts=6.*cols.*experts:cols"):
      moe.MoE1D(num_experts=6, hidden_size=8, group_size=8).call(ctx, x)


def test_experts_not_divisible_at_lowering_names_the_tensor_dim():
  ctx, x, graph, mesh = _context()
  moe.MoE1D(num_experts=6, hidden_size=8, group_size=8).call(ctx, x)
  impl = mtf_testing.backend_mesh_impl("placement", "rows:2;cols:4", "experts:cols")
  with pytest.raises(LayoutError, match="experts"):
    mtf.Lowering(graph, {mesh: impl})


@pytest.mark.parametrize("hidden_size", [None, 0])
def test_missing_hidden_dim_names_layer_and_dim(hidden_size):
  ctx, x, _, _ = _context()
  with mtf.variable_scope("my_moe"):
    with pytest.raises(ShapeError, match="my_moe.*expert hidden dim.*%r" % hidden_size):
      moe.MoE1D(num_experts=4, hidden_size=hidden_size).call(ctx, x)


def test_tokens_not_divisible_into_mesh_groups():
  ctx, x, _, _ = _context(layout="batch:all", mesh_shape="all:64")
  with mtf.variable_scope("moe_x"):
    with pytest.raises(LayoutError, match="moe_x: 32 tokens.*64 groups"):
      moe.MoE1D(num_experts=4, hidden_size=8).call(ctx, x)


@pytest.mark.parametrize("kwargs,match", [
    (dict(moe_gating="top_3"), "unknown moe_gating 'top_3'"),
    (dict(second_policy_eval="sometimes"), "second-expert policy 'sometimes'"),
    (dict(moe_gating="switch", switch_policy_eval="coin"), "switch policy 'coin'"),
])
def test_unknown_gating_or_policy(kwargs, match):
  ctx, x, _, _ = _context()
  ctx.mode = "eval"
  with pytest.raises(MtfError, match=match):
    moe.MoE1D(num_experts=4, hidden_size=8, **kwargs).call(ctx, x)


def test_hparams_add_and_set():
  hp = moe.HParams(a=1)
  hp.add_hparam("b", 2)
  assert hp.values() == {"a": 1, "b": 2} and "b" in hp
  with pytest.raises(MtfError, match="'a' already exists"):
    hp.add_hparam("a", 3)
  with pytest.raises(MtfError, match="no hyperparameter 'c'"):
    hp.set_hparam("c", 3)


def test_moe1d_without_length_dim_as_in_incremental_decoding():
  ctx, x, graph, mesh = _context()
  one = mtf.reduce_sum(x, reduced_dim=ctx.length_dim) + mtf.range(mesh, D_MODEL, tf.float32)
  y = moe.MoE1D(num_experts=4, hidden_size=8, group_size=8).call(ctx, one)
  assert y.shape == one.shape
  (got,), _, _ = _lower(graph, mesh, mtf.PlacementMeshImpl("", "", [""]), [y])
  assert np.abs(got).sum() > 0


def test_gin_configures_moe1d_by_its_original_names():
  import gin  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    gin.parse_config(["moe.MoE1D.num_experts = 8", "MoE1D.hidden_size = 32",
                      "moe.MoE1D.moe_gating = 'switch'"])
    layer = gin.get_configurable("moe.MoE1D")()
    assert isinstance(layer, moe.MoE1D)
    hp = layer.hparams
    assert (hp.moe_num_experts, hp.moe_hidden_size, hp.moe_gating) == (8, 32, "switch")
  finally:
    gin.clear_config()
