"""ExpertsSelfAttention / ExpertsEncDecAttention (attention.ExpertsAttentionParams):
output and every gradient against plain TF on one device, and equal on a dp+mp layout of
a 2x4 mesh (experts split) with placement and SIMD emulation; MoE1D's experts-attention
mode and the errors."""
import collections

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import MtfError, ShapeError
from models.transformer import attention
from models.transformer import moe
from models.transformer import transformer_layers as tl
from models.transformer.context import Context, ModeKeys
from test_transformer_layers import (BATCH, CAUSAL, D_KV, D_MODEL, HEADS, LENGTH, SCOPE,
                                     batch_dim, causal_mask, check_against_reference,
                                     _impl, _x)
from test_zoo_attention_variants import (ENCODER_MASK, MEMORY, encoder_output, run,
                                         shapes, simd, with_encoder)

EXPERTS, HIDDEN = 4, 6
# Eval routing is the router's argmax; a capacity of the whole group drops no token.
TOY = dict(num_experts=EXPERTS, hidden_size=HIDDEN, group_size=8, capacity_factor_eval=4.0,
           min_expert_capacity=1, num_heads=HEADS, key_value_size=D_KV, shared_kv=True)
DP_MP = "batch:rows;heads:cols;experts:cols"
MESH = "rows:2;cols:4"
# The MoE makes its number of groups a multiple of the mesh dim splitting the batch.
Model = collections.namedtuple("Model", ["fully_autoregressive", "autoregressive",
                                         "model_dim", "layout", "mesh_shape"])
MOE_CAUSAL = Model(True, True, D_MODEL, DP_MP, MESH)


def one_device():
  return _impl("", "")


def placement():
  return _impl(MESH, DP_MP)


def simd_dp_mp():
  return simd(DP_MP)


def ref_experts(x, wg, wi, wos):
  """Switch top-1 experts (no token dropped) in TF: x [b, l, d] -> one [b, l, out] per
  output kernel of wos, gate times the chosen expert's relu(x wi) wo."""
  probs = tf.nn.softmax(tf.einsum("bld,de->ble", x, wg), axis=-1)
  chosen = tf.one_hot(tf.argmax(probs, axis=-1), EXPERTS) * probs
  h = tf.nn.relu(tf.einsum("bld,edh->bleh", x, wi))
  return [tf.einsum("bleh,eho,ble->blo", h, wo, chosen) for wo in wos]


def ref_experts_attention(x, v, name, computation="qkv", memory=None, mask=None):
  """The layer in TF from its variables v (short names "<name>_<var>")."""
  p = lambda n: v[name + "_" + n]
  memory = x if memory is None else memory
  experts = lambda t, wos: ref_experts(t, p("switch_gating_kernel"), p("wi_kernel"), wos)
  if computation == "qkv":
    q = experts(x, [p("q_wo_kernel")])[0]
    kv = experts(memory, [p("k_wo_kernel")])[0]
  elif computation == "q":
    q = experts(x, [p("wo_kernel")])[0]
    kv = tf.einsum("bmd,dk->bmk", memory, p("kv"))
  else:
    q = tf.einsum("bld,dk->blk", x, p("q"))
    kv = experts(memory, [p("wo_kernel")])[0]
  split = lambda t: tf.reshape(t, t.shape[:2] + [HEADS, D_KV])
  logits = tf.einsum("blhk,bmhk->bhlm", split(q), split(kv))
  if mask is not None:
    logits += tf.where(mask, 0.0, -1e9)
  o = tf.einsum("bhlm,bmhk->blhk", tf.nn.softmax(logits, axis=-1), split(kv))
  return tf.einsum("blhk,hkd->bld", o, tf.reshape(p("o"), [HEADS, D_KV, D_MODEL]))


def expected_shapes(computation):
  """The variables' shapes: with one projection by experts, their output is "wo"."""
  out = {"switch_gating/kernel": (D_MODEL, EXPERTS), "wi/kernel": (EXPERTS, D_MODEL, HIDDEN),
         "o": (HEADS * D_KV, D_MODEL)}
  expert_out = (EXPERTS, HIDDEN, HEADS * D_KV)
  if computation == "qkv":
    out.update({"q_wo/kernel": expert_out, "k_wo/kernel": expert_out})
  else:
    out["wo/kernel"] = expert_out
    out["kv" if computation == "q" else "q"] = (D_MODEL, HEADS * D_KV)
  return out


def _run_all(layer_fn, x, impls=(one_device, placement, simd_dp_mp), **kwargs):
  """The layer lowered on one device, placement and SIMD (dp+mp, experts split)."""
  return [run(layer_fn(), impl(), x, model=MOE_CAUSAL, **kwargs) for impl in impls]


