"""Cached decoding of the zoo's layers equals recomputing the prefix.

The Synthesizer keeps its keys and values in the decoding caches and reads the row of
its learned logits at the decoded position; the encoder-decoder variants (talking
heads, general bilinear, branched, transparent) compute what they need of the encoder
output once, in "first_part" mode; position-wise layers (gated linear unit, product-key
memory, Fixup feed-forward) need no state. Each test decodes with the caches and with
`decoding_mode(cached=False)` on the same weights (the recompute graph's checkpoint)
and compares the ids and beam scores on one device and on a dp+mp placement mesh (the
Synthesizer also in SIMD emulation).
"""
import gin
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import decoding
from models.transformer import evolved_transformer
from models.transformer import fixup_layers
from models.transformer import memory_layers
from models.transformer import transformer
from models.transformer import transformer_layers as tl
import test_cached_decoding
from test_cached_decoding import (  # pylint: disable=g-multiple-import
    BEAM_DECODE_LENGTH, DP_MP, ENCODER_INPUTS, FLOAT, LENGTH, PROMPTS, VOCAB,
    _assert_same, _dims, _export, _reference, _single, _stack, placement_dp_mp)


@pytest.fixture(autouse=True)
def _no_gin_bindings_and_seeded_weights():
  gin.clear_config()
  tf.random.set_seed(4321)
  yield
  gin.clear_config()


def _synthesizer(mode):
  return tl.Synthesizer(num_heads=4, key_value_size=4, synthesize_mode=mode,
                        attention_kwargs={"max_length": LENGTH, "factorized_dim": 3})


LM_LAYERS = {
    "random_plus_alpha": lambda: [_synthesizer("random_plus_alpha"),
                                  tl.DenseReluDense(hidden_size=16)],
    # no query projection: the logits are the table alone; shared keys/values.
    "factorized": lambda: [_synthesizer("factorized"), _synthesizer("random")],
    "dense": lambda: [_synthesizer("dense_minus"), _synthesizer("dense_plus")],
    # position-wise layers (no state) and the Evolved Transformer's attention.
    "position_wise": lambda: [
        evolved_transformer.GatedLinearUnitLayer(),
        memory_layers.ProductKeyValueMemory(key_size=8, n_keys=4, n_heads=2, knn=2),
        evolved_transformer.DecoderAttentionLayer(base_num_heads=2),
        fixup_layers.DenseReluDenseFixup(hidden_size=16, num_blocks=2)],
}


def _lm_program(layers_name, cached):
  """Greedy decode and 2-beam search (with scores) of PROMPTS by an LM of LM_LAYERS."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  model = transformer.Unitransformer(
      layer_stack=_stack(LM_LAYERS[layers_name]()), d_model=16,
      input_vocab_size=VOCAB, output_vocab_size=VOCAB, autoregressive=True,
      max_length=LENGTH, vocab_divisor=8)
  prompts = mtf.import_tf_tensor(mesh, PROMPTS, _dims())
  with decoding.decoding_mode(cached):
    greedy = model.sample_autoregressive(prompts)
    beams, scores = decoding.beam_search_with_scores(
        model, mtf.broadcast(prompts, _dims(beam=2)), BEAM_DECODE_LENGTH, FLOAT, 0.6,
        decoding._model_kwargs(None, None, None, None, None))  # pylint: disable=protected-access
  return graph, mesh, [greedy, beams, scores], model


def _enc_dec_layers():
  """One of each encoder-decoder variant (transparent: 1 module of 2 encoder layers)."""
  th = tl.TalkingHeadsEncDecAttention(
      key_heads_dims=[("heads", 4)], softmax_heads_dims=[("softmax_heads", 2)],
      value_heads_dims=[("heads", 4)], key_size=4, value_size=4,
      dynamic_projections=["x2l", "m2w"])
  return [tl.SelfAttention(num_heads=4, key_value_size=4), th,
          tl.GeneralBilinearEncDecAttention(heads_dims=[("heads", 4)]),
          tl.BranchedEncDecAttention(num_heads=4, key_value_size=4),
          tl.TransparentEncDecAttention(
              layers_per_encoder_module=2, layers_per_decoder_module=8,
              encoder_num_modules=1, decoder_num_modules=1, num_heads=4,
              key_value_size=4)]


def _enc_dec_program(cached):
  """Greedy and 2-beam decodes of ENCODER_INPUTS by a decoder of the variants."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  encoder = transformer.Unitransformer(
      layer_stack=_stack([tl.SelfAttention(num_heads=4, key_value_size=4),
                          tl.DenseReluDense(hidden_size=16)]),
      d_model=16, input_vocab_size=VOCAB, output_vocab_size=None, autoregressive=False,
      max_length=LENGTH, name="encoder", vocab_divisor=8)
  decoder = transformer.Unitransformer(
      layer_stack=_stack(_enc_dec_layers()), d_model=16, input_vocab_size=VOCAB,
      output_vocab_size=VOCAB, autoregressive=True, max_length=LENGTH, name="decoder",
      vocab_divisor=8)
  model = transformer.Bitransformer(encoder, decoder)
  inputs = mtf.import_tf_tensor(mesh, ENCODER_INPUTS, _dims())
  with decoding.decoding_mode(cached):
    greedy = model.decode(inputs)
    beam2 = model.decode(inputs, beam_size=2)
  return graph, mesh, [greedy, beam2], decoder


