"""Task prompts (HyperPrompt, MTL-Prompt) against plain TF with the same weights.

SelfAttention(use_hyperprompt=True) and attention.concat_hyper_prompts_kv run on one
device and on a dp+mp layout of a 2x4 mesh (placement and SIMD emulation); the output
and the gradients (input, k and v, every variable) are compared with the same
computation written in TF from the variables' values: each example's task prompts,
made by the hypernetwork or learned per task, prepended to the keys and values and
visible to every query.
"""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import MtfError
from models.transformer import attention
from models.transformer import transformer_layers as tl
from models.transformer.context import Context, ModeKeys
from test_transformer_layers import (BATCH, CAUSAL, D_KV, D_MODEL, ENCODER, HEADS, LENGTH,
                                     SCOPE, batch_dim, causal_mask, check_against_tf, _impl,
                                     _x)
from test_zoo_attention_variants import run

TASKS, PROMPT, HIDDEN = 3, 2, 5
# The first id of each example's inputs is its task.
INPUTS = np.array([[2, 5, 6, 7, 1, 0, 0, 0], [0, 4, 4, 1, 0, 0, 0, 0]], np.int32)
TASK_IDS = INPUTS[:, 0]
MESH, DP_MP = "rows:2;cols:4", "batch:rows;heads:cols"
IMPLS = [lambda: _impl("", ""), lambda: _impl(MESH, DP_MP),
         lambda: mtf.SimdMeshImpl(MESH, DP_MP)]
IMPL_IDS = ["single", "placement_dp_mp", "simd_dp_mp"]


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def ref_hyperprompt(embedding, down, up, global_prompt):
  """[task, prompt, heads, d_kv]: relu(P D_t) U_t with D_t, U_t from the embedding."""
  d = tf.einsum("th,hkr->tkr", embedding, down)
  u = tf.einsum("th,hrk->trk", embedding, up)
  h = tf.nn.relu(tf.einsum("lnk,tkr->tlnr", global_prompt, d))
  return tf.einsum("tlnr,trk->tlnk", h, u)


def ref_prompted_attention(x, wq, wk, wv, wo, prompt_k, prompt_v, task_ids, mask=None):
  """Attention in TF whose keys and values start with each example's task prompts."""
  q = tf.einsum("bld,dhk->bhlk", x, tf.reshape(wq, [D_MODEL, HEADS, D_KV]))
  k = tf.einsum("bmd,dhk->bhmk", x, tf.reshape(wk, [D_MODEL, HEADS, D_KV]))
  v = tf.einsum("bmd,dhk->bhmk", x, tf.reshape(wv, [D_MODEL, HEADS, D_KV]))
  select = lambda p: tf.transpose(tf.gather(p, task_ids), [0, 2, 1, 3])
  k = tf.concat([select(prompt_k), k], axis=2)
  v = tf.concat([select(prompt_v), v], axis=2)
  logits = tf.einsum("bhlk,bhmk->bhlm", q, k)
  if mask is not None:
    visible = np.concatenate([np.ones(mask.shape[:-1] + (PROMPT,), bool), mask], -1)
    logits += tf.where(visible, 0.0, -1e9)
  o = tf.einsum("bhlm,bhmk->bhlk", tf.nn.softmax(logits, axis=-1), v)
  return tf.einsum("bhlk,hkd->bld", o, tf.reshape(wo, [HEADS, D_KV, D_MODEL]))


def check(result, w, x, ref_fn, rtol=2e-5, atol=2e-5):
  """result (of run) against ref_fn(x, {short variable name: tf value}) in TF."""
  check_against_tf(result, w, x, lambda tf_x, tf_vars: ref_fn(
      tf_x, {n.split("/")[-1]: v for n, v in tf_vars.items()}), rtol, atol)


def _hyperprompt_layer(**kwargs):
  return tl.SelfAttention(num_heads=HEADS, key_value_size=D_KV, use_hyperprompt=True,
                          hyperprompt_hidden_dim=HIDDEN, hyperprompt_task_num=TASKS,
                          **kwargs)


def _inputs(name):
  length = mtf.Dimension("length", LENGTH)
  return lambda mesh: {name: mtf.import_tf_tensor(mesh, INPUTS, [batch_dim, length])}


def _hyperprompt_ref(v):
  return [ref_hyperprompt(v["task_embedding"], v["hyper_down_" + x], v["hyper_up_" + x],
                          v["hyperprompt_" + x]) for x in ("k", "v")]


