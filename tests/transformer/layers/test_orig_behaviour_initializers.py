"""Issue 32, item 1: the vocab-embedding classes make their normal-initialized variables
through `tensorflow.compat.v1.random_normal_initializer`, looked up when the variables
are made, so patching that name (as the original's own tests do with a mock) decides
their initial values. Each test patches it with a shape-keyed constant initializer and
checks the layer's outputs against numpy."""
from unittest import mock

import numpy as np
import scipy.special
import tensorflow as tf
import tensorflow.compat.v1 as tf1

import mesh_tf as mtf
from models.transformer import adaptive_softmax
from models.transformer import vocab_embeddings

VDTYPE = mtf.VariableDType(activation_dtype=tf.float32)
LENGTH = "length"


def _by_shape(table):
  """An initializer fn(shape, dtype) giving table[tuple(shape)]."""
  def init(shape, dtype=tf.float32, **unused):
    key = tuple(int(s) for s in shape)
    if key not in table:
      raise ValueError("no value for shape %s" % (key,))
    return tf.reshape(tf.constant(table[key], dtype=dtype), key)
  return init


def _counting(fn):
  """(initializer, list of requested shapes)."""
  seen = []
  def init(shape, dtype=tf.float32, **unused):
    seen.append(tuple(int(s) for s in shape))
    return fn(shape, dtype)
  return init, seen


def _patched(init):
  """Patches tf.compat.v1.random_normal_initializer to return init (any stddev)."""
  return mock.patch.object(tf1, "random_normal_initializer", return_value=init)


def _mesh():
  graph = mtf.Graph()
  return graph, mtf.Mesh(graph, "m")


def _run(graph, mesh, tensors):
  impl = mtf.PlacementMeshImpl(shape=[], layout={}, devices=[""])
  lowering = mtf.Lowering(graph, {mesh: impl})
  return [lowering.export_to_tf_tensor(t).numpy() for t in tensors], lowering


def _ids(mesh, values):
  dim = mtf.Dimension(LENGTH, len(values))
  return mtf.import_tf_tensor(mesh, tf.constant(values, tf.int32), mtf.Shape([dim]))


def _hidden(mesh, values, model_dim):
  values = np.asarray(values, np.float32)
  dim = mtf.Dimension(LENGTH, values.shape[0])
  return mtf.import_tf_tensor(mesh, tf.constant(values), mtf.Shape([dim, model_dim]))


def test_patching_tf1_name_is_seen_by_the_module_object_the_port_uses():
  assert tf.compat.v1 is tf1


def test_factorized_embedding_uses_patched_initializer():
  graph, mesh = _mesh()
  vocab, model = mtf.Dimension("vocab", 3), mtf.Dimension("model", 2)
  init, seen = _counting(lambda shape, dtype: tf.reshape(
      1 + tf.range(int(np.prod(shape)), dtype=dtype), shape))
  with _patched(init) as factory:
    emb = vocab_embeddings.FactorizedVocabEmbedding(
        mesh, vocab, model, VDTYPE, "embedding", None, inner_dimension_size=1)
    ids = _ids(mesh, [0, 1, 2, 1])
    hidden = _hidden(mesh, [[1, 0], [0, 1], [1, 1], [2, 1]], model)
    out, logits = emb.ids_to_embedding(ids, None), emb.hidden_to_logits(hidden, None)
    (got_emb, got_logits), _ = _run(graph, mesh, [out, logits])
  # Both factors are normal with stddev inner**-0.25, as the original makes them.
  assert [c.kwargs.get("stddev") for c in factory.call_args_list] == [1.0, 1.0]
  assert sorted(seen) == [(1, 2), (3, 1)]
  f1, f2 = np.arange(1, 4, dtype=np.float32)[:, None], np.array([[1, 2]], np.float32)
  np.testing.assert_allclose(got_emb, f1[[0, 1, 2, 1]] @ f2)
  h = np.array([[1, 0], [0, 1], [1, 1], [2, 1]], np.float32) * 2 ** -0.5
  np.testing.assert_allclose(got_logits, h @ f2.T @ f1.T, rtol=1e-6)


def test_factorized_embedding_default_stddev_is_inner_to_minus_quarter():
  graph, mesh = _mesh()
  with _patched(tf1.zeros_initializer()) as factory:
    vocab_embeddings.FactorizedVocabEmbedding(
        mesh, mtf.Dimension("vocab", 3), mtf.Dimension("model", 2), VDTYPE,
        "embedding", None, inner_dimension_size=16)
  assert [c.kwargs.get("stddev") for c in factory.call_args_list] == [0.5, 0.5]
  del graph