@pytest.mark.parametrize("layers_name", sorted(LM_LAYERS))
def test_lm_cached_equals_recompute(layers_name, tmp_path):
  program = lambda cached: _lm_program(layers_name, cached)
  expected, checkpoint, _ = _reference(program, tmp_path)
  graph, mesh, tensors, model = program(True)
  assert decoding.supports_incremental_decoding(model)
  labels = ["greedy", "beams", "beam scores"]
  _assert_same(_export(graph, mesh, _single(), tensors, checkpoint), expected, labels)
  _assert_same(_export(graph, mesh, placement_dp_mp(), tensors, checkpoint), expected, labels)
  if layers_name == "random_plus_alpha":
    _assert_same(_export(graph, mesh, mtf.SimdMeshImpl(*DP_MP), tensors, checkpoint),
                 expected, labels)


def test_enc_dec_variants_cached_equals_recompute(tmp_path):
  expected, checkpoint, _ = _reference(_enc_dec_program, tmp_path)
  graph, mesh, tensors, decoder = _enc_dec_program(True)
  assert decoding.supports_incremental_decoding(decoder)
  labels = ["greedy", "beam2"]
  _assert_same(_export(graph, mesh, _single(), tensors, checkpoint), expected, labels)
  # the branched layer's feed-forward has both heads and d_ff: d_ff stays whole.
  dp_mp = placement_dp_mp("batch:rows;heads:cols;vocab:cols")
  _assert_same(_export(graph, mesh, dp_mp, tensors, checkpoint), expected, labels)


def test_enc_dec_variants_with_relative_attention_recompute():
  """A relative_attention_type needs the whole target sequence: no cached decoding."""
  for layer in [tl.TalkingHeadsEncDecAttention(relative_attention_type="bias"),
                tl.GeneralBilinearEncDecAttention(relative_attention_type="bias"),
                tl.BranchedEncDecAttention(relative_attention_type="bias")]:
    assert not decoding.layer_supports_incremental(layer), type(layer).__name__
  for layer in _enc_dec_layers():
    assert decoding.layer_supports_incremental(layer), type(layer).__name__


def test_experts_self_attention_cached_decoding_equals_recompute(tmp_path, monkeypatch):
  """One position per step routes through the same experts as the whole prefix (no
  token dropped: groups of one token; the layer stack has no layout to size groups by,
  so one-token groups also let the dp+mp mesh split them)."""
  tf.random.set_seed(1234)
  monkeypatch.setitem(test_cached_decoding.LM_LAYERS, "experts", lambda: [
      tl.ExpertsSelfAttention(num_heads=4, key_value_size=4, shared_kv=True,
                              num_experts=4, hidden_size=8, group_size=1,
                              capacity_factor_eval=4.0, min_expert_capacity=1),
      tl.DenseReluDense(hidden_size=16)])
  test_cached_decoding.test_lm_cached_equals_recompute_on_one_device_and_dp_mp(
      "experts", tmp_path)
