"""fixup_layers: the Fixup initial values (zero last projections and scalars, scaled
variances), and, with random weights, forward and every gradient against plain TF on
one device and dp+mp layouts (placement, SIMD emulation); the fixup sublayers in a
LayerStack."""
import collections

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from test_transformer_layers import (  # pylint: disable=g-multiple-import
    CAUSAL, D_MODEL, LENGTH, SCOPE, Result, _x, batch_dim, causal_mask,
    check_against_reference, ref_attention)
from models.transformer import fixup_layers as fl
from models.transformer import transformer
from models.transformer.context import Context

CASES = [("placement", "", ""),
         ("placement", "rows:2;cols:4", "batch:rows;d_ff:cols;heads:cols"),
         ("simd", "rows:2;cols:4", "batch:rows;d_ff:cols")]
CASE_IDS = ["single", "placement_dp_mp", "simd_dp_mp"]
D_FF, HEADS, D_KV = 16, 4, 2


def run_with_random_weights(layer, impl, x, seed=3, encoder_output=None):
  """Like run_layer, but every variable is set to random values after lowering (the
  Fixup initial values zero the output); returns (Result, w, initial values)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  length = mtf.Dimension("length", x.shape[1])
  xt = mtf.import_tf_tensor(mesh, x, [batch_dim, length, mtf.Dimension("d_model", D_MODEL)])
  memory = None
  if encoder_output is not None:
    memory = mtf.import_tf_tensor(mesh, encoder_output, [
        batch_dim, mtf.Dimension("memory_length", encoder_output.shape[1]),
        mtf.Dimension("d_model", D_MODEL)])
  context = Context(CAUSAL, mesh, [batch_dim], length, mtf.VariableDType(tf.float32),
                    mode="eval", losses=[], encoder_output=memory)
  with mtf.variable_scope(SCOPE):
    y = layer.call(context, xt)
  variables = graph.trainable_variables
  w = np.random.RandomState(seed).normal(size=x.shape).astype(np.float32)
  grads = mtf.gradients([y], [xt] + [v.outputs[0] for v in variables],
                        grad_ys=[mtf.import_tf_tensor(mesh, w, y.shape)])
  lowering = mtf.Lowering(graph, {mesh: impl})
  rng = np.random.RandomState(seed + 1)
  initial = {}
  for v in variables:
    laid = lowering.variables[v]
    initial[v.name] = laid.read_full().numpy()
    laid.assign_full(rng.normal(size=initial[v.name].shape).astype(np.float32) * 0.5)
  export = lambda t: lowering.export_to_tf_tensor(t).numpy()
  return Result(export(y), export(grads[0]),
                {v.name: lowering.variables[v].read_full().numpy() for v in variables},
                {v.name: export(g) for v, g in zip(variables, grads[1:])}, []), w, initial


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_dense_relu_dense_fixup(case):
  x = _x(1)
  layer = fl.DenseReluDenseFixup(hidden_size=D_FF, num_blocks=4)
  result, w, initial = run_with_random_weights(layer, mtf_testing.backend_mesh_impl(*case), x)
  short = {n[len(SCOPE) + 1:]: v for n, v in initial.items()}
  assert sorted(short) == ["wi/kernel", "wi_bias", "wi_shift", "wo/kernel", "wo_shift"]
  assert not np.any(short["wo/kernel"]) and short["wi_shift"] == 0.0
  # He uniform, variance 2 / (fan_in * num_blocks): |w| <= sqrt(3 * 2 / (8 * 4)).
  limit = np.sqrt(6.0 / (D_MODEL * 4))
  wi = short["wi/kernel"]
  assert np.abs(wi).max() <= limit and np.abs(wi).max() > 0.7 * limit

  def ref(x, wi_kernel, wi_bias, wi_shift, wo_kernel, wo_shift):
    h = tf.nn.relu((x + wi_shift) @ wi_kernel + wi_bias)
    return (h + wo_shift) @ wo_kernel
  check_against_reference(result, w, x, ref)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_self_attention_fixup(case):
  x = _x(2)
  layer = fl.SelfAttentionFixup(num_blocks=4, num_heads=HEADS, key_value_size=D_KV)
  result, w, initial = run_with_random_weights(layer, mtf_testing.backend_mesh_impl(*case), x)
  prefix = [n for n in initial if n.endswith("/o")][0][:-1]
  assert not np.any(initial[prefix + "o"]), "o starts at zero"
  # Glorot uniform: q has variance 2 / (fan_in + fan_out); v that divided by num_blocks.
  fan = (D_MODEL + HEADS * D_KV) / 2.0
  for name, blocks in (("q", 1), ("v", 4)):
    limit = np.sqrt(3.0 / fan / blocks)
    value = initial[prefix + name]
    assert np.abs(value).max() <= limit and np.abs(value).max() > 0.6 * limit, name
  short = prefix[len(SCOPE) + 1:].replace("/", "_")

  def ref(x, **v):
    p = lambda c: v[short + c]
    return ref_attention(x, p("q") * D_KV ** -0.5, p("k"), p("v"), p("o"),
                         mask=causal_mask(LENGTH), heads=HEADS, d_kv=D_KV)
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-5)


def test_enc_dec_attention_fixup():
  x = _x(4)
  encoder = np.random.RandomState(5).normal(size=(2, 6, D_MODEL)).astype(np.float32)
  layer = fl.EncDecAttentionFixup(num_blocks=2, default_init="he", num_heads=HEADS,
                                  key_value_size=D_KV)
  result, w, initial = run_with_random_weights(layer, mtf_testing.backend_mesh_impl(*CASES[1]), x,
                                               encoder_output=encoder)
  prefix = [n for n in initial if n.endswith("/o")][0][:-1]
  assert not np.any(initial[prefix + "o"])
  short = prefix[len(SCOPE) + 1:].replace("/", "_")

  def ref(x, **v):
    p = lambda c: v[short + c]
    return ref_attention(x, p("q") * D_KV ** -0.5, p("k"), p("v"), p("o"),
                         memory=encoder, heads=HEADS, d_kv=D_KV)
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-5)


def test_fixup_sublayers_in_a_layer_stack():
  Model = collections.namedtuple("Model", ["model_dim", "autoregressive",
                                           "fully_autoregressive"])
  layer = fl.DenseReluDenseFixup(hidden_size=D_FF, num_blocks=1)
  layer.set_name("layer_000")
  stack = transformer.LayerStack(
      [layer], sublayers_initial=[], sublayers_final=[],
      sublayers_per_layer=[fl.sublayer_fixup_shift, transformer.sublayer_call_layer,
                           fl.sublayer_fixup_scale, fl.sublayer_fixup_shift,
                           transformer.sublayer_residual])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  d_model = mtf.Dimension("d_model", D_MODEL)
  length = mtf.Dimension("length", LENGTH)
  x = _x(3)
  xt = mtf.import_tf_tensor(mesh, x, [batch_dim, length, d_model])
  context = Context(Model(d_model, False, False), mesh, [batch_dim], length,
                    mtf.VariableDType(tf.float32), mode="eval")
  y = stack.call(context, xt)
  names = sorted(v.name for v in graph.trainable_variables)
  assert [n for n in names if "fixup" in n] == [
      "layer_000/fixup_bias", "layer_000/fixup_bias_1", "layer_000/fixup_scale_weight"]
  lowering = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl(*CASES[1])})
  values = {}
  for i, v in enumerate(graph.trainable_variables):
    laid = lowering.variables[v]
    values[v.name] = np.random.RandomState(i).normal(
        size=laid.read_full().shape).astype(np.float32)
    laid.assign_full(values[v.name])
  p = lambda n: values["layer_000/" + n]
  h = np.maximum((x + p("fixup_bias") + p("DenseReluDenseFixup/wi_shift")) @
                 p("DenseReluDenseFixup/wi/kernel") + p("DenseReluDenseFixup/wi_bias"), 0)
  branch = (h + p("DenseReluDenseFixup/wo_shift")) @ p("DenseReluDenseFixup/wo/kernel")
  expected = x + branch * p("fixup_scale_weight") + p("fixup_bias_1")
  np.testing.assert_allclose(lowering.export_to_tf_tensor(y).numpy(), expected,
                             rtol=1e-4, atol=1e-4)


def test_bad_init_names_are_reported():
  with pytest.raises(mtf.MtfError, match="default_init 'lecun'"):
    fl.fixup_initializer("lecun", "uniform")
  with pytest.raises(mtf.MtfError, match="init_distribution 'beta'"):
    fl.fixup_initializer("he", "beta")
