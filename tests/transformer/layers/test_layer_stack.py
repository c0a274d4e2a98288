"""LayerStack and its sublayers: numbers against numpy, variable names, legacy mode,
recompute_grads, and the gin names of the original (transformer.LayerStack, ...)."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import layer_stack as ls
from models.transformer import transformer
from models.transformer import transformer_layers
from models.transformer.context import Context, ModeKeys
from models.transformer.transformer_layer import TransformerLayer

BATCH, LENGTH, D_MODEL, D_FF = 2, 3, 4, 8


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  gin.clear_config()
  yield
  gin.clear_config()


class _FakeModel:
  model_dim = mtf.Dimension("d_model", D_MODEL)
  ensemble_dims = []
  autoregressive = False
  fully_autoregressive = False


def _setup(mode=ModeKeys.EVAL, sequence_id=None):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  batch, length = mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)
  x_np = np.random.RandomState(0).randn(BATCH, LENGTH, D_MODEL).astype(np.float32)
  x = mtf.import_tf_tensor(mesh, tf.constant(x_np), [batch, length, _FakeModel.model_dim])
  if sequence_id is not None:
    sequence_id = mtf.import_tf_tensor(mesh, tf.constant(sequence_id), [batch, length])
  context = Context(_FakeModel(), mesh, [batch], length, mtf.VariableDType(tf.float32),
                    mode=mode, sequence_id=sequence_id, losses=[])
  return graph, mesh, x, x_np, context


def _values(graph, mesh, tensors):
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", [""])})
  return [lowering.export_to_tf_tensor(t).numpy() for t in tensors]


def _rms(x):
  return x / np.sqrt(np.mean(x ** 2, -1, keepdims=True) + 1e-6)


def test_default_stack_is_prenorm_residual_with_final_norm():
  graph, mesh, x, x_np, context = _setup()
  ffn = transformer_layers.DenseReluDense(hidden_size=D_FF)
  ffn.set_name("block_000/layer_000")
  y = transformer.LayerStack([ffn]).call(context, x)
  names = {v.name: v.outputs[0] for v in graph.all_variables}
  assert sorted(names) == ["block_000/layer_000/DenseReluDense/wi/kernel",
                           "block_000/layer_000/DenseReluDense/wo/kernel",
                           "block_000/layer_000/rms_norm/scale", "rms_norm/scale"]
  got, wi, wo = _values(graph, mesh, [y, names["block_000/layer_000/DenseReluDense/wi/"
                                               "kernel"],
                                      names["block_000/layer_000/DenseReluDense/wo/kernel"]])
  h = x_np + np.maximum(_rms(x_np) @ wi, 0) @ wo
  np.testing.assert_allclose(got, _rms(h), rtol=1e-5, atol=1e-5)


def test_mask_padding_and_sublayer_functions():
  sequence_id = np.array([[1, 1, 0], [1, 2, 2]], np.int32)
  graph, mesh, x, x_np, context = _setup(sequence_id=sequence_id)
  masked = ls.sublayer_mask_padding(x, None, context)
  normed = ls.sublayer_true_layer_norm(x, None, context)
  rezero = ls.sublayer_rezero(x, None, context, initial_value=0.5)
  scaled = ls.sublayer_scale_norm(x, None, context)
  context.current_layer_input = x
  residual = ls.sublayer_residual(x, None, context)
  got = _values(graph, mesh, [masked, normed, rezero, scaled, residual])
  np.testing.assert_allclose(got[0], x_np * (sequence_id > 0)[..., None])
  centered = x_np - x_np.mean(-1, keepdims=True)
  np.testing.assert_allclose(got[1], centered / np.sqrt(
      np.mean(centered ** 2, -1, keepdims=True) + 1e-6), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[2], 0.5 * x_np, rtol=1e-6)
  np.testing.assert_allclose(got[3], _rms(x_np), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[4], 2 * x_np, rtol=1e-6)
  names = sorted(v.name for v in graph.all_variables)
  assert names == ["rezero/scale", "scale_norm/scale", "true_layer_norm/bias",
                   "true_layer_norm/scale"]


def test_dropout_sublayer_only_in_training_and_shared_along_length():
  graph, mesh, x, x_np, context = _setup(mode=ModeKeys.TRAIN)
  dropped = ls.sublayer_dropout(x, None, context, dropout_rate=0.5)
  _, _, x_eval, _, eval_context = _setup(mode=ModeKeys.EVAL)
  assert ls.sublayer_dropout(x_eval, None, eval_context, dropout_rate=0.5) is x_eval
  (got,) = _values(graph, mesh, [dropped])
  kept = got != 0
  assert kept.any() and not kept.all()
  # One mask per (batch, d_model): every position of a row is kept or dropped alike.
  assert (kept == kept[:, :1, :]).all()
  np.testing.assert_allclose(got[kept], 2 * x_np[kept], rtol=1e-6)


def test_legacy_mode_names_and_recompute_grads_gradient():
  graph, mesh, x, _, context = _setup()
  outputs = []
  for recompute in (False, True):
    ffn = transformer_layers.DenseReluDense(hidden_size=D_FF)
    ffn.set_name("layer_000")
    stack = transformer.LayerStack([ffn], dropout_rate=0.0, norm_epsilon=1e-6,
                                   recompute_grads=recompute)
    # The second stack shares the first one's variables.
    with mtf.variable_scope("", reuse=recompute):
      outputs.append(stack.call(context, x))
  variables = sorted(graph.all_variables, key=lambda v: v.name)
  assert [v.name for v in variables] == [
      "final_layer_norm/scale", "layer_000/DenseReluDense/wi/kernel",
      "layer_000/DenseReluDense/wo/kernel", "layer_000/layer_norm/scale"]
  results = []
  for y in outputs:
    loss = mtf.reduce_sum(mtf.square(y))
    results.append([y] + mtf.gradients([loss], [v.outputs[0] for v in variables] + [x]))
  values = _values(graph, mesh, results[0] + results[1])  # one Lowering: same weights
  for a, b in zip(values[:len(results[0])], values[len(results[0]):]):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_misshaped_layer_output_is_named():
  class BadLayer(TransformerLayer):
    def call(self, context, x):
      return mtf.reduce_sum(x, reduced_dim=context.length_dim)

  _, _, x, _, context = _setup()
  bad = BadLayer()
  bad.set_name("block_000/layer_007")
  with pytest.raises(mtf.ShapeError, match="block_000/layer_007.*BadLayer"):
    transformer.LayerStack([bad]).call(context, x)


def test_original_gin_lines_build_models():
  gin.parse_config("""
      transformer.make_layer_stack.layers = [@transformer_layers.SelfAttention,
                                             @transformer_layers.DenseReluDense]
      transformer.make_layer_stack.num_layers = 2
      transformer.LayerStack.sublayers_per_layer = [@transformer.sublayer_rms_norm,
                                                    @transformer.sublayer_call_layer,
                                                    @transformer.sublayer_residual]
      transformer.sublayer_rms_norm.epsilon = 1e-5
      SelfAttention.num_heads = 2
      SelfAttention.key_value_size = 4
      DenseReluDense.hidden_size = 8
      decoder/make_layer_stack.num_layers = 1
      decoder/make_layer_stack.layers = [@transformer_layers.EncDecAttention,
                                         @transformer_layers.DenseReluDense]
      Unitransformer.d_model = 4
      Unitransformer.max_length = 3
  """)
  stack = transformer.make_layer_stack()
  assert stack.num_layers == 4
  assert isinstance(stack.layers[0], transformer_layers.SelfAttention)
  assert stack.layers[0].num_heads == 2
  assert stack._sublayers_per_layer[-1] is ls.sublayer_residual  # pylint: disable=protected-access
  model = transformer.make_bitransformer(input_vocab_size=10, output_vocab_size=10)
  assert model.encoder.layer_stack.num_layers == 4
  assert [type(l).__name__ for l in model.decoder.layer_stack.layers] == [
      "EncDecAttention", "DenseReluDense"]
  assert model.encoder.name == "encoder" and model.decoder.autoregressive
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  ids = mtf.zeros(mesh, [mtf.Dimension("batch", 2), mtf.Dimension("length", 3)],
                  tf.int32) + 2
  logits, loss = model.call_simple(ids, ids, True, mode=ModeKeys.EVAL)
  names = sorted(v.name for v in graph.all_variables)
  assert "decoder/block_000/layer_000/EncDecAttention/q" in names
  assert "encoder/block_001/layer_000/SelfAttention/q" in names
  got_logits, got_loss = _values(graph, mesh, [logits, loss])
  assert got_logits.shape == (2, 3, 128) and np.isfinite(got_loss)


def test_make_bitransformer_defaults_without_gin():
  model = transformer.make_bitransformer(input_vocab_size=10, output_vocab_size=12)
  assert [type(l).__name__ for l in model.encoder.layer_stack.layers[:2]] == [
      "SelfAttention", "DenseReluDense"]
  assert [type(l).__name__ for l in model.decoder.layer_stack.layers[:3]] == [
      "SelfAttention", "EncDecAttention", "DenseReluDense"]
  assert model.decoder.layer_stack.num_layers == 18
  assert model.output_vocab_dim.size == 128