def test_adaptive_vocab_embedding_uses_patched_initializer():
  graph, mesh = _mesh()
  vocab, model = mtf.Dimension("vocab", 5), mtf.Dimension("model", 2)
  table = {(2, 2): [[0, 1], [2, 0]], (3, 1): [[1], [2], [3]], (1, 2): [[1, 2]]}
  with _patched(_by_shape(table)):
    emb = vocab_embeddings.AdaptiveVocabEmbedding(
        mesh, vocab, model, VDTYPE, "embedding", None,
        clusters=[{"token_count": 2, "embedding_size": 2},
                  {"token_count": 3, "embedding_size": 1}])
    ids = _ids(mesh, [0, 1, 2, 3, 4, 0])
    hidden = _hidden(mesh, [[1, 0], [0, 1], [1, 1], [2, 1]], model)
    out, logits = emb.ids_to_embedding(ids, None), emb.hidden_to_logits(hidden, None)
    (got_emb, got_logits), _ = _run(graph, mesh, [out, logits])
  full = np.concatenate([np.array(table[(2, 2)], np.float32),
                         np.array(table[(3, 1)], np.float32) @ np.array(table[(1, 2)])])
  np.testing.assert_allclose(got_emb, full[[0, 1, 2, 3, 4, 0]])
  h = np.array([[1, 0], [0, 1], [1, 1], [2, 1]], np.float32) * 2 ** -0.5
  np.testing.assert_allclose(got_logits, h @ full.T, rtol=1e-6)


def test_mixture_of_softmaxes_uses_patched_initializer():
  graph, mesh = _mesh()
  vocab, model = mtf.Dimension("vocab", 4), mtf.Dimension("model", 3)
  emb_w = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 1]], np.float32)
  mix_w = np.array([[1, 0, 0], [0, 1, 1]], np.float32)
  ctx_w = np.array([np.eye(3), np.eye(3)[::-1]], np.float32)
  table = {(4, 3): emb_w, (2, 3): mix_w, (2, 3, 3): ctx_w}
  with _patched(_by_shape(table)):
    emb = vocab_embeddings.MixtureOfSoftmaxes(mesh, vocab, model, VDTYPE, "embedding",
                                              None, num_softmaxes=2)
    raw = np.array([[1.0, 1.0, 2.0]], np.float32) * 3 ** 0.5
    logits = emb.hidden_to_logits(_hidden(mesh, raw, model), None)
    (got,), _ = _run(graph, mesh, [logits])
  h = raw[0] * 3 ** -0.5
  prior = scipy.special.softmax(mix_w @ h)
  # context weights are [component, _model_copy, model]: h (copy) -> model.
  probs = sum(prior[k] * scipy.special.softmax(emb_w @ np.tanh(h @ ctx_w[k]))
              for k in range(2))
  np.testing.assert_allclose(got[0], np.log(probs), rtol=1e-5, atol=1e-6)


def test_mixtape_uses_patched_initializer_for_every_normal_table():
  graph, mesh = _mesh()
  vocab, model = mtf.Dimension("vocab", 5), mtf.Dimension("model", 2)
  table = {(5, 2): np.arange(10), (4, 2, 2): np.arange(16), (3, 1, 2): np.arange(6),
           (2, 1): np.arange(2), (3, 2): np.arange(6), (2, 3): np.arange(6)}
  init, seen = _counting(_by_shape(table))
  with _patched(init) as factory:
    emb = vocab_embeddings.Mixtape(mesh, vocab, model, VDTYPE, "embedding", None,
                                   gate_embedding_size=1, frequent_token_fraction=0.4)
    out = emb.ids_to_embedding(_ids(mesh, [0, 1, 2, 3, 4]), None)
    (got,), lowering = _run(graph, mesh, [out])
  # Embedding, context weights, prior weights, prior vocab/gates vectors, prior bias;
  # the two biases start at zero. Every one with the TF1 default (unit) stddev.
  assert sorted(seen) == sorted([(5, 2), (4, 2, 2), (3, 1, 2), (2, 1), (3, 2), (2, 3)])
  assert all(c.kwargs.get("stddev", 1.0) == 1.0 for c in factory.call_args_list)
  np.testing.assert_allclose(got, np.arange(10).reshape(5, 2))
  values = {v.name: laid.read_full().numpy() for v, laid in lowering.variables.items()}
  np.testing.assert_allclose(values["embedding_context_weights"],
                             np.arange(16).reshape(4, 2, 2))
  np.testing.assert_array_equal(values["embedding_context_weights_bias"], 0)