@pytest.mark.parametrize("make_impl", IMPLS, ids=IMPL_IDS)
def test_encoder_self_attention_with_hyper_prompts_matches_tf(make_impl):
  """The encoder's layer reads the task from its inputs; no mask on the prompts."""
  x = _x()
  layer = _hyperprompt_layer(hyperprompt_length_encoder=PROMPT)
  result, w = run(layer, make_impl(), x, model=ENCODER, extra=_inputs("inputs"))
  shapes = {n.split("/")[-1] if "hyper" in n or "task" in n else n[len(SCOPE) + 1:]:
            v.shape for n, v in result.values.items()}
  assert shapes == {
      "SelfAttention/q": (D_MODEL, HEADS * D_KV), "SelfAttention/k": (D_MODEL, HEADS * D_KV),
      "SelfAttention/v": (D_MODEL, HEADS * D_KV), "SelfAttention/o": (HEADS * D_KV, D_MODEL),
      "task_embedding": (TASKS, HIDDEN), "hyper_down_k": (HIDDEN, D_KV, HIDDEN),
      "hyper_up_k": (HIDDEN, HIDDEN, D_KV), "hyper_down_v": (HIDDEN, D_KV, HIDDEN),
      "hyper_up_v": (HIDDEN, HIDDEN, D_KV), "hyperprompt_k": (PROMPT, HEADS, D_KV),
      "hyperprompt_v": (PROMPT, HEADS, D_KV)}

  def ref(x, v):
    return ref_prompted_attention(x, v["q"], v["k"], v["v"], v["o"], *_hyperprompt_ref(v),
                                  task_ids=TASK_IDS)
  check(result, w, x, ref)


@pytest.mark.parametrize("make_impl", IMPLS[:2], ids=IMPL_IDS[:2])
def test_decoder_self_attention_takes_the_task_of_the_encoder_inputs(make_impl):
  """The decoder's layer uses its prompt length, the encoder inputs' task and the
  causal mask on the memory after the prompts."""
  x = _x()
  layer = _hyperprompt_layer(hyperprompt_length_decoder=PROMPT,
                             hyperprompt_length_encoder=PROMPT + 3,
                             hyperprompt_mtlshare=True)
  result, w = run(layer, make_impl(), x, model=CAUSAL, extra=_inputs("encoder_inputs"))

  def ref(x, v):
    return ref_prompted_attention(x, v["q"], v["k"], v["v"], v["o"], *_hyperprompt_ref(v),
                                  task_ids=TASK_IDS, mask=causal_mask(LENGTH))
  check(result, w, x, ref)


def test_task_prompts_change_the_output_per_task():
  """Two tasks' prompts differ, so the same input gives different outputs."""
  x = np.broadcast_to(_x()[:1], _x().shape).copy()
  layer = _hyperprompt_layer(hyperprompt_length_encoder=PROMPT)
  result, _ = run(layer, _impl("", ""), x, model=ENCODER, extra=_inputs("inputs"))
  assert not np.allclose(result.out[0], result.out[1], atol=1e-4)