def _check_layouts_agree(results):
  (base, _), others = results[0], results[1:]
  for result, _ in others:
    np.testing.assert_allclose(result.out, base.out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.dx, base.dx, rtol=1e-5, atol=1e-5)
    for n in base.grads:
      np.testing.assert_allclose(result.grads[n], base.grads[n], rtol=1e-5, atol=1e-5,
                                 err_msg=n)
    np.testing.assert_allclose(result.losses, base.losses, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("computation", ["qkv", "q", "kv"])
def test_experts_self_attention_matches_tf(computation):
  x = _x(31)
  layer_fn = lambda: tl.ExpertsSelfAttention(expert_computation=computation, **TOY)
  impls = (one_device, placement) + ((simd_dp_mp,) if computation == "qkv" else ())
  results = _run_all(layer_fn, x, impls)
  result, w = results[0]
  assert shapes(result, "ExpertsSelfAttention") == expected_shapes(computation)
  # One balancing loss, positive (one MoE call for queries and keys/values).
  assert len(result.losses) == 1 and result.losses[0] > 0
  mask = causal_mask(LENGTH)
  for r, w in results:
    check_against_reference(r, w, x, lambda x, **v: ref_experts_attention(
        x, v, "ExpertsSelfAttention", computation, mask=mask), rtol=1e-4, atol=1e-4)
  _check_layouts_agree(results)


def test_experts_enc_dec_attention_routes_the_encoder_output():
  x = _x(32)
  layer_fn = lambda: tl.ExpertsEncDecAttention(**TOY)
  results = _run_all(layer_fn, x, extra=with_encoder())
  result, _ = results[0]
  assert shapes(result, "ExpertsEncDecAttention") == expected_shapes("qkv")
  assert len(result.losses) == 2  # the decoder's and the encoder's tokens
  memory = tf.constant(encoder_output())
  for r, w in results:
    check_against_reference(r, w, x, lambda x, **v: ref_experts_attention(
        x, v, "ExpertsEncDecAttention", memory=memory, mask=ENCODER_MASK),
                            rtol=1e-4, atol=1e-4)
  _check_layouts_agree(results)


def test_moe1d_experts_attention_returns_queries_and_keys():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = _x(33)
  length = mtf.Dimension("length", LENGTH)
  x_mtf = mtf.import_tf_tensor(mesh, x, [batch_dim, length, mtf.Dimension("d_model",
                                                                          D_MODEL)])
  out_dim = mtf.Dimension("d_model", 12)
  layer = moe.MoE1D(num_experts=EXPERTS, hidden_size=HIDDEN, group_size=8,
                    capacity_factor_eval=4.0, min_expert_capacity=1, moe_gating="switch",
                    switch_policy_eval="argmax", output_dim=out_dim,
                    use_experts_attention=True)
  context = Context(CAUSAL, mesh, [batch_dim], length, mtf.VariableDType(tf.float32),
                    mode=ModeKeys.EVAL, losses=[])
  q, k = layer.call(context, x_mtf)
  assert q.shape.dims[-1] == out_dim and k.shape.dims[-1] == out_dim
  lowering = mtf.Lowering(graph, {mesh: one_device()})
  full = {v.name.split("/")[-2]: lowering.variables[v].read_full() for v in
          lowering.variables}
  ref_q, ref_k = ref_experts(tf.constant(x), full["switch_gating"], full["wi"],
                             [full["q_wo"], full["k_wo"]])
  chosen = np.argmax(np.einsum("bld,de->ble", x, full["switch_gating"].numpy()), -1)
  assert len(np.unique(chosen)) > 1, "the toy input should use several experts"
  np.testing.assert_allclose(lowering.export_to_tf_tensor(q).numpy(), ref_q.numpy(),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(k).numpy(), ref_k.numpy(),
                             rtol=1e-5, atol=1e-5)
  assert len(context.losses) == 1


def _params(**overrides):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  context = Context(CAUSAL, mesh, [batch_dim], mtf.Dimension("length", LENGTH),
                    mtf.VariableDType(tf.float32), mode=ModeKeys.EVAL, losses=[])
  heads, kv = mtf.Dimension("heads", HEADS), mtf.Dimension("d_kv", D_KV)
  d_model = mtf.Dimension("d_model", D_MODEL)
  kwargs = dict(query_input_dim=d_model, memory_input_dim=d_model, output_dim=d_model,
                key_dim=kv, value_dim=kv, query_heads_dims=[heads],
                memory_heads_dims=[heads], variable_dtype=context.variable_dtype,
                shared_kv=True, context=context,
                experts_hparams=tl.ExpertsSelfAttention(**TOY).experts_hparams)
  kwargs.update(overrides)
  return attention.ExpertsAttentionParams(mesh, **kwargs)


def test_experts_attention_errors_name_the_problem():
  with pytest.raises(MtfError, match="shared_kv"):
    _params(shared_kv=False)
  with pytest.raises(MtfError, match="combine_dims"):
    _params(combine_dims=False)
  with pytest.raises(MtfError, match="expert_computation 'qk'"):
    _params(expert_computation="qk")
  with pytest.raises(ShapeError, match="one size"):
    _params(memory_heads_dims=[])
  with pytest.raises(MtfError, match="expert_computation 'v'"):
    tl.ExpertsSelfAttention(expert_computation="v")
  assert _params(expert_computation="q").wkv is not None


def test_gin_binds_the_experts_layers():
  gin.clear_config()
  try:
    gin.parse_config(["transformer_layers.ExpertsSelfAttention.num_experts = 8",
                      "ExpertsEncDecAttention.expert_computation = 'kv'"])
    self_layer, enc_dec = tl.ExpertsSelfAttention(), tl.ExpertsEncDecAttention()
  finally:
    gin.clear_config()
  assert self_layer.experts_hparams.num_experts == 8
  assert enc_dec.expert_computation == "kv"
