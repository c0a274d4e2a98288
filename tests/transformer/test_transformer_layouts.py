"""Tiny Transformers train a few steps on one device; the eval loss of their checkpoint
is the same restored on one device, on placement [2,4] (data + model parallel) and on
SIMD emulation [8,8]."""
import functools

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import transformer
from models.transformer import transformer_layers
from models.transformer.context import ModeKeys

BATCH, LENGTH, VOCAB, D_MODEL, HEADS, D_KV, D_FF = 8, 8, 30, 16, 8, 4, 32
LAYOUT = "batch:rows;heads:cols;d_ff:cols;vocab:cols"
CPUS = ["/cpu:%d" % i for i in range(8)]
TRAIN_STEPS = 8


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  gin.clear_config()
  yield
  gin.clear_config()


def _layers(*names):
  sizes = {"SelfAttention": dict(num_heads=HEADS, key_value_size=D_KV),
           "EncDecAttention": dict(num_heads=HEADS, key_value_size=D_KV),
           "DenseReluDense": dict(hidden_size=D_FF)}
  return [functools.partial(getattr(transformer_layers, n), **sizes[n]) for n in names]


def _unitransformer(name, layers, output_vocab_size, autoregressive):
  return transformer.Unitransformer(
      layer_stack=transformer.make_layer_stack(layers=layers, num_layers=1),
      d_model=D_MODEL, input_vocab_size=VOCAB, output_vocab_size=output_vocab_size,
      autoregressive=autoregressive, max_length=LENGTH, name=name, vocab_divisor=8)


def lm_loss(inputs, targets, mode):
  model = _unitransformer("transformer", _layers("SelfAttention", "DenseReluDense"),
                          VOCAB, True)
  del inputs
  return model.call_simple(transformer.autoregressive_inputs(targets), targets, True,
                           mode=mode)[1]


def bitransformer_loss(inputs, targets, mode):
  encoder = _unitransformer("encoder", _layers("SelfAttention", "DenseReluDense"), None,
                            False)
  decoder = _unitransformer("decoder", _layers("SelfAttention", "EncDecAttention",
                                               "DenseReluDense"), VOCAB, True)
  return transformer.Bitransformer(encoder, decoder).call_simple(
      inputs, targets, True, mode=mode)[1]


def _graph(loss_fn, mode):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  shape = [mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)]
  spec = tf.TensorSpec([BATCH, LENGTH], tf.int32)
  inputs = mtf.import_tf_tensor(mesh, spec, shape, name="inputs")
  targets = mtf.import_tf_tensor(mesh, spec, shape, name="targets")
  return graph, mesh, inputs, targets, loss_fn(inputs, targets, mode)


def _batch():
  rng = np.random.RandomState(5)
  inputs = rng.randint(2, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
  return inputs, (inputs[:, ::-1] + 1).astype(np.int32)


def train_and_save(loss_fn, directory):
  """Trains TRAIN_STEPS Adafactor steps on one device; returns (losses, checkpoint prefix)."""
  graph, mesh, inputs, targets, loss = _graph(loss_fn, ModeKeys.TRAIN)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  update_ops = mtf.optimize.AdafactorOptimizer(
      learning_rate=0.01, decay_rate=0.8).apply_grads(grads, variables)
  impl = mtf.PlacementMeshImpl("", "", [""])
  mtf.Lowering(graph, {mesh: impl})

  @tf.function
  def train_step(x, y):
    lowering = mtf.Lowering(graph, {mesh: impl}, feeds={inputs: x, targets: y})
    value = lowering.export_to_tf_tensor(loss)
    for op in update_ops:
      lowering.lowered_operation(op)
    return value

  x, y = _batch()
  losses = [float(train_step(x, y)) for _ in range(TRAIN_STEPS)]
  prefix = mtf.save_checkpoint(str(directory / "model.ckpt"), impl,
                               global_step=TRAIN_STEPS)
  return losses, prefix


def eval_restored(loss_fn, prefix, impl):
  """Builds the eval graph afresh, restores the checkpoint on impl, returns the loss."""
  graph, mesh, inputs, targets, loss = _graph(loss_fn, ModeKeys.EVAL)
  x, y = _batch()
  lowering = mtf.Lowering(graph, {mesh: impl}, feeds={inputs: x, targets: y})
  result = mtf.restore_checkpoint(prefix, lowering)
  assert sorted(result.names) == sorted(v.name for v in graph.all_variables)
  return float(lowering.export_to_tf_tensor(loss))


@pytest.mark.parametrize("loss_fn", [lm_loss, bitransformer_loss],
                         ids=["unitransformer", "bitransformer"])
def test_eval_loss_same_on_every_layout(loss_fn, tmp_path):
  losses, prefix = train_and_save(loss_fn, tmp_path)
  assert losses[-1] < losses[0] - 0.1, losses
  impls = {
      "single": mtf.PlacementMeshImpl("", "", [""]),
      "placement 2x4 dp+mp": mtf.PlacementMeshImpl("rows:2;cols:4", LAYOUT, CPUS),
      "simd 8x8 dp+mp": mtf.make_mesh_impl("simd", "rows:8;cols:8", LAYOUT),
  }
  evals = {name: eval_restored(loss_fn, prefix, impl) for name, impl in impls.items()}
  # The checkpoint holds trained weights: evaluating it is not the untrained loss.
  assert evals["single"] < losses[0] - 0.1
  for name, value in evals.items():
    np.testing.assert_allclose(value, evals["single"], rtol=2e-5, err_msg=name)
