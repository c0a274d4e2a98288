"""A tiny Bitransformer learns to reverse random token sequences; its variable names
follow the original (encoder/..., decoder/..., shared/embedding)."""
import time

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import transformer
from models.transformer import transformer_layers
from models.transformer.context import ModeKeys

LENGTH, LOW, HIGH = 6, 2, 12       # sequences of 6 tokens drawn from 2..11
BATCH, VOCAB = 32, 12
STEPS = 80


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  gin.clear_config()
  yield
  gin.clear_config()


def reversal_data(num, seed):
  inputs = np.random.RandomState(seed).randint(LOW, HIGH, size=(num, LENGTH))
  return inputs.astype(np.int32), inputs[:, ::-1].astype(np.int32).copy()


def _stack(layer_classes, num_blocks, **kw):
  layers = []
  for block in range(num_blocks):
    for i, cls in enumerate(layer_classes):
      layer = cls(**kw.get(cls.__name__, {}))
      layer.set_name("block_%03d/layer_%03d" % (block, i))
      layers.append(layer)
  return transformer.LayerStack(layers)


def tiny_bitransformer(d_model=32, num_blocks=2):
  kw = {"SelfAttention": dict(num_heads=4, key_value_size=8),
        "EncDecAttention": dict(num_heads=4, key_value_size=8),
        "DenseReluDense": dict(hidden_size=64)}
  sa, eda, ffn = (transformer_layers.SelfAttention, transformer_layers.EncDecAttention,
                  transformer_layers.DenseReluDense)
  encoder = transformer.Unitransformer(
      layer_stack=_stack([sa, ffn], num_blocks, **kw), d_model=d_model,
      input_vocab_size=VOCAB, output_vocab_size=None, autoregressive=False,
      max_length=LENGTH, name="encoder", vocab_divisor=4)
  decoder = transformer.Unitransformer(
      layer_stack=_stack([sa, eda, ffn], num_blocks, **kw), d_model=d_model,
      input_vocab_size=VOCAB, output_vocab_size=VOCAB, autoregressive=True,
      max_length=LENGTH, name="decoder", vocab_divisor=4,
      shared_embedding_and_softmax_weights=True)
  return transformer.Bitransformer(encoder, decoder)


class ReversalTrainer:
  """Train graph (Adafactor) and a teacher-forced eval graph of one Bitransformer."""

  def __init__(self, learning_rate):
    self.graph = mtf.Graph()
    self.mesh = mtf.Mesh(self.graph, "m")
    shape = [mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)]
    spec = tf.TensorSpec([BATCH, LENGTH], tf.int32)
    self.inputs = mtf.import_tf_tensor(self.mesh, spec, shape, name="inputs")
    self.targets = mtf.import_tf_tensor(self.mesh, spec, shape, name="targets")
    model = tiny_bitransformer()
    _, self.loss = model.call_simple(self.inputs, self.targets, True, mode=ModeKeys.TRAIN)
    self.logits, _ = model.call_simple(self.inputs, self.targets, False,
                                       mode=ModeKeys.EVAL)
    self.step = tf.Variable(0, dtype=tf.int64)
    decay = lambda: 1.0 - tf.pow(tf.cast(self.step, tf.float32) + 1.0, -0.8)
    optimizer = mtf.optimize.AdafactorOptimizer(learning_rate=learning_rate,
                                                decay_rate=decay)
    variables = self.graph.trainable_variables
    grads = mtf.gradients([self.loss], [v.outputs[0] for v in variables])
    self.update_ops = optimizer.apply_grads(grads, variables)
    self.impl = mtf.PlacementMeshImpl("", "", [""])
    mtf.Lowering(self.graph, {self.mesh: self.impl})

  def _lowering(self, inputs, targets):
    return mtf.Lowering(self.graph, {self.mesh: self.impl},
                        feeds={self.inputs: inputs, self.targets: targets})

  @tf.function
  def train_step(self, inputs, targets):
    lowering = self._lowering(inputs, targets)
    loss = lowering.export_to_tf_tensor(self.loss)
    for op in self.update_ops:
      lowering.lowered_operation(op)
    self.step.assign_add(1)
    return loss

  @tf.function
  def predict(self, inputs, targets):
    return tf.argmax(self._lowering(inputs, targets).export_to_tf_tensor(self.logits),
                     -1, output_type=tf.int32)


def test_bitransformer_variable_names():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  ids = mtf.zeros(mesh, [mtf.Dimension("batch", 2), mtf.Dimension("length", LENGTH)],
                  tf.int32) + 3
  logits, loss = tiny_bitransformer(num_blocks=1).call_simple(ids, ids, True)
  names = sorted(v.name for v in graph.all_variables)
  assert "shared/embedding" in names and "shared/positional_embedding" in names
  assert "decoder/block_000/layer_001/EncDecAttention/q" in names
  assert "encoder/block_000/layer_000/SelfAttention/k" in names
  assert "encoder/rms_norm/scale" in names and "decoder/rms_norm/scale" in names
  assert all(n.split("/")[0] in ("shared", "encoder", "decoder") for n in names)
  assert not any(n.endswith("/embedding") and not n.startswith("shared") for n in names)
  assert logits.shape.dimension_names == ["batch", "length", "vocab"]
  assert loss.shape.ndims == 0


def test_bitransformer_learns_to_reverse():
  tf.random.set_seed(0)  # a fixed initial draw keeps the run reproducible
  trainer = ReversalTrainer(learning_rate=0.03)
  inputs, targets = reversal_data(BATCH * STEPS, seed=0)
  start = time.time()
  losses = []
  for i in range(STEPS):
    s = slice(i * BATCH, (i + 1) * BATCH)
    losses.append(float(trainer.train_step(inputs[s], targets[s])))
  held_in, held_out = reversal_data(BATCH, seed=123)
  predicted = trainer.predict(held_in, held_out).numpy()
  accuracy = float(np.mean(predicted == held_out))
  print("reversal: %d steps, %.1fs, first loss %.3f, last loss %.3f, held-out "
        "teacher-forced accuracy %.3f" % (STEPS, time.time() - start, losses[0],
                                          np.mean(losses[-10:]), accuracy))
  assert np.mean(losses[-10:]) < 0.5 * losses[0]
  assert accuracy >= 0.9
