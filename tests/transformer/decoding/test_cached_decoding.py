"""Cached (incremental) decoding equals recomputing the prefix at every step.

Each test builds the same tiny seeded model twice, once decoding from the key/value
caches ("first_part" prefill, then one position per step) and once recomputing the
whole prefix (`decoding.decoding_mode(cached=False)`), lowers the recompute graph on
one device, and checks that the cached graph, given the same weights (through a
checkpoint), decodes the same ids -- and beam scores within float tolerance -- on one
device, on a 2x2 dp+mp placement mesh, in SIMD emulation and under GSPMD. The plain
LM's pair is built once (a module fixture) for its checks on all four.
"""
import collections

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer import decoding
from models.transformer import transformer
from models.transformer import transformer_layers as tl

# The vocab dim is padded to 16. Prompts of 3 and 4 ids: the first_part prefill fills
# the caches up to there, then 2 or 3 steps each write the next position and read the
# ones the steps before them wrote, up to the caches' last position (each step is
# lowered again eagerly: the cost of these tests).
BATCH, LENGTH, VOCAB = 2, 6, 10
PROMPTS = np.array([[5, 7, 8, 0, 0, 0], [3, 9, 4, 6, 0, 0]], np.int32)
ENCODER_INPUTS = np.array([[4, 6, 8, 2, 0, 0], [9, 3, 0, 0, 0, 0]], np.int32)
BEAM_DECODE_LENGTH = 2  # from position 3 the beams stop one position before the end
DP_MP = ("rows:2;cols:4", "batch:rows;heads:cols;d_ff:cols;vocab:cols")
# Placement runs each processor's ops eagerly, so its dp+mp mesh is 2x2 (the SIMD and
# GSPMD backends, one program for all processors, take the 2x4 mesh).


def placement_dp_mp(layout=DP_MP[1]):
  """A 2x2 placement mesh: batch over rows, the model dims over cols."""
  return mtf.PlacementMeshImpl("rows:2;cols:2", layout, ["/cpu:%d" % i for i in range(4)])

FLOAT = mtf.VariableDType(tf.float32)


@pytest.fixture(autouse=True)
def _no_gin_bindings_and_seeded_weights():
  """The equalities hold for any weights; a fixed draw keeps a failure reproducible."""
  gin.clear_config()
  tf.random.set_seed(1234)
  yield
  gin.clear_config()


def _stack(layers):
  for i, layer in enumerate(layers):
    layer.set_name("block_000/layer_%03d" % i)
  return transformer.LayerStack(layers)


def _attention(cls=tl.SelfAttention, **kwargs):
  return cls(num_heads=4, key_value_size=4, **kwargs)


def _lm(layers):
  return transformer.Unitransformer(
      layer_stack=_stack(layers), d_model=16, input_vocab_size=VOCAB,
      output_vocab_size=VOCAB, autoregressive=True, max_length=LENGTH, vocab_divisor=8)


LM_LAYERS = {
    "plain": lambda: [_attention(), tl.DenseReluDense(hidden_size=16)],
    # relative-position biases, multi-query heads, shared keys/values, local windows
    # and parallel layers each keep their own caches.
    "variants": lambda: [
        _attention(relative_attention_type="bias", num_memory_heads=1),
        _attention(tl.LocalSelfAttention, radius=3, shared_kv=True),
        tl.ParallelLayer([tl.DenseReluDense(hidden_size=8),
                          _attention(relative_attention_type="bias_shared")]),
        _attention(relative_attention_type="contextual")],
    # convolutions keep their last inputs as their states.
    "conv": lambda: [
        tl.LocalConvAttnBlock(-2, 0, 16, attention_type="dynamic_conv"),
        tl.SeparableConv1DLayer(-1, 0, 16),
        tl.LightweightConv1DLocalAttn(-2, 0, 16, num_unique_depth_filters=2),
        _attention()],
    # talking heads cache the memory too for its dynamic projections; the general
    # bilinear attention caches only the memory.
    "talking_heads": lambda: [
        tl.TalkingHeadsSelfAttention(
            key_heads_dims=[("heads", 4)], softmax_heads_dims=[("softmax_heads", 2)],
            value_heads_dims=[("heads", 4)], key_size=4, value_size=4,
            dynamic_projections=["x2l", "m2w"]),
        tl.GeneralBilinearSelfAttention(heads_dims=[("heads", 4)])],
}


