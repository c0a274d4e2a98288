"""AdaptiveSoftmaxVocabEmbedding and adaptive_softmax_loss_fn: embeddings, the
log-probabilities over the vocab and the loss, forward and every gradient against plain
TF from the same weights (one device, dp+mp on placement and SIMD emulation), and a
Unitransformer trained with them through gin."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from layers.layer_testing import check_layer
from models.transformer import adaptive_softmax as asm
from models.transformer import transformer
from models.transformer import transformer_layers
from models.transformer.context import Context

VOCAB, D = 16, 8
BATCH, LENGTH = mtf.Dimension("batch", 2), mtf.Dimension("length", 4)
VOCAB_DIM, D_DIM = mtf.Dimension("vocab", VOCAB), mtf.Dimension("d_model", D)
CLUSTERS = [{"token_count": 8, "embedding_size": D},
            {"token_count": 4, "embedding_size": 4, "length_projection_factor": 0.5},
            {"token_count": 4, "embedding_size": 2}]
CASES = [("placement", "", ""),
         ("placement", "rows:2;cols:4", "batch:rows;vocab:cols"),
         ("simd", "rows:2;cols:4", "batch:rows;d_model:cols")]
CASE_IDS = ["single", "placement_dp_mp", "simd_dp_mp"]


def tf_log_probs(hidden, p):
  h = hidden * D ** -0.5
  # The head's matrix has its 8 tokens' rows, then one row per tail cluster.
  tables = [p["embedding_0"][:8], p["embedding_11"] @ p["embedding_12"],
            p["embedding_21"] @ p["embedding_22"]]
  head = h @ tf.transpose(tables[0])
  clusters = h @ tf.transpose(p["embedding_0"][8:])
  norm = tf.reduce_logsumexp(tf.concat([head, clusters], -1), -1, keepdims=True)
  pieces = [head - norm]
  for i, table in enumerate(tables[1:]):
    pieces.append(clusters[..., i:i + 1] - norm +
                  tf.nn.log_softmax(h @ tf.transpose(table), -1))
  return tf.concat(pieces, -1), tf.concat(tables, 0)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_adaptive_softmax_matches_tf(case):
  rng = np.random.RandomState(0)
  ids = rng.randint(0, VOCAB, size=(2, 4)).astype(np.int32)
  ids[0, :2] = [15, 9]
  hidden = rng.normal(size=(2, 4, D)).astype(np.float32)
  decoder = transformer.Unitransformer(
      transformer.LayerStack([]), d_model=D, input_vocab_size=VOCAB,
      output_vocab_size=VOCAB, autoregressive=True, vocab_divisor=8)

  def build(ids, hidden):
    with mtf.variable_scope("decoder"):
      embedding = asm.AdaptiveSoftmaxVocabEmbedding(
          ids.mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(tf.float32), "embedding", None,
          clusters=CLUSTERS)
      context = Context(decoder, ids.mesh, [BATCH], LENGTH,
                        mtf.VariableDType(tf.float32), mode="eval")
      log_probs = embedding.hidden_to_logits(hidden, context)
      return [embedding.ids_to_embedding(ids, context), log_probs,
              embedding.compute_loss(decoder, log_probs, ids, context)]

  def reference(xs, p):
    p = {k[len("decoder/"):]: v for k, v in p.items()}
    ids, hidden = xs
    log_probs, table = tf_log_probs(hidden, p)
    picked = tf.gather(log_probs, ids, batch_dims=2)
    real = tf.cast(ids != 0, tf.float32)
    loss = -tf.reduce_sum(picked * real) / float(ids.shape.num_elements())
    return [tf.gather(table, ids), log_probs, loss]
  (_, log_probs, _), params = check_layer(
      mtf_testing.backend_mesh_impl(*case), [(ids, [BATCH, LENGTH]), (hidden, [BATCH, LENGTH, D_DIM])], build,
      reference, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, rtol=1e-5)
  assert {k: v.shape for k, v in params.items()} == {
      "decoder/embedding_0": (8 + 2, D), "decoder/embedding_11": (4, 4),
      "decoder/embedding_12": (4, D), "decoder/embedding_21": (4, 2),
      "decoder/embedding_22": (2, D)}


def test_errors_name_the_clusters():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  with pytest.raises(mtf.MtfError, match="non-empty list"):
    asm.AdaptiveSoftmaxVocabEmbedding(mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(),
                                      "embedding", None, clusters=[])
  with pytest.raises(mtf.ShapeError, match="sum to 12"):
    asm.AdaptiveSoftmaxVocabEmbedding(mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(),
                                      "embedding", None, clusters=CLUSTERS[:2])


def test_unitransformer_trains_with_the_adaptive_softmax_loss_fn():
  gin.parse_config("""
      transformer.get_vocab_embedding_cls.cls = @adaptive_softmax.AdaptiveSoftmaxVocabEmbedding
      adaptive_softmax.AdaptiveSoftmaxVocabEmbedding.clusters = %s
  """ % CLUSTERS)
  try:
    layer = transformer_layers.DenseReluDense(hidden_size=8)
    layer.set_name("block_000/layer_000")
    model = transformer.Unitransformer(
        layer_stack=transformer.LayerStack([layer]), d_model=D, input_vocab_size=VOCAB,
        output_vocab_size=VOCAB, autoregressive=True, max_length=4, vocab_divisor=8,
        shared_embedding_and_softmax_weights=True,
        loss_fn=asm.adaptive_softmax_loss_fn)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    targets = np.random.RandomState(4).randint(1, VOCAB, size=(2, 4)).astype(np.int32)
    t = mtf.import_tf_tensor(mesh, targets, [BATCH, LENGTH])
    logits, loss = model.call_simple(transformer.autoregressive_inputs(t), t,
                                     compute_loss=True, mode="train")
  finally:
    gin.clear_config()
  variables = graph.trainable_variables
  assert "transformer/embedding_0" in [v.name for v in variables]
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = [mtf.assign(v, v.outputs[0] - 0.5 * g) for v, g in zip(variables, grads)]
  impl = mtf_testing.backend_mesh_impl(*CASES[1])
  losses = []
  for _ in range(3):
    lowering = mtf.Lowering(graph, {mesh: impl})
    got_logits = lowering.export_to_tf_tensor(logits).numpy()
    losses.append(float(lowering.export_to_tf_tensor(loss).numpy()))
    for op in updates:
      lowering.lowered_operation(op)
    if len(losses) == 1:  # in training the "logits" are the hidden states
      assert got_logits.shape == (2, 4, D)
  assert losses[-1] < losses[0], losses
