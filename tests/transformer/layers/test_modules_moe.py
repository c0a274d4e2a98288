"""MoE2D / transformer_moe_layer_v2, the router reading token embeddings, and MoE1D's
original parameter order: forward and every gradient against plain TF on one device
(routing decisions written token by token in numpy, gates differentiable in TF), and
layout independence on placement (rows:2;cols:4) and SIMD emulation."""
import inspect

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from mesh_tf.errors import MtfError, ShapeError
from models.transformer import moe

D_MODEL = mtf.Dimension("d_model", 8)
BATCH, LENGTH = mtf.Dimension("batch", 4), mtf.Dimension("length", 8)


def tf_top_2(x, w, capacity, importance=None, loss_coef=1e-2):
  """Top-2 routing (second policy "all") of x [groups, group, d] with kernel w [d, e].

  The choices and buffer positions are found token by token in numpy; the gates and the
  loss stay TF functions of x and w. Returns (dispatch (numpy), combine, loss).
  """
  gates = tf.nn.softmax(tf.einsum("gsd,de->gse", x, w), axis=-1)
  g = gates.numpy()
  groups, size, experts = g.shape
  imp = np.ones((groups, size)) if importance is None else importance
  real_1, real_2 = (imp == 1.0).astype(np.float32), (imp > 0).astype(np.float32)
  eye = np.eye(experts, dtype=np.float32)
  mask_1 = eye[g.argmax(-1)] * real_1[..., None]
  mask_2 = eye[(g * (1.0 - mask_1)).argmax(-1)] * real_2[..., None]
  gate_1 = tf.reduce_sum(gates * mask_1, -1)
  gate_2 = tf.reduce_sum(gates * eye[(g * (1.0 - mask_1)).argmax(-1)], -1)
  denom = gate_1 + gate_2 + 1e-9
  slot_1 = np.zeros((groups, size, experts, capacity), np.float32)
  slot_2 = np.zeros_like(slot_1)
  for gi in range(groups):
    filled = np.zeros(experts, int)
    for mask, slot in ((mask_1, slot_1), (mask_2, slot_2)):
      for s in range(size):
        if mask[gi, s].any():
          e = mask[gi, s].argmax()
          if filled[e] < capacity:
            slot[gi, s, e, filled[e]] = 1.0
          filled[e] += 1
      filled = np.minimum(filled, capacity)
  combine = ((gate_1 / denom)[..., None, None] * slot_1 +
             (gate_2 / denom)[..., None, None] * slot_2)
  density = mask_1.mean(1)
  proxy = tf.reduce_mean(gates * real_1[..., None], 1)
  loss = experts ** 2 * tf.reduce_mean(density * proxy) * loss_coef
  return slot_1 + slot_2, combine, loss


def _hparams(**overrides):
  hp = moe.set_default_moe_hparams(moe.HParams())
  values = dict(moe_num_experts=[2, 4], moe_hidden_size=8, moe_group_size=8,
                moe_min_expert_capacity=1, moe_capacity_factor_train=1.0,
                moe_capacity_factor_eval=1.0, moe_capacity_factor_second_level=1.0,
                moe_second_policy_train="all", moe_second_policy_eval="all")
  values.update(overrides)
  for name, value in values.items():
    hp.set_hparam(name, value)
  return hp