def _bitransformer():
  encoder = transformer.Unitransformer(
      layer_stack=_stack([_attention(), tl.DenseReluDense(hidden_size=16)]), d_model=16,
      input_vocab_size=VOCAB, output_vocab_size=None, autoregressive=False,
      max_length=LENGTH, name="encoder", vocab_divisor=8)
  decoder = transformer.Unitransformer(
      layer_stack=_stack([_attention(), _attention(tl.EncDecAttention),
                          tl.DenseReluDense(hidden_size=16)]),
      d_model=16, input_vocab_size=VOCAB, output_vocab_size=VOCAB, autoregressive=True,
      max_length=LENGTH, name="decoder", vocab_divisor=8)
  return transformer.Bitransformer(encoder, decoder)


def _dims(beam=None):
  batch, length = mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)
  return [batch] + ([mtf.Dimension("beam", beam)] if beam else []) + [length]


def _lm_program(layers_name, cached):
  """Greedy, top-3 sampled and 3-beam decodes of PROMPTS, with the beam scores."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  model = _lm(LM_LAYERS[layers_name]())
  prompts = mtf.import_tf_tensor(mesh, PROMPTS, _dims())
  with decoding.decoding_mode(cached):
    greedy = model.sample_autoregressive(prompts)
    sampled = model.sample_autoregressive(prompts, temperature=1.0, sampling_keep_top_k=3)
    beams, scores = decoding.beam_search_with_scores(
        model, mtf.broadcast(prompts, _dims(beam=3)), BEAM_DECODE_LENGTH, FLOAT, 0.6,
        decoding._model_kwargs(None, None, None, None, None))  # pylint: disable=protected-access
  return graph, mesh, [greedy, sampled, beams, scores], model


def _bitransformer_program(cached):
  """Greedy and 2-beam decodes of ENCODER_INPUTS."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  model = _bitransformer()
  inputs = mtf.import_tf_tensor(mesh, ENCODER_INPUTS, _dims())
  with decoding.decoding_mode(cached):
    greedy = model.decode(inputs)
    beam2 = model.decode(inputs, beam_size=2)
  return graph, mesh, [greedy, beam2], model.decoder


def _single():
  return mtf.PlacementMeshImpl("", "", ["/cpu:0"])


def _export(graph, mesh, impl, tensors, checkpoint):
  """tensors lowered on impl with the weights of checkpoint (GSPMD inside a
  tf.function, as the trainer runs it)."""
  lowering = mtf.Lowering(graph, {mesh: impl})
  mtf.restore_checkpoint(checkpoint, lowering)
  if impl.needs_xla:
    run = tf.function(lambda: [mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(t)
                               for t in tensors])
    return [t.numpy() for t in run()]
  return [lowering.export_to_tf_tensor(t).numpy() for t in tensors]


def _reference(program, tmp_path):
  """The recompute path's results on one device, and a checkpoint of its weights."""
  graph, mesh, tensors, model = program(False)
  lowering = mtf.Lowering(graph, {mesh: _single()})
  expected = [lowering.export_to_tf_tensor(t).numpy() for t in tensors]
  checkpoint = str(tmp_path / "weights")
  mtf.save_checkpoint(checkpoint, lowering)
  return expected, checkpoint, model


def _assert_same(got, expected, labels):
  for g, e, label in zip(got, expected, labels):
    if np.issubdtype(e.dtype, np.integer):
      np.testing.assert_array_equal(g, e, err_msg=label)
    else:
      np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-4, err_msg=label)


LM_LABELS = ["greedy", "sampled", "beams", "beam scores"]

LmCase = collections.namedtuple(
    "LmCase", ["expected", "checkpoint", "graph", "mesh", "tensors", "model"])