def _run_concat(make_impl, use_hyperprompt, prefix_hidden, mode=ModeKeys.EVAL):
  """concat_hyper_prompts_kv on random k, v [batch, heads, memory, d_kv] with
  context.task_id; returns (values, k/v out, their gradients) as numpy."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  memory = mtf.Dimension("memory_length", 4)
  heads, kv = mtf.Dimension("heads", HEADS), mtf.Dimension("d_kv", D_KV)
  shape = mtf.Shape([batch_dim, heads, memory, kv])
  rng = np.random.RandomState(3)
  k_np, v_np = [rng.normal(size=shape.to_integer_list).astype(np.float32)
                for _ in range(2)]
  k, v = [mtf.import_tf_tensor(mesh, a, shape) for a in (k_np, v_np)]
  context = Context(None, mesh, [batch_dim], mtf.Dimension("length", LENGTH),
                    mtf.VariableDType(tf.float32), mode=mode, shared_params={})
  context.task_id = mtf.import_tf_tensor(mesh, TASK_IDS, [batch_dim])
  with mtf.variable_scope("layer"):
    k2, v2, new_memory = attention.concat_hyper_prompts_kv(
        k, v, "encoder", use_hyperprompt, memory, TASKS, HEADS, prefix_hidden, kv,
        context, False, 0.0, PROMPT)
  assert new_memory == mtf.Dimension("memory_length", 4 + PROMPT)
  assert k2.shape == mtf.replace_dimensions(shape, memory, new_memory)
  variables = graph.trainable_variables
  ws = [rng.normal(size=t.shape.to_integer_list).astype(np.float32) for t in (k2, v2)]
  loss = mtf.reduce_sum(k2 * mtf.import_tf_tensor(mesh, ws[0], k2.shape)
                        + v2 * mtf.import_tf_tensor(mesh, ws[1], v2.shape))
  grads = mtf.gradients([loss], [k, v] + [var.outputs[0] for var in variables])
  lowering = mtf.Lowering(graph, {mesh: make_impl()})
  export = lambda t: lowering.export_to_tf_tensor(t).numpy()
  values = {var.name.split("/")[-1]: export(var.outputs[0]) for var in variables}
  return (values, [export(k2), export(v2)], [export(g) for g in grads], (k_np, v_np), ws)


@pytest.mark.parametrize("make_impl", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("use_hyperprompt,prefix_hidden",
                         [(True, HIDDEN), (False, HIDDEN), (False, None)],
                         ids=["hyperprompt", "mtlprompt_reparameterised", "mtlprompt"])
def test_concat_hyper_prompts_kv_matches_tf(make_impl, use_hyperprompt, prefix_hidden):
  values, outs, grads, (k_np, v_np), ws = _run_concat(make_impl, use_hyperprompt,
                                                      prefix_hidden)
  tf_vars = {n: tf.constant(a) for n, a in values.items()}
  if use_hyperprompt:
    expected_names = {"task_embedding", "hyper_down_k", "hyper_up_k", "hyper_down_v",
                      "hyper_up_v", "hyperprompt_k", "hyperprompt_v"}
  elif prefix_hidden:
    expected_names = {"mtlprompt_embedding", "mtlprompt_k_proj", "mtlprompt_v_proj"}
  else:
    expected_names = {"mtlprompt_k", "mtlprompt_v"}
  assert set(values) == expected_names
  tf_k, tf_v = tf.constant(k_np), tf.constant(v_np)
  with tf.GradientTape() as tape:
    tape.watch([tf_k, tf_v] + list(tf_vars.values()))
    if use_hyperprompt:
      prompts = _hyperprompt_ref(tf_vars)
    elif prefix_hidden:
      prompts = [tf.einsum("tlh,hnk->tlnk", tf_vars["mtlprompt_embedding"],
                           tf_vars["mtlprompt_%s_proj" % x]) for x in ("k", "v")]
    else:
      prompts = [tf_vars["mtlprompt_k"], tf_vars["mtlprompt_v"]]
    refs = [tf.concat([tf.transpose(tf.gather(p, TASK_IDS), [0, 2, 1, 3]), t], axis=2)
            for p, t in zip(prompts, [tf_k, tf_v])]
    loss = tf.reduce_sum(refs[0] * ws[0]) + tf.reduce_sum(refs[1] * ws[1])
  for got, ref in zip(outs, refs):
    np.testing.assert_allclose(got, ref.numpy(), rtol=2e-5, atol=2e-5)
  tf_grads = tape.gradient(loss, [tf_k, tf_v] + [tf_vars[n] for n in sorted(values)])
  got = grads[:2] + [grads[2:][i] for i in np.argsort(list(values))]
  for g, e, label in zip(got, tf_grads, ["k", "v"] + sorted(values)):
    np.testing.assert_allclose(g, tf.convert_to_tensor(e).numpy(), rtol=2e-5, atol=2e-5,
                               err_msg=label)


def test_mtlprompt_share_creates_the_hypernetwork_once():
  """With hyperprompt_mtlshare the second layer reuses the first one's hypernetwork
  and has only its own global prompts."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  context = Context(ENCODER, mesh, [batch_dim], mtf.Dimension("length", LENGTH),
                    mtf.VariableDType(tf.float32), shared_params={})
  context.task_id = mtf.import_tf_tensor(mesh, TASK_IDS, [batch_dim])
  x = mtf.import_tf_tensor(mesh, _x(), [batch_dim, mtf.Dimension("length", LENGTH),
                                        mtf.Dimension("d_model", D_MODEL)])
  for i in range(2):
    with mtf.variable_scope("layer_%d" % i):
      x = _hyperprompt_layer(hyperprompt_length_encoder=PROMPT,
                             hyperprompt_mtlshare=True).call(context, x)
  names = [v.name for v in graph.trainable_variables]
  assert sum("task_embedding" in n for n in names) == 1
  assert sum("hyper_down_k" in n for n in names) == 1
  assert sum(n.endswith("hyperprompt_k") for n in names) == 2