def test_adaptive_softmax_uses_patched_initializer():
  graph, mesh = _mesh()
  vocab, model = mtf.Dimension("vocab", 8), mtf.Dimension("model", 2)
  table = {(5, 2): [[1, 6], [2, 7], [3, 8], [4, 9], [5, 10]],
           (3, 2): [[11, 14], [12, 15], [13, 16]], (2, 1): [[17], [18]],
           (1, 2): [[19, 20]]}
  with _patched(_by_shape(table)):
    emb = adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(
        mesh, vocab, model, VDTYPE, "embedding", None,
        clusters=[{"token_count": 3, "embedding_size": 2},
                  {"token_count": 3, "embedding_size": 2},
                  {"token_count": 2, "embedding_size": 1}])
    context = mock.MagicMock()
    context.mode = "eval"
    context.train = False
    logits = emb.hidden_to_logits(_hidden(mesh, [[1, 0], [0, 2]], model), context)
    (got,), _ = _run(graph, mesh, [logits])

  def log_softmax(a):
    a = np.asarray(a, np.float64) * 2 ** -0.5
    return a - scipy.special.logsumexp(a)
  head = np.array(table[(5, 2)], np.float64)
  tail1 = np.array(table[(3, 2)], np.float64)
  tail2 = np.array(table[(2, 1)], np.float64) @ np.array(table[(1, 2)], np.float64)
  for row, h in zip(got, np.array([[1, 0], [0, 2]], np.float64)):
    hs = log_softmax(head @ h)
    expected = np.concatenate([hs[:3], hs[3] + log_softmax(tail1 @ h),
                               hs[4] + log_softmax(tail2 @ h)])
    np.testing.assert_allclose(row, expected, atol=5e-5)


def test_embedding_weights_default_is_tf1_unit_normal_looked_up_at_call_time():
  graph, mesh = _mesh()
  init = _by_shape({(3, 2): [[1, 2], [3, 4], [5, 6]], (2, 3, 2): np.arange(12)})
  with _patched(init) as factory:
    w = mtf.layers.embedding_weights(mesh, mtf.Dimension("vocab", 3),
                                     mtf.Dimension("model", 2), VDTYPE)
    # ensemble_dim may be a list of leading dims, as in the original.
    w2 = mtf.layers.embedding_weights(mesh, mtf.Dimension("vocab", 3),
                                      mtf.Dimension("model", 2), VDTYPE, name="e2",
                                      ensemble_dim=[mtf.Dimension("ens", 2)])
    (got, got2), _ = _run(graph, mesh, [w, w2])
  assert factory.call_count == 2 and factory.call_args_list[0] == mock.call()
  np.testing.assert_allclose(got, [[1, 2], [3, 4], [5, 6]])
  np.testing.assert_allclose(got2, np.arange(12).reshape(2, 3, 2))
  # Unpatched, the default is TF1's stddev-1 normal (not TF2's 0.05).
  graph, mesh = _mesh()
  w = mtf.layers.embedding_weights(mesh, mtf.Dimension("vocab", 64),
                                   mtf.Dimension("model", 64), VDTYPE)
  (got,), _ = _run(graph, mesh, [w])
  assert 0.8 < got.std() < 1.2


def test_vocab_embedding_uses_patched_initializer():
  graph, mesh = _mesh()
  vocab, model = mtf.Dimension("vocab", 3), mtf.Dimension("model", 2)
  with _patched(_by_shape({(3, 2): [[1, 2], [3, 4], [5, 6]]})) as factory:
    emb = vocab_embeddings.VocabEmbedding(mesh, vocab, model, VDTYPE, "embedding", None,
                                          scale_variable_like_classifier_weights=True)
    out = emb.ids_to_embedding(_ids(mesh, [2, 0]), None)
    (got,), _ = _run(graph, mesh, [out])
  assert factory.call_args_list[0].kwargs.get("stddev") == 2 ** -0.5
  np.testing.assert_allclose(got, np.array([[5, 6], [1, 2]]) * 2 ** 0.5, rtol=1e-6)