def _lm_case(layers_name, tmp_path):
  """An LM of LM_LAYERS: the recompute path's results on one device (weights seeded
  here: the same whichever test builds it), their checkpoint and the cached program."""
  tf.random.set_seed(1234)
  program = lambda cached: _lm_program(layers_name, cached)
  expected, checkpoint, _ = _reference(program, tmp_path)
  return LmCase(expected, checkpoint, *program(True))


@pytest.fixture(scope="module")
def plain_lm(tmp_path_factory):
  """The plain LM's case, built once for its checks on every backend."""
  gin.clear_config()
  return _lm_case("plain", tmp_path_factory.mktemp("plain_lm"))


def _check_one_device_and_dp_mp(case):
  assert decoding.supports_incremental_decoding(case.model)
  for impl in (_single(), placement_dp_mp()):
    _assert_same(_export(case.graph, case.mesh, impl, case.tensors, case.checkpoint),
                 case.expected, LM_LABELS)


@pytest.mark.parametrize("layers_name", sorted(set(LM_LAYERS) - {"plain"}))
def test_lm_cached_equals_recompute_on_one_device_and_dp_mp(layers_name, tmp_path):
  _check_one_device_and_dp_mp(_lm_case(layers_name, tmp_path))


def test_plain_lm_cached_equals_recompute_on_one_device_and_dp_mp(plain_lm):
  _check_one_device_and_dp_mp(plain_lm)


@pytest.mark.parametrize("backend", ["simd", "gspmd"])
def test_lm_cached_equals_recompute_on_other_backends(backend, plain_lm):
  impl = {"simd": mtf.SimdMeshImpl, "gspmd": mtf.GSPMDMeshImpl}[backend](*DP_MP)
  _assert_same(_export(plain_lm.graph, plain_lm.mesh, impl, plain_lm.tensors,
                       plain_lm.checkpoint), plain_lm.expected, LM_LABELS)


def test_bitransformer_cached_equals_recompute(tmp_path):
  expected, checkpoint, _ = _reference(_bitransformer_program, tmp_path)
  graph, mesh, tensors, decoder = _bitransformer_program(True)
  assert decoding.supports_incremental_decoding(decoder)
  labels = ["greedy", "beam2"]
  _assert_same(_export(graph, mesh, _single(), tensors, checkpoint), expected, labels)
  impl = placement_dp_mp()
  _assert_same(_export(graph, mesh, impl, tensors, checkpoint), expected, labels)


def test_cached_path_runs_one_position_per_step():
  """The cached loop's model call sees no length dim: its logits are [batch, vocab]
  and its states are the [batch, memory_length, heads, d_kv] caches of each layer."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  model = _lm(LM_LAYERS["plain"]())
  prompts = mtf.import_tf_tensor(mesh, PROMPTS, _dims())
  kwargs = decoding._model_kwargs(None, None, None, None, None)  # pylint: disable=protected-access
  states, _ = decoding._prefill(model, prompts, 0, FLOAT, kwargs)  # pylint: disable=protected-access
  assert [s.shape.dimension_names for s in states] == [
      ["batch", "memory_length", "heads", "d_kv"]] * 2
  logits_fn = decoding._incremental_logits_fn(model, FLOAT, 0, kwargs)  # pylint: disable=protected-access
  logits, new_states = logits_fn(mtf.constant(mesh, 3, dtype=tf.int32), prompts, states)
  assert logits.shape.dimension_names == ["batch", "vocab"]
  assert [s.shape for s in new_states] == [s.shape for s in states]


def test_encoder_keys_and_values_are_computed_once():
  """A decoder's EncDecAttention projects the encoder output in first_part mode only;
  each step reads those keys and values (constant states)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  model = _bitransformer()
  inputs = mtf.import_tf_tensor(mesh, ENCODER_INPUTS, _dims())
  encoded = decoding.encode_for_decoding(model, inputs, FLOAT)
  ids = mtf.zeros(mesh, _dims(), tf.int32)
  states, constant = decoding._prefill(model.decoder, ids, 0, FLOAT, encoded)  # pylint: disable=protected-access
  assert len(states) == 2 and len(constant) == 1
  k, v = constant[0]
  assert k.shape.dimension_names == ["batch", "memory_length", "heads", "d_kv"]
  logits_fn = decoding._incremental_logits_fn(model.decoder, FLOAT, 0, encoded,  # pylint: disable=protected-access
                                              constant_states=constant)
  num_ops = len(graph.operations)
  logits_fn(mtf.constant(mesh, 0, dtype=tf.int32), ids, states)
  step_ops = graph.operations[num_ops:]
  # No op of the step reads the encoder output: the projections are not redone.
  assert not any(encoded["encoder_output"] in op.inputs for op in step_ops)