def test_missing_prompt_length_or_task_ids_is_named():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  context = Context(ENCODER, mesh, [batch_dim], mtf.Dimension("length", LENGTH),
                    mtf.VariableDType(tf.float32), shared_params={})
  x = mtf.import_tf_tensor(mesh, _x(), [batch_dim, mtf.Dimension("length", LENGTH),
                                        mtf.Dimension("d_model", D_MODEL)])
  with pytest.raises(MtfError, match="prompt_length is None.*hyperprompt_length_encoder"):
    with mtf.variable_scope("a"):
      _hyperprompt_layer(hyperprompt_length_decoder=PROMPT).call(context, x)
  with pytest.raises(MtfError, match="no task ids; set context.task_id"):
    with mtf.variable_scope("b"):
      _hyperprompt_layer(hyperprompt_length_encoder=PROMPT).call(context, x)
  assert not _hyperprompt_layer().supports_incremental_decoding
  with pytest.raises(MtfError, match="Synthesizer: use_hyperprompt"):
    tl.Synthesizer(use_hyperprompt=True)


def _prompted_bitransformer():
  """An encoder-decoder whose self-attention layers prepend task prompts (three
  tasks; the decoder's hypernetwork shared by its layers)."""
  from models.transformer import transformer  # pylint: disable=g-import-not-at-top

  def stack(layers):
    for i, layer in enumerate(layers):
      layer.set_name("block_000/layer_%03d" % i)
    return transformer.LayerStack(layers)
  prompts = dict(num_heads=HEADS, key_value_size=D_KV, use_hyperprompt=True,
                 hyperprompt_hidden_dim=HIDDEN, hyperprompt_task_num=TASKS,
                 hyperprompt_length_encoder=PROMPT, hyperprompt_length_decoder=PROMPT + 1)
  common = dict(d_model=D_MODEL, input_vocab_size=16, max_length=LENGTH, vocab_divisor=8)
  encoder = transformer.Unitransformer(
      layer_stack=stack([tl.SelfAttention(**prompts), tl.DenseReluDense(hidden_size=8)]),
      output_vocab_size=None, autoregressive=False, name="encoder", **common)
  decoder = transformer.Unitransformer(
      layer_stack=stack([tl.SelfAttention(hyperprompt_mtlshare=True, **prompts),
                         tl.SelfAttention(hyperprompt_mtlshare=True, **prompts),
                         tl.EncDecAttention(num_heads=HEADS, key_value_size=D_KV)]),
      output_vocab_size=16, autoregressive=True, name="decoder", **common)
  return transformer.Bitransformer(encoder, decoder)


def test_bitransformer_routes_each_example_to_its_task_prompts():
  """Trained through a Bitransformer, the task embeddings of the tasks in the batch get
  gradients and the absent task's none; the loss and every gradient, and a beam
  decode, are the same on one device and on a dp+mp placement mesh."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  model = _prompted_bitransformer()
  dims = [batch_dim, mtf.Dimension("length", LENGTH)]
  inputs = mtf.import_tf_tensor(mesh, INPUTS, dims)
  targets = mtf.import_tf_tensor(mesh, np.roll(INPUTS, 1, axis=1), dims)
  _, loss = model.call_simple(inputs, targets, compute_loss=True, mode=ModeKeys.EVAL)
  variables = graph.trainable_variables
  names = [v.name for v in variables]
  embeddings = [n for n in names if n.endswith("task_embedding")]
  # One for the encoder's layer, one shared by the decoder's two layers.
  assert embeddings == ["encoder/block_000/layer_000/SelfAttention/task_embedding",
                        "decoder/block_000/layer_000/SelfAttention/task_embedding"]
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  beams = model.decode(inputs, beam_size=2)
  results = []
  for impl in (_impl("", ""), _impl(MESH, DP_MP)):
    tf.random.set_seed(0)
    lowering = mtf.Lowering(graph, {mesh: impl})
    if results:  # the same weights as on one device
      for v in variables:
        lowering.variables[v].assign_full(results[0][2][v.name])
    export = lambda t, lowering=lowering: lowering.export_to_tf_tensor(t).numpy()
    results.append((export(loss), {n: export(g) for n, g in zip(names, grads)},
                    {v.name: lowering.variables[v].read_full() for v in variables},
                    export(beams)))
  (loss_1, grads_1, _, beams_1), (loss_8, grads_8, _, beams_8) = results
  np.testing.assert_allclose(loss_8, loss_1, rtol=1e-5)
  for n in names:
    np.testing.assert_allclose(grads_8[n], grads_1[n], rtol=1e-4, atol=1e-5, err_msg=n)
  np.testing.assert_array_equal(beams_8, beams_1)
  for n in embeddings:
    used = np.abs(grads_1[n]).sum(axis=1)
    assert used[TASK_IDS].min() > 0 and used[1] == 0, (n, used)
