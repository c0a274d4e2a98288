"""Unitransformer against an independent plain-TF forward pass (untied softmax weights,
label smoothing, packed examples, z-loss), its gradients, helpers and bad input."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import transformer
from models.transformer import transformer_layers
from models.transformer.context import ModeKeys

CPUS = ["/cpu:%d" % i for i in range(8)]
BATCH, LENGTH, D_MODEL, HEADS, D_KV, D_FF, VOCAB = 2, 8, 16, 4, 4, 16, 20
PADDED_VOCAB = 24  # VOCAB rounded up to vocab_divisor=8
SEQUENCE_ID = np.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 2, 2, 2]], np.int32)
LABEL_SMOOTHING, Z_LOSS = 0.1, 1e-3


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  gin.clear_config()
  yield
  gin.clear_config()


def _packed_batch():
  position = np.zeros_like(SEQUENCE_ID)
  for b in range(BATCH):
    for t in range(1, LENGTH):
      same = SEQUENCE_ID[b, t] == SEQUENCE_ID[b, t - 1]
      position[b, t] = position[b, t - 1] + 1 if same else 0
  targets = np.random.RandomState(3).randint(2, VOCAB, size=(BATCH, LENGTH))
  targets = (targets * (SEQUENCE_ID > 0)).astype(np.int32)
  return targets, position


def _model(num_blocks=2):
  layers = []
  for block in range(num_blocks):
    attention = transformer_layers.SelfAttention(num_heads=HEADS, key_value_size=D_KV)
    ffn = transformer_layers.DenseReluDense(hidden_size=D_FF)
    attention.set_name("block_%03d/layer_000" % block)
    ffn.set_name("block_%03d/layer_001" % block)
    layers += [attention, ffn]
  return transformer.Unitransformer(
      layer_stack=transformer.LayerStack(layers), d_model=D_MODEL, input_vocab_size=VOCAB,
      output_vocab_size=VOCAB, autoregressive=True, max_length=LENGTH,
      shared_embedding_and_softmax_weights=False, label_smoothing=LABEL_SMOOTHING,
      z_loss=Z_LOSS, vocab_divisor=8)


def _rms(x, scale):
  return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + 1e-6) * scale


def reference_loss(w, targets, sequence_id, position):
  """The packed LM in plain TF on one device, from the variable values w (by name)."""
  inputs = np.roll(targets, 1, axis=1)
  inputs[:, 0] = 0
  inputs[:, 1:] *= sequence_id[:, 1:] == sequence_id[:, :-1]
  nonpad = tf.constant((sequence_id > 0)[..., None], tf.float32)
  x = tf.gather(w["transformer/embedding"], inputs) + tf.gather(
      w["transformer/positional_embedding"], position)
  same = sequence_id[:, :, None] == sequence_id[:, None, :]
  causal = position[:, None, :] <= position[:, :, None]
  bias = tf.constant(np.where(same & causal, 0.0, -1e9)[:, None], tf.float32)
  for block in range(2):
    p = "transformer/block_%03d/" % block
    h = _rms(x, w[p + "layer_000/rms_norm/scale"]) * nonpad
    split = lambda t: tf.reshape(t, [BATCH, LENGTH, HEADS, D_KV])
    a = p + "layer_000/SelfAttention/"
    q, k, v = (split(h @ w[a + n]) for n in "qkv")
    logits = tf.einsum("blhd,bmhd->bhlm", q, k) + bias
    o = tf.einsum("bhlm,bmhd->blhd", tf.nn.softmax(logits, -1), v)
    x += tf.reshape(o, [BATCH, LENGTH, HEADS * D_KV]) @ w[a + "o"]
    h = _rms(x, w[p + "layer_001/rms_norm/scale"]) * nonpad
    f = p + "layer_001/DenseReluDense/"
    x += tf.nn.relu(h @ w[f + "wi/kernel"]) @ w[f + "wo/kernel"]
  x = _rms(x, w["transformer/rms_norm/scale"]) * nonpad
  logits = x @ w["transformer/logits/kernel"]
  off = LABEL_SMOOTHING / PADDED_VOCAB
  soft = tf.one_hot(targets, PADDED_VOCAB, on_value=1.0 - LABEL_SMOOTHING + off,
                    off_value=off)
  lse = tf.reduce_logsumexp(logits, -1)
  xent = tf.reduce_sum((lse[..., None] - logits) * soft, -1) + Z_LOSS * tf.square(lse)
  weights = tf.cast(targets > 0, tf.float32)
  return logits, tf.reduce_sum(xent * weights) / (BATCH * LENGTH)


GRAD_VARS = ["transformer/logits/kernel", "transformer/block_000/layer_000/SelfAttention/q",
             "transformer/embedding", "transformer/block_001/layer_001/rms_norm/scale"]


@pytest.mark.parametrize("mesh_shape,layout", [
    ("", ""), ("rows:2;cols:4", "batch:rows;heads:cols;d_ff:cols;vocab:cols")],
                         ids=["mesh=[]", "mesh=2x4/dp+mp"])
def test_packed_lm_matches_plain_tf(mesh_shape, layout):
  targets_np, position_np = _packed_batch()
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  shape = [mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)]
  imp = lambda a: mtf.import_tf_tensor(mesh, tf.constant(a, tf.int32), shape)
  targets, sequence_id, position = imp(targets_np), imp(SEQUENCE_ID), imp(position_np)
  model = _model()
  logits, loss = model.call_simple(
      transformer.autoregressive_inputs(targets, sequence_id), targets, True,
      mode=ModeKeys.TRAIN, sequence_id=sequence_id, position=position)
  variables = {v.name: v.outputs[0] for v in graph.all_variables}
  grads = mtf.gradients([loss], [variables[n] for n in GRAD_VARS])
  n = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.PlacementMeshImpl(mesh_shape, layout, CPUS[:n] if n > 1 else [""])
  lowering = mtf.Lowering(graph, {mesh: impl})
  w = {name: tf.Variable(lowering.export_to_tf_tensor(t)) for name, t in variables.items()}
  assert "transformer/logits/kernel" in w and len(w) == 20
  with tf.GradientTape() as tape:
    ref_logits, ref_loss = reference_loss(w, targets_np, SEQUENCE_ID, position_np)
  ref_grads = tape.gradient(ref_loss, [w[name] for name in GRAD_VARS])
  got_logits = lowering.export_to_tf_tensor(logits).numpy()
  assert got_logits.shape == (BATCH, LENGTH, PADDED_VOCAB)
  np.testing.assert_allclose(got_logits, ref_logits.numpy(), atol=2e-4, rtol=1e-4)
  np.testing.assert_allclose(float(lowering.export_to_tf_tensor(loss)), float(ref_loss),
                             rtol=1e-5)
  for name, grad, ref in zip(GRAD_VARS, grads, ref_grads):
    np.testing.assert_allclose(lowering.export_to_tf_tensor(grad).numpy(),
                               tf.convert_to_tensor(ref).numpy(), atol=2e-5, rtol=1e-3,
                               err_msg=name)


def _lower(graph, mesh, tensors):
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", [""])})
  return [lowering.export_to_tf_tensor(t).numpy() for t in tensors]


def test_shift_helpers():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  shape = [mtf.Dimension("batch", 1), mtf.Dimension("length", 6)]
  targets = mtf.import_tf_tensor(mesh, tf.constant([[5, 6, 1, 7, 8, 1]]), shape)
  seg = mtf.import_tf_tensor(mesh, tf.constant([[1, 1, 1, 2, 2, 2]]), shape)
  plain, packed, shifted = _lower(graph, mesh, [
      transformer.autoregressive_inputs(targets),
      transformer.autoregressive_inputs(targets, seg),
      transformer.shift_targets(targets, bos_id=3)])
  np.testing.assert_array_equal(plain, [[0, 5, 6, 1, 7, 8]])
  np.testing.assert_array_equal(packed, [[0, 5, 6, 0, 7, 8]])
  np.testing.assert_array_equal(shifted, [[3, 5, 6, 3, 7, 8]])


def test_sinusoid_table_and_loss_denominator():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  table = transformer.sinusoid_positional_embedding_weights(
      mesh, mtf.Dimension("max_length", 5), mtf.Dimension("d_model", 6), tf.float32)
  (got,) = _lower(graph, mesh, [table])
  inv = 1e4 ** (-np.arange(3) / 2.0)
  angles = np.arange(5)[:, None] * inv[None]
  np.testing.assert_allclose(got, np.concatenate([np.sin(angles), np.cos(angles)], 1),
                             atol=1e-6)
  model = _model(num_blocks=1)
  targets = mtf.zeros(mesh, [mtf.Dimension("batch", 3), mtf.Dimension("length", 4)],
                      tf.int32)
  assert model.loss_denominator(targets, 2) == 24.0
  assert model.output_vocab_dim == mtf.Dimension("vocab", PADDED_VOCAB)
  assert model.fully_autoregressive


def test_second_call_reuses_variables():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  shape = [mtf.Dimension("batch", 2), mtf.Dimension("length", 4)]
  ids = mtf.import_tf_tensor(mesh, tf.constant([[2, 3, 4, 5], [6, 7, 8, 9]]), shape)
  model = _model(num_blocks=1)
  first, _ = model.call_simple(ids, None, False, mode=ModeKeys.EVAL)
  count = len(graph.all_variables)
  second, loss = model.call_simple(ids, None, False, mode=ModeKeys.EVAL)
  assert loss is None and len(graph.all_variables) == count
  a, b = _lower(graph, mesh, [first, second])
  np.testing.assert_array_equal(a, b)


def test_float_inputs_rejected_naming_the_tensor():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  shape = [mtf.Dimension("batch", 2), mtf.Dimension("length", 4)]
  floats = mtf.import_tf_tensor(mesh, tf.zeros([2, 4]), shape, name="my_float_ids")
  with pytest.raises(mtf.ShapeError, match="my_float_ids.*integer"):
    _model(num_blocks=1).call_simple(floats, None, False)
  ids = mtf.zeros(mesh, shape, tf.int32)
  other = mtf.import_tf_tensor(mesh, tf.zeros([2, 5], tf.int32), [
      mtf.Dimension("batch", 2), mtf.Dimension("length", 5)], name="long_targets")
  with pytest.raises(mtf.ShapeError, match="long_targets"):
    _model(num_blocks=1).call_simple(ids, other, True)


def test_length_beyond_max_length_rejected_naming_both():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  ids = mtf.zeros(mesh, [mtf.Dimension("batch", 2), mtf.Dimension("length", LENGTH + 1)],
                  tf.int32)
  with pytest.raises(mtf.ShapeError, match=r"length.*9.*max_length.*8"):
    _model(num_blocks=1).call_simple(ids, ids, True)


def test_make_layer_stack_names_and_sublayer_defaults():
  stack = transformer.make_layer_stack(
      layers=[transformer_layers.SelfAttention, transformer_layers.DenseReluDense],
      num_layers=3)
  assert stack.num_layers == 6
  assert [l.name for l in stack.layers[:3]] == [
      "block_000/layer_000", "block_000/layer_001", "block_001/layer_000"]
  assert len({id(l) for l in stack.layers}) == 6
  flat = transformer.make_layer_stack(layers=[transformer_layers.DenseReluDense],
                                      num_layers=2, block_scope=False)
  assert [l.name for l in flat.layers] == ["layer_000", "layer_001"]
  with pytest.raises(mtf.MtfError, match="norm_epsilon"):
    transformer.LayerStack([], dropout_rate=0.1)