def _run(build, x, impl, weights=None, seed=7):
  """Builds y, loss = build(x_mtf), lowers on impl with the given weights, and returns
  ({value name: numpy}, full variable values). Gradients are of sum(y * w) + loss."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  xt = mtf.import_tf_tensor(mesh, x, [BATCH, LENGTH, D_MODEL])
  y, loss = build(xt)
  w = np.random.RandomState(seed).normal(size=x.shape).astype(np.float32)
  objective = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, w, y.shape)) + loss
  variables = graph.trainable_variables
  grads = mtf.gradients([objective], [xt] + [v.outputs[0] for v in variables])
  lowering = mtf.Lowering(graph, {mesh: impl})
  for v, laid in lowering.variables.items():
    if weights is not None:
      laid.assign_full(weights[v.name])
  out = lambda t: lowering.export_to_tf_tensor(t).numpy()
  values = {"y": out(y), "loss": out(loss), "dx": out(grads[0])}
  values.update({"d/" + v.name: out(g) for v, g in zip(variables, grads[1:])})
  full = {v.name: lowering.variables[v].read_full().numpy() for v in lowering.variables}
  return values, full, w


def _var(full, suffix):
  (name,) = [n for n in full if n.endswith(suffix)]
  return name


def _check_against_tf(values, full, x, w, reference):
  """reference(x, {variable name: tf value}) -> (y, loss); compares all of values."""
  tf_x = tf.constant(x)
  tf_vars = {n: tf.constant(v) for n, v in full.items()}
  with tf.GradientTape() as tape:
    tape.watch([tf_x] + list(tf_vars.values()))
    y, loss = reference(tf_x, tf_vars)
    objective = tf.reduce_sum(y * w) + loss
  np.testing.assert_allclose(values["y"], y.numpy(), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(values["loss"], loss.numpy(), rtol=1e-5)
  names = sorted(tf_vars)
  grads = tape.gradient(objective, [tf_x] + [tf_vars[n] for n in names],
                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
  np.testing.assert_allclose(values["dx"], grads[0].numpy(), rtol=1e-4, atol=1e-5,
                             err_msg="d/dx")
  for n, g in zip(names, grads[1:]):
    np.testing.assert_allclose(values["d/" + n], g.numpy(), rtol=1e-4, atol=1e-5,
                               err_msg="d/" + n)


# ------------------------------------------------------------------ two-level MoE
def _v2(hp, layout=None, mesh_shape=None):
  def build(xt):
    return moe.transformer_moe_layer_v2(xt, D_MODEL, hp, False,
                                        mtf.VariableDType(tf.float32), layout=layout,
                                        mesh_shape=mesh_shape)
  return build


def tf_moe_v2(x, v, capacity_x, capacity_y):
  """The two-level layer in TF on x [batch, length, d] (4 groups of 8 tokens)."""
  w_outer, w_inner = v[_var(v, "outer_gating/kernel")], v[_var(v, "inner_gating/kernel")]
  wi, wo = v[_var(v, "wi/kernel")], v[_var(v, "wo/kernel")]
  xg = tf.reshape(x, [4, 8, 8])
  dispatch_x, combine_x, loss_outer = tf_top_2(xg, w_outer, capacity_x)
  block_in = tf.einsum("gsm,gsxc->xgcm", xg, dispatch_x)
  slot_gate = tf.einsum("gsxc->xgc", combine_x).numpy()
  importance = 0.5 * ((slot_gate > 0.5).astype(np.float32) + (slot_gate > 0.0))
  routed = [tf_top_2(block_in[b], w_inner[b], capacity_y, importance[b])
            for b in range(w_inner.shape[0])]
  dispatch_y = np.stack([r[0] for r in routed])
  combine_y = tf.stack([r[1] for r in routed])
  loss_inner = tf.reduce_mean(tf.stack([r[2] for r in routed]))
  expert_in = tf.einsum("xgcm,xgcyd->xygdm", block_in, dispatch_y)
  h = tf.nn.relu(tf.einsum("xygdm,xymh->xygdh", expert_in, wi))
  expert_out = tf.einsum("xygdh,xyhn->xygdn", h, wo)
  block_out = tf.einsum("xygdn,xgcyd->xgcn", expert_out, combine_y)
  y = tf.einsum("xgcn,gsxc->gsn", block_out, combine_x)
  return tf.reshape(y, x.shape), loss_outer + loss_inner


V2_LAYOUTS = [
    ("placement", "rows:2;cols:4", "batch:rows;expert_x:rows;expert_y:cols"),
    ("simd", "rows:2;cols:4", "batch:rows;expert_x:rows;expert_hidden:cols"),
]


@pytest.fixture(scope="module")
def v2_single():
  x = np.random.RandomState(0).normal(size=(4, 8, 8)).astype(np.float32)
  values, full, w = _run(_v2(_hparams()), x, mtf_testing.backend_mesh_impl("placement", "", ""))
  return x, values, full, w


def test_moe_layer_v2_matches_tf(v2_single):
  x, values, full, w = v2_single
  shapes = {n.rsplit("/", 2)[-2]: v.shape for n, v in full.items()}
  assert shapes == {"outer_gating": (8, 2), "inner_gating": (2, 8, 4),
                    "wi": (2, 4, 8, 8), "wo": (2, 4, 8, 8)}, shapes
  # capacity_x = 8 * 1.0 / 2 = 4 tokens of a group per block; capacity_y = 4 / 4 = 1.
  _check_against_tf(values, full, x, w, lambda x, v: tf_moe_v2(x, v, 4, 1))
  assert np.abs(values["y"]).max() > 0


@pytest.mark.parametrize("backend,mesh_shape,layout", V2_LAYOUTS,
                         ids=["placement_dp_mp", "simd_dp_mp"])
def test_moe_layer_v2_does_not_depend_on_layout(v2_single, backend, mesh_shape, layout):
  x, ref, full, _ = v2_single
  got, _, _ = _run(_v2(_hparams(), layout, mesh_shape), x,
                   mtf_testing.backend_mesh_impl(backend, mesh_shape, layout), weights=full)
  for key in ref:
    np.testing.assert_allclose(got[key], ref[key], rtol=2e-4, atol=2e-5, err_msg=key)


def test_moe2d_layer_in_a_layer_stack_and_errors():
  from models.transformer.context import Context  # pylint: disable=g-import-not-at-top
  layer = moe.MoE2D(expert_x=2, expert_y=2, hidden_size=8, group_size=8,
                    capacity_factor_eval=1.0)
  assert layer.hparams.moe_num_experts == [2, 2]
  assert list(inspect.signature(moe.MoE2D).parameters)[:3] == [
      "expert_x", "expert_y", "loss_coef"]
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  xt = mtf.import_tf_tensor(mesh, np.ones((4, 8, 8), np.float32), [BATCH, LENGTH, D_MODEL])
  losses = []
  context = Context(None, mesh, [BATCH], LENGTH, mtf.VariableDType(tf.float32),
                    mode="eval", losses=losses)
  with mtf.variable_scope("block_000/layer_001"):
    y = layer.call(context, xt)
  assert y.shape == xt.shape and len(losses) == 1
  assert sorted(v.name for v in graph.trainable_variables) == [
      "block_000/layer_001/%s/kernel" % n for n in ("inner_gating", "outer_gating",
                                                    "wi", "wo")]
  with pytest.raises(MtfError, match=r"moe_num_experts must be \[expert_x, expert_y\]"):
    moe.transformer_moe_layer_v2(xt, D_MODEL, _hparams(moe_num_experts=4), False,
                                 mtf.VariableDType(tf.float32))
  with pytest.raises(mtf.LayoutError, match="expert_y"):
    moe.transformer_moe_layer_v2(xt, D_MODEL, _hparams(moe_num_experts=[2, 6]), False,
                                 mtf.VariableDType(tf.float32), layout="expert_y:cols",
                                 mesh_shape="rows:2;cols:4")
  gin.parse_config("moe.MoE2D.expert_y = 4")
  try:
    assert gin.get_configurable("moe.MoE2D")().hparams.moe_num_experts == [8, 4]
  finally:
    gin.clear_config()


# ------------------------------------------------------------ token embeddings
def _v1_with_embeddings(hp, embeddings):
  def build(xt):
    emb = mtf.import_tf_tensor(xt.mesh, embeddings, xt.shape)
    return moe.transformer_moe_layer_v1(xt, D_MODEL, hp, False,
                                        mtf.VariableDType(tf.float32),
                                        token_embeddings=emb)
  return build


@pytest.mark.parametrize("mode", ["add", "concat"])
def test_router_reads_token_embeddings(mode):
  rng = np.random.RandomState(1)
  x = rng.normal(size=(4, 8, 8)).astype(np.float32)
  emb = rng.normal(size=(4, 8, 8)).astype(np.float32)
  hp = _hparams(moe_num_experts=4, moe_word_embed_mode=mode)
  values, full, w = _run(_v1_with_embeddings(hp, emb), x, mtf_testing.backend_mesh_impl("placement", "", ""))
  assert full[_var(full, "top_2_gating/kernel")].shape == (
      (16, 4) if mode == "concat" else (8, 4))

  def reference(x, v):
    xg, eg = tf.reshape(x, [4, 8, 8]), tf.reshape(emb, [4, 8, 8])
    router_in = xg + eg if mode == "add" else tf.concat([xg, eg], -1)
    dispatch, combine, loss = tf_top_2(router_in, v[_var(v, "top_2_gating/kernel")], 2)
    expert_in = tf.einsum("gsd,gsec->egcd", xg, dispatch)
    h = tf.nn.relu(tf.einsum("egcd,edh->egch", expert_in, v[_var(v, "wi/kernel")]))
    out = tf.einsum("egch,eho->egco", h, v[_var(v, "wo/kernel")])
    return tf.reshape(tf.einsum("egco,gsec->gso", out, combine), x.shape), loss
  _check_against_tf(values, full, x, w, reference)
  got, _, _ = _run(_v1_with_embeddings(hp, emb), x,
                   mtf_testing.backend_mesh_impl("simd", "rows:2;cols:4", "batch:rows;experts:cols"), weights=full)
  for key in values:
    np.testing.assert_allclose(got[key], values[key], rtol=2e-4, atol=2e-5, err_msg=key)


def test_token_embedding_errors_name_the_layer():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  xt = mtf.import_tf_tensor(mesh, np.ones((4, 8, 8), np.float32), [BATCH, LENGTH, D_MODEL])
  hp = _hparams(moe_num_experts=4, moe_word_embed_mode="add")
  vdt = mtf.VariableDType(tf.float32)
  with mtf.variable_scope("layer_007"):
    with pytest.raises(MtfError, match="layer_007.*needs token_embeddings"):
      moe.transformer_moe_layer_v1(xt, D_MODEL, hp, False, vdt)
    short = mtf.import_tf_tensor(mesh, np.ones((4, 8), np.float32), [BATCH, LENGTH])
    with pytest.raises(ShapeError, match="token_embeddings"):
      moe.transformer_moe_layer_v1(xt, D_MODEL, hp, False, vdt, token_embeddings=short)
    hp.set_hparam("moe_word_embed_mode", "mul")
    with pytest.raises(MtfError, match="unknown moe_word_embed_mode 'mul'"):
      moe.transformer_moe_layer_v1(xt, D_MODEL, hp, False, vdt, token_embeddings=xt)


def test_moe1d_parameters_follow_the_original_order():
  names = list(inspect.signature(moe.MoE1D).parameters)
  assert names[11:14] == ["dropout_rate", "activation", "moe_gating"], names
  assert names[-4:] == ["word_embed_mode", "use_second_place_expert_prob",
                        "use_second_place_expert_prob_temp",
                        "top_n_num_experts_per_token"], names
  layer = moe.MoE1D(4, 1e-2, 16, 8, 1.0, 1.0, False, "all", "all", 0.2, 0.2, 0.0, "gelu")
  assert layer._activation == "gelu" and layer.hparams.moe_gating == "top_2"
  assert moe.MoE1D(word_embed_mode="add").hparams.moe_word_embed_mode == "add"
  with pytest.raises(MtfError, match="use_second_place_expert_prob"):
    moe.MoE1D(use_second_place_expert_prob=0.5)


def test_moe1d_in_a_unitransformer_routes_on_the_input_embeddings():
  from models.transformer import transformer  # pylint: disable=g-import-not-at-top
  layer = moe.MoE1D(num_experts=4, hidden_size=8, group_size=8, word_embed_mode="concat",
                    min_expert_capacity=1)
  layer.set_name("block_000/layer_000")
  model = transformer.Unitransformer(
      layer_stack=transformer.LayerStack([layer]), d_model=8, input_vocab_size=16,
      output_vocab_size=16, autoregressive=True, max_length=8, vocab_divisor=8)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  ids = mtf.import_tf_tensor(mesh, np.random.RandomState(2).randint(1, 16, size=(4, 8)),
                             [BATCH, LENGTH])
  logits, loss = model.call_simple(ids, ids, compute_loss=True, mode="eval")
  kernel = [v for v in graph.trainable_variables if v.name.endswith("gating/kernel")]
  assert [v.shape.to_integer_list for v in kernel] == [[16, 4]]
  lowering = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl("placement", "", "")})
  assert np.isfinite(lowering.export_to_tf_tensor(loss).numpy())
  assert lowering.export_to_tf_tensor(logits).numpy().shape == (4, 8, 16)