def test_models_without_incremental_layers_fall_back_to_recompute():
  """Layers that need the whole sequence (task prompts, a 'hybrid' attention) and
  models with a fully attended inputs region decode by recomputing; the flag and gin
  turn the cached path off."""
  assert not decoding.supports_incremental_decoding(
      _lm([_attention(use_hyperprompt=True, hyperprompt_length_decoder=2,
                      hyperprompt_hidden_dim=4)]))
  assert not decoding.supports_incremental_decoding(
      _lm([_attention(attention_func="hybrid")]))
  delimited = transformer.Unitransformer(
      layer_stack=_stack([_attention()]), d_model=16, input_vocab_size=VOCAB,
      output_vocab_size=VOCAB, autoregressive=True, max_length=LENGTH, vocab_divisor=8,
      input_full_attention=True)
  assert not decoding.supports_incremental_decoding(delimited)
  model = _lm(LM_LAYERS["plain"]())
  assert decoding._cached(model)  # pylint: disable=protected-access
  with decoding.decoding_mode(False):
    assert not decoding._cached(model)  # pylint: disable=protected-access
  gin.parse_config("decoding.use_cached_decoding.cached = False")
  assert not decoding._cached(model)  # pylint: disable=protected-access


def _graph_ops(concrete):
  """Op types of a concrete function's graph and of every function it calls."""
  graph_def = concrete.graph.as_graph_def()
  ops = [n.op for n in graph_def.node]
  for f in graph_def.library.function:
    ops += [n.op for n in f.node_def]
  return ops


@pytest.mark.parametrize("mesh", ["single", "dp_mp"])
def test_decode_graph_lm_beam_search_cached_equals_recompute(mesh, tmp_path):
  """decode mode's DecodeGraph (utils.decode_options.beam_size = 2 on an LM): the
  continuation of each prompt, the same by both paths. Traced, the cached loop writes
  each step's cache position into its own buffers on placement (InplaceUpdate, after
  one private copy of each cache), and the second call starts from nothing the first
  one wrote."""
  from models.transformer.trainer import decode_io  # pylint: disable=g-import-not-at-top
  results = []
  for cached in (False, True):
    with decoding.decoding_mode(cached):
      graph = decode_io.DecodeGraph(_lm(LM_LAYERS["plain"]()), BATCH, LENGTH, FLOAT,
                                    beam_size=2)
    impl = _single() if mesh == "single" else placement_dp_mp()
    decode = graph.make_decode_fn(impl)
    checkpoint = str(tmp_path / "weights")
    if cached:
      mtf.restore_checkpoint(checkpoint, impl)
    else:
      mtf.save_checkpoint(checkpoint, graph.lowering(impl))
    results.append(decode(tf.constant(PROMPTS)).numpy())
    if cached:
      ops = _graph_ops(decode.get_concrete_function(tf.constant(PROMPTS)))
      assert "InplaceUpdate" in ops and "DeepCopy" in ops
      assert "TensorScatterUpdate" not in ops
      np.testing.assert_array_equal(decode(tf.constant(PROMPTS)).numpy(), results[-1])
  np.testing.assert_array_equal(results[1], results[0])
  prompt = PROMPTS != 0
  assert (results[0][prompt] == 0).all() and (results[0][~prompt] != 0).any()
