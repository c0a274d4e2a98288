"""AdaptiveVocabEmbedding, MixtureOfSoftmaxes and Mixtape: ids_to_embedding and
hidden_to_logits, forward and every gradient (w.r.t. the hidden state and each
variable) against plain TF from the same weights, on one device and on a dp+mp layout
(placement and SIMD emulation); their variable names; use inside a Unitransformer."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from layers.layer_testing import check_layer
from models.transformer import vocab_embeddings as ve

VOCAB, D = 16, 8
BATCH, LENGTH = mtf.Dimension("batch", 2), mtf.Dimension("length", 4)
VOCAB_DIM, D_DIM = mtf.Dimension("vocab", VOCAB), mtf.Dimension("d_model", D)

CASES = [("placement", "", ""),
         ("placement", "rows:2;cols:4", "batch:rows;vocab:cols"),
         ("simd", "rows:2;cols:4", "batch:rows;d_model:cols")]
CASE_IDS = ["single", "placement_dp_mp", "simd_dp_mp"]


def _inputs(seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(0, VOCAB, size=(2, 4)).astype(np.int32)
  ids[0, :2] = [0, VOCAB - 1]  # both ends of the vocab
  hidden = rng.normal(size=(2, 4, D)).astype(np.float32)
  return [(ids, [BATCH, LENGTH]), (hidden, [BATCH, LENGTH, D_DIM])]


def _check(case, make, reference, rtol=1e-5, atol=1e-5):
  def build(ids, hidden):
    with mtf.variable_scope("decoder"):
      embedding = make(ids.mesh)
      return [embedding.ids_to_embedding(ids, None),
              embedding.hidden_to_logits(hidden, None)]
  _, params = check_layer(mtf_testing.backend_mesh_impl(*case), _inputs(), build,
                          lambda xs, p: reference(xs[0], xs[1], {
                              k[len("decoder/"):]: v for k, v in p.items()}),
                          rtol=rtol, atol=atol)
  return params


def _plain_logits(hidden, table):
  return tf.einsum("bld,vd->blv", hidden * D ** -0.5, table)


CLUSTERS = [{"token_count": 8, "embedding_size": D}, {"token_count": 4,
                                                      "embedding_size": 4},
            {"token_count": 4, "embedding_size": 2}]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_adaptive_vocab_embedding_matches_tf(case):
  def reference(ids, hidden, p):
    tables = [p["embedding_0"], p["embedding_11"] @ p["embedding_12"],
              p["embedding_21"] @ p["embedding_22"]]
    full = tf.concat(tables, 0)
    return tf.gather(full, ids), _plain_logits(hidden, full)
  params = _check(case, lambda mesh: ve.AdaptiveVocabEmbedding(
      mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(tf.float32), "embedding", None,
      clusters=CLUSTERS), reference)
  assert {k: v.shape for k, v in params.items()} == {
      "decoder/embedding_0": (8, D), "decoder/embedding_11": (4, 4),
      "decoder/embedding_12": (4, D), "decoder/embedding_21": (4, 2),
      "decoder/embedding_22": (2, D)}


def test_adaptive_clusters_must_cover_the_vocab():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  with pytest.raises(mtf.ShapeError, match="sum to 12.*vocab.*16"):
    ve.AdaptiveVocabEmbedding(mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(), "embedding",
                              None, clusters=CLUSTERS[:2])
  with pytest.raises(mtf.MtfError, match="token_count"):
    ve.AdaptiveVocabEmbedding(mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(), "embedding",
                              None, clusters=[{"size": 16}])


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_mixture_of_softmaxes_matches_tf(case):
  def reference(ids, hidden, p):
    h = hidden * D ** -0.5
    prior = tf.nn.log_softmax(tf.einsum("bld,kd->blk", h,
                                        p["embedding_mixture_weights"]))
    contexts = tf.tanh(tf.einsum("ble,ked->blkd", h, p["embedding_context_weights"]))
    component = tf.nn.log_softmax(
        tf.einsum("blkd,vd->blkv", contexts, p["embedding_embedding_weights"]), axis=-1)
    logits = tf.reduce_logsumexp(prior[..., None] + component, axis=2)
    return tf.gather(p["embedding_embedding_weights"], ids), logits
  params = _check(case, lambda mesh: ve.MixtureOfSoftmaxes(
      mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(tf.float32), "embedding", None,
      num_softmaxes=3), reference)
  assert {k: v.shape for k, v in params.items()} == {
      "decoder/embedding_embedding_weights": (VOCAB, D),
      "decoder/embedding_mixture_weights": (3, D),
      "decoder/embedding_context_weights": (3, D, D)}


def tf_mixtape(hidden, p, frequent_ids):
  """Mixtape in TF; row i of the frequent tables belongs to frequent_ids[i]."""
  g = hidden * D ** -0.5
  contexts = tf.tanh(tf.einsum("ble,ked->blkd", g, p["embedding_context_weights"]) +
                     p["embedding_context_weights_bias"])
  component = tf.einsum("blkd,vd->blkv", contexts, p["embedding_embedding_weights"])
  gate_hidden = tf.tanh(tf.einsum("ble,kfe->blkf", g, p["embedding_prior_weights"]) +
                        p["embedding_prior_weights_bias"])
  own = (tf.einsum("blkf,rf->blkr", gate_hidden, p["embedding_prior_vocab_vector"]) +
         tf.transpose(p["embedding_prior_bias"])[None, None])
  own = tf.einsum("blkr,rv->blkv", own, tf.one_hot(frequent_ids, VOCAB))
  logits = tf.einsum("ble,ke->blk", g, p["embedding_prior_gates_vector"])[..., None] + own
  s1, s2, s3 = tf.unstack(tf.sigmoid(logits), axis=2)
  weights = tf.stack([s1 * s2, s1 * (1 - s2), (1 - s1) * s3, (1 - s1) * (1 - s3)], 2)
  return tf.reduce_sum(weights * component, 2)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_mixtape_matches_tf(case):
  # ids 0-2 (a quarter of the 14 ordinary ids) and the 2 extra ids 14, 15 are frequent.
  frequent_ids = [0, 1, 2, 14, 15]

  def reference(ids, hidden, p):
    return (tf.gather(p["embedding_embedding_weights"], ids),
            tf_mixtape(hidden, p, frequent_ids))
  params = _check(case, lambda mesh: ve.Mixtape(
      mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(tf.float32), "embedding", None,
      extra_ids=2, gate_embedding_size=4, frequent_token_fraction=0.25), reference)
  assert {k: v.shape for k, v in params.items()} == {
      "decoder/embedding_embedding_weights": (VOCAB, D),
      "decoder/embedding_context_weights": (4, D, D),
      "decoder/embedding_context_weights_bias": (4, D),
      "decoder/embedding_prior_weights": (3, 4, D),
      "decoder/embedding_prior_weights_bias": (3, 4),
      "decoder/embedding_prior_vocab_vector": (5, 4),
      "decoder/embedding_prior_gates_vector": (3, D),
      "decoder/embedding_prior_bias": (5, 3)}


def test_mixtape_training_noise_and_dropout_are_layout_independent():
  from models.transformer.context import Context  # pylint: disable=g-import-not-at-top
  hidden = _inputs(2)[1]
  outs = {}
  for mode, case in (("train", CASES[0]), ("train", CASES[1]), ("eval", CASES[0])):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    h = mtf.import_tf_tensor(mesh, *hidden)
    mixtape = ve.Mixtape(mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(tf.float32),
                         "embedding", None, dropout_rate=0.5, gate_embedding_size=4,
                         noise_std_dev=1.0)
    context = Context(None, mesh, [BATCH], LENGTH, mtf.VariableDType(tf.float32),
                      mode=mode)
    logits = mixtape.hidden_to_logits(h, context)
    tf.random.set_seed(7)
    outs[(mode, case)] = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl(*case)}).export_to_tf_tensor(
        logits).numpy()
  np.testing.assert_allclose(outs[("train", CASES[0])], outs[("train", CASES[1])],
                             rtol=1e-5, atol=1e-5)
  assert np.abs(outs[("train", CASES[0])] - outs[("eval", CASES[0])]).max() > 1e-2


def test_mixtape_mixture_weights_sum_to_one_and_rare_tokens_share_gates():
  """With every context logit equal to 1, each mixed logit is the sum of the weights."""
  rng = np.random.RandomState(3)
  p = {"embedding_context_weights": tf.zeros([4, D, D]),
       "embedding_context_weights_bias": tf.fill([4, D], 10.0),
       "embedding_prior_weights": rng.normal(size=(3, 4, D)).astype(np.float32),
       "embedding_prior_weights_bias": rng.normal(size=(3, 4)).astype(np.float32),
       "embedding_prior_vocab_vector": rng.normal(size=(3, 4)).astype(np.float32),
       "embedding_prior_gates_vector": rng.normal(size=(3, D)).astype(np.float32),
       "embedding_prior_bias": rng.normal(size=(3, 3)).astype(np.float32)}
  p["embedding_embedding_weights"] = tf.one_hot(np.zeros(VOCAB, np.int32), D) / np.tanh(
      10.0)
  logits = tf_mixtape(rng.normal(size=(2, 4, D)).astype(np.float32), p, [0, 1, 2]).numpy()
  np.testing.assert_allclose(logits, 1.0, rtol=1e-5)


def test_embeddings_in_a_unitransformer_with_shared_softmax():
  import gin  # pylint: disable=g-import-not-at-top
  from models.transformer import transformer  # pylint: disable=g-import-not-at-top
  from models.transformer import transformer_layers  # pylint: disable=g-import-not-at-top
  gin.parse_config("""
      transformer.get_vocab_embedding_cls.cls = @vocab_embeddings.MixtureOfSoftmaxes
      vocab_embeddings.MixtureOfSoftmaxes.num_softmaxes = 2
  """)
  try:
    layer = transformer_layers.DenseReluDense(hidden_size=8)
    layer.set_name("block_000/layer_000")
    model = transformer.Unitransformer(
        layer_stack=transformer.LayerStack([layer]), d_model=D, input_vocab_size=VOCAB,
        output_vocab_size=VOCAB, autoregressive=True, max_length=4, vocab_divisor=8,
        shared_embedding_and_softmax_weights=True, z_loss=0.0)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    ids = mtf.import_tf_tensor(mesh, _inputs()[0][0], [BATCH, LENGTH])
    logits, loss = model.call_simple(ids, ids, compute_loss=True, mode="eval")
  finally:
    gin.clear_config()
  names = sorted(v.name for v in graph.trainable_variables)
  assert "transformer/embedding_mixture_weights" in names, names
  lowering = mtf.Lowering(graph, {mesh: mtf_testing.backend_mesh_impl(*CASES[0])})
  got = lowering.export_to_tf_tensor(logits).numpy()
  # The mixture's logits are log-probabilities already.
  np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, rtol=1e-5)
  assert np.isfinite(lowering.export_to_tf_tensor(loss).numpy())
