"""ReversibleLayerStack and sublayer_rms_norm_subsampled against plain TensorFlow: a tiny
LM's logits, loss and gradients, on one device and a 2x4 mesh."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import transformer
from models.transformer import transformer_layers
from models.transformer.context import ModeKeys

CPUS = ["/cpu:%d" % i for i in range(8)]
D_MODEL, D_FF, VOCAB, BATCH, LENGTH = 8, 16, 16, 4, 6
MESHES = [("", "", [""]),
          ("rows:2;cols:4", "batch:rows;d_ff:cols;vocab:cols", CPUS)]
MESH_IDS = ["mesh=[]", "mesh=2x4"]


def _stack(cls, norm, **kwargs):
  layers = []
  for n in range(2):
    layer = transformer_layers.DenseReluDense(hidden_size=D_FF)
    layer.set_name("layer_%03d" % n)
    layers.append(layer)
  per_layer = [norm, transformer.sublayer_call_layer]
  if cls is transformer.LayerStack:
    per_layer.append(transformer.sublayer_residual)
  return cls(layers, sublayers_initial=[], sublayers_per_layer=per_layer,
             sublayers_final=[norm], **kwargs)


def _mtf_run(stack, mesh_shape, layout, devices):
  """(logits, loss, {variable name: value}, {variable name: gradient}) of an LM."""
  rng = np.random.RandomState(3)
  targets_np = rng.randint(1, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  dims = [mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)]
  targets = mtf.import_tf_tensor(mesh, tf.constant(targets_np), dims)
  inputs = mtf.import_tf_tensor(mesh, tf.constant(np.roll(targets_np, 1, -1)), dims)
  model = transformer.Unitransformer(
      layer_stack=stack, d_model=D_MODEL, input_vocab_size=VOCAB, output_vocab_size=VOCAB,
      autoregressive=True, max_length=LENGTH, shared_embedding_and_softmax_weights=True,
      positional_embedding=False, vocab_divisor=1, z_loss=0.0)
  logits, loss = model.call_simple(inputs, targets, compute_loss=True, mode=ModeKeys.EVAL)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl(mesh_shape, layout,
                                                                devices)})
  values = {v.name: lowering.export_to_tf_tensor(v.outputs[0]).numpy() for v in variables}
  grad_values = {v.name: lowering.export_to_tf_tensor(g).numpy()
                 for v, g in zip(variables, grads)}
  return (lowering.export_to_tf_tensor(logits).numpy(),
          float(lowering.export_to_tf_tensor(loss).numpy()), values, grad_values,
          targets_np)


def _tf_rms(x, scale, fraction=1.0):
  size = int(np.ceil(x.shape[-1] * fraction))
  variance = tf.reduce_mean(tf.square(x[..., :size]), -1, keepdims=True)
  return x * tf.math.rsqrt(variance + 1e-6) * scale


def _tf_lm(weights, targets_np, reversible, fraction=1.0, norm="rms_norm"):
  """The same LM in plain TF: loss and gradients by GradientTape."""
  w = {k: tf.Variable(v) for k, v in weights.items()}
  prefix = "transformer/"
  with tf.GradientTape() as tape:
    emb = w[prefix + "embedding"]
    x = tf.gather(emb, np.roll(targets_np, 1, -1))
    x1 = x2 = x
    for n in range(2):
      scope = prefix + "layer_%03d/" % n
      h = _tf_rms(x2 if reversible else x1, w[scope + norm + "/scale"], fraction)
      f = tf.nn.relu(h @ w[scope + "DenseReluDense/wi/kernel"])
      f = f @ w[scope + "DenseReluDense/wo/kernel"]
      if reversible:
        x1, x2 = x2, x1 + f
      else:
        x1 = x1 + f
    out = x1 + x2 if reversible else x1
    y = _tf_rms(out, w[prefix + norm + "/scale"], fraction)
    logits = (y * D_MODEL ** -0.5) @ tf.transpose(emb)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        targets_np, logits))
  grads = tape.gradient(loss, w)
  return logits.numpy(), float(loss.numpy()), {k: g.numpy() for k, g in grads.items()}


@pytest.mark.parametrize("mesh_shape,layout,devices", MESHES, ids=MESH_IDS)
@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "keep"])
def test_reversible_stack_matches_plain_tf(mesh_shape, layout, devices, recompute):
  stack = _stack(transformer.ReversibleLayerStack, transformer.sublayer_rms_norm,
                 recompute_grads=recompute)
  logits, loss, weights, grads, targets = _mtf_run(stack, mesh_shape, layout, devices)
  tf_logits, tf_loss, tf_grads = _tf_lm(weights, targets, reversible=True)
  np.testing.assert_allclose(logits, tf_logits, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss, tf_loss, rtol=1e-5)
  assert sorted(grads) == sorted(tf_grads)
  for name in grads:
    np.testing.assert_allclose(grads[name], tf_grads[name], rtol=1e-3, atol=1e-5,
                               err_msg=name)


def test_reversible_stack_differs_from_plain_stack():
  # The check above would pass vacuously if the stack silently ran the plain residual.
  stack = _stack(transformer.ReversibleLayerStack, transformer.sublayer_rms_norm)
  _, loss, weights, _, targets = _mtf_run(stack, "", "", [""])
  _, plain_loss, _ = _tf_lm(weights, targets, reversible=False)
  assert abs(loss - plain_loss) > 1e-4


def test_reversible_stack_rejects_residual_sublayer():
  with pytest.raises(mtf.MtfError, match="sublayer_residual"):
    transformer.ReversibleLayerStack(
        [], sublayers_per_layer=[transformer.sublayer_call_layer,
                                 transformer.sublayer_residual])


@pytest.mark.parametrize("mesh_shape,layout,devices", MESHES, ids=MESH_IDS)
def test_rms_norm_subsampled_matches_plain_tf(mesh_shape, layout, devices):
  def norm(x, layer_stack, context):
    return transformer.sublayer_rms_norm_subsampled(x, layer_stack, context,
                                                    percentage=50.0)
  stack = _stack(transformer.LayerStack, norm)
  logits, loss, weights, grads, targets = _mtf_run(stack, mesh_shape, layout, devices)
  assert "transformer/layer_000/layer_norm_subsampled/scale" in weights
  tf_logits, tf_loss, tf_grads = _tf_lm(weights, targets, reversible=False, fraction=0.5,
                                        norm="layer_norm_subsampled")
  np.testing.assert_allclose(logits, tf_logits, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss, tf_loss, rtol=1e-5)
  for name in grads:
    np.testing.assert_allclose(grads[name], tf_grads[name], rtol=1e-3, atol=1e-5,
                               err_msg=name)
  # Half the features give a different statistic than all of them.
  full_logits, _, _ = _tf_lm(weights, targets, reversible=False, fraction=1.0,
                             norm="layer_norm_subsampled")
  assert np.abs(full_logits - tf_logits).max() > 1e-3


def test_rms_norm_subsampled_rejects_bad_percentage():
  def norm(x, layer_stack, context):
    return transformer.sublayer_rms_norm_subsampled(x, layer_stack, context,
                                                    percentage=0.0)
  with pytest.raises(mtf.MtfError, match="percentage"):
    _mtf_run(_stack(transformer.LayerStack, norm), "", "", [""])
