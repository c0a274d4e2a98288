"""Decoding with tiny randomly initialized Transformers (models/transformer/decoding.py):
each decoded id is the argmax of the model's own teacher-forced logits, sampling keeps
to the top k, beam search with one beam equals greedy, and the layout does not matter."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import decoding
from models.transformer import transformer
from models.transformer import transformer_layers

# The vocab dim is padded to 16; prompts of 2 and 3 ids leave 3 or 4 positions to decode.
BATCH, LENGTH, VOCAB = 2, 6, 10
EOS = 1
PROMPTS = np.array([[5, 7, 0, 0, 0, 0], [3, 9, 4, 0, 0, 0]], np.int32)


@pytest.fixture(autouse=True)
def _no_gin_bindings_and_seeded_weights():
  """Fixed initial weights: the properties checked hold for any weights, but a fixed
  draw keeps a failure reproducible."""
  gin.clear_config()
  tf.random.set_seed(1234)
  yield
  gin.clear_config()


def _stack(layer_classes):
  layers = []
  for i, cls in enumerate(layer_classes):
    kwargs = {"DenseReluDense": dict(hidden_size=16)}.get(
        cls.__name__, dict(num_heads=2, key_value_size=8))
    layer = cls(**kwargs)
    layer.set_name("block_000/layer_%03d" % i)
    layers.append(layer)
  return transformer.LayerStack(layers)


def tiny_lm():
  return transformer.Unitransformer(
      layer_stack=_stack([transformer_layers.SelfAttention,
                          transformer_layers.DenseReluDense]),
      d_model=16, input_vocab_size=VOCAB, output_vocab_size=VOCAB, autoregressive=True,
      max_length=LENGTH, vocab_divisor=8)


def tiny_bitransformer():
  encoder = transformer.Unitransformer(
      layer_stack=_stack([transformer_layers.SelfAttention,
                          transformer_layers.DenseReluDense]),
      d_model=16, input_vocab_size=VOCAB, output_vocab_size=None, autoregressive=False,
      max_length=LENGTH, name="encoder", vocab_divisor=8)
  decoder = transformer.Unitransformer(
      layer_stack=_stack([transformer_layers.SelfAttention,
                          transformer_layers.EncDecAttention,
                          transformer_layers.DenseReluDense]),
      d_model=16, input_vocab_size=VOCAB, output_vocab_size=VOCAB, autoregressive=True,
      max_length=LENGTH, name="decoder", vocab_divisor=8)
  return transformer.Bitransformer(encoder, decoder)


def _dims(beam=None):
  batch, length = mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)
  return [batch] + ([mtf.Dimension("beam", beam)] if beam else []) + [length]


def _lower(graph, mesh, tensors, impl=None):
  impl = impl or mtf.PlacementMeshImpl("", "", ["/cpu:0"])
  lowering = mtf.Lowering(graph, {mesh: impl})
  return [lowering.export_to_tf_tensor(t).numpy() for t in tensors]


def _check_follows_argmax(decoded, logits, prompts, top_k=1):
  """Every generated id is among the top_k real-vocab ids of the teacher-forced logits
  at its position; the prompt is kept and everything after EOS is 0."""
  assert (decoded < VOCAB).all(), "a padded vocab id was decoded"
  for b in range(decoded.shape[0]):
    start = int((prompts[b] != 0).sum())
    np.testing.assert_array_equal(decoded[b, :start], prompts[b, :start])
    ended = False
    for p in range(start, LENGTH):
      if ended:
        assert decoded[b, p] == 0, "row %d: id after EOS at %d" % (b, p)
        continue
      best = np.argsort(-logits[b, p, :VOCAB], kind="stable")[:top_k]
      assert decoded[b, p] in best, "row %d position %d: %d not in %s" % (
          b, p, decoded[b, p], best)
      ended = decoded[b, p] == EOS


def _log_probs(logits):
  real = logits[..., :VOCAB].astype(np.float64)
  real = real - real.max(-1, keepdims=True)
  return real - np.log(np.exp(real).sum(-1, keepdims=True))


def _check_beam_one_is_greedy(beam1, greedy, greedy_logits, prompts):
  """Beam search with one beam (alpha 0) follows the greedy path. As in the original,
  a runner-up EOS seen on the way is kept as a finished hypothesis, and a finished
  hypothesis beats an unfinished one, so beam 1 may instead return a greedy prefix
  ending in EOS: then that sequence must score at least as well as the greedy one
  (log-probabilities from the greedy sequence's teacher-forced logits)."""
  for b, (got, ref) in enumerate(zip(beam1, greedy)):
    if np.array_equal(got, ref):
      continue
    n = list(got).index(EOS)
    np.testing.assert_array_equal(got[:n], ref[:n], err_msg="row %d" % b)
    assert (got[n + 1:] == 0).all(), "row %d" % b
    if EOS in list(ref):
      logp = _log_probs(greedy_logits[b])
      start = int((prompts[b] != 0).sum())
      score = lambda ids, end: sum(logp[p, ids[p]] for p in range(start, end + 1))
      assert score(got, n) >= score(ref, list(ref).index(EOS)) - 1e-4, "row %d" % b


def _lm_graph():
  """Greedy, top-2 sampled and beam-1 decodes of PROMPTS, and the model's own
  teacher-forced logits on the greedy and sampled sequences."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  model = tiny_lm()
  prompts = mtf.import_tf_tensor(mesh, PROMPTS, _dims())
  greedy = model.sample_autoregressive(prompts)
  sampled = model.sample_autoregressive(prompts, temperature=1.0, sampling_keep_top_k=2)
  beam1 = model.beam_search(mtf.broadcast(prompts, _dims(beam=1)), LENGTH, alpha=0.0)
  outs = [greedy, sampled, beam1]
  for ids in [greedy, sampled]:
    logits, _ = model.call_simple(transformer.autoregressive_inputs(ids), None, False,
                                  mode="infer")
    outs.append(logits)
  return graph, mesh, outs


@pytest.fixture(scope="module")
def lm_on_one_device(tmp_path_factory):
  """_lm_graph from weights seeded here (the same whichever test builds it), its values
  on one device and their checkpoint: built once for both tests below."""
  gin.clear_config()
  tf.random.set_seed(1234)
  graph, mesh, outs = _lm_graph()
  single = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("", "", ["/cpu:0"])})
  values = [single.export_to_tf_tensor(t).numpy() for t in outs]
  checkpoint = str(tmp_path_factory.mktemp("lm_weights"))
  mtf.save_checkpoint(checkpoint, single)
  return graph, mesh, outs, values, checkpoint


def test_unitransformer_greedy_sampling_and_beam_one(lm_on_one_device):
  greedy, sampled, beam1, greedy_logits, sampled_logits = lm_on_one_device[3]
  _check_follows_argmax(greedy, greedy_logits, PROMPTS)
  _check_follows_argmax(sampled, sampled_logits, PROMPTS, top_k=2)
  _check_beam_one_is_greedy(beam1, greedy, greedy_logits, PROMPTS)
  assert beam1.shape == (BATCH, LENGTH)


def test_unitransformer_decodes_same_on_mesh(lm_on_one_device):
  graph, mesh, outs, values, checkpoint = lm_on_one_device
  # 2x2: placement lowers every device's ops eagerly, at every decoding step
  impl = mtf.PlacementMeshImpl("rows:2;cols:2", "batch:rows;vocab:cols;d_ff:cols",
                               ["/cpu:%d" % i for i in range(4)])
  split = mtf.Lowering(graph, {mesh: impl})
  mtf.restore_checkpoint(checkpoint, split)  # the same random weights
  for t, ref, what in zip(outs[:3], values[:3], ["greedy", "sampled", "beam1"]):
    np.testing.assert_array_equal(split.export_to_tf_tensor(t).numpy(), ref,
                                  err_msg=what)


def test_unitransformer_beam_search_wider_beam():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  model = tiny_lm()
  prompts = mtf.import_tf_tensor(mesh, PROMPTS, _dims())
  best = model.beam_search(mtf.broadcast(prompts, _dims(beam=3)), 2, alpha=0.6)
  got = _lower(graph, mesh, [best])[0]
  assert got.shape == (BATCH, LENGTH) and (got < VOCAB).all()
  for b in range(BATCH):
    start = int((PROMPTS[b] != 0).sum())
    np.testing.assert_array_equal(got[b, :start], PROMPTS[b, :start])
    assert (got[b, start + 2:] == 0).all(), "decoded past decode_length"


def test_bitransformer_decode_greedy_beam_one_and_beam_two():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  model = tiny_bitransformer()
  inputs_np = np.array([[4, 6, 8, 2, 0, 0], [9, 3, 0, 0, 0, 0]], np.int32)
  inputs = mtf.import_tf_tensor(mesh, inputs_np, _dims())
  greedy = model.decode(inputs)
  beam2 = model.decode(inputs, beam_size=2)
  encoded = decoding.encode_for_decoding(model, inputs, mtf.VariableDType(tf.float32))
  beam1 = decoding.beam_search(model.decoder, mtf.zeros(mesh, _dims(beam=1), tf.int32),
                               LENGTH, alpha=0.0, **encoded)
  # The teacher-forced logits of the greedy outputs, with the padding masked as decode
  # masks it.
  logits, _ = model.call_simple(inputs, greedy, False, mode="infer",
                                encoder_sequence_id=mtf.minimum(inputs, 1))
  greedy, beam2, beam1, logits = _lower(graph, mesh, [greedy, beam2, beam1, logits])
  _check_follows_argmax(greedy, logits, np.zeros_like(inputs_np))
  _check_beam_one_is_greedy(beam1, greedy, logits, np.zeros_like(inputs_np))
  assert beam2.shape == (BATCH, LENGTH) and (beam2 < VOCAB).all()


def test_decoding_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  model = tiny_lm()
  ids = mtf.zeros(mesh, _dims(), tf.int32)
  with pytest.raises(mtf.ShapeError, match="beam"):
    model.beam_search(ids, 4)
  encoder = tiny_bitransformer().encoder
  with pytest.raises(mtf.MtfError, match="encoder"):
    decoding.sample_autoregressive(encoder, ids)
  with pytest.raises(mtf.MtfError, match="beam_size"):
    tiny_bitransformer().decode(ids, beam_size=0)
