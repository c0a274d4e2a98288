"""The adaptive softmax's training path as the original's: in training hidden_to_logits
returns the hidden states, and adaptive_softmax_loss_fn computes the loss per cluster
(head labels replaced by the tail cluster's row, each softmax with the decoder's z_loss,
each divided by the loss denominator of its own targets), a tail cluster with
length_projection_factor f keeping only its first ceil(f * length) tokens of each
sequence. Checked forward and in every gradient against plain TF written from that
description with explicit position lists, on one device and two meshes; plus one
cluster (a plain softmax) and the factor's range."""
import math

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from layers.layer_testing import check_layer
from models.transformer import adaptive_softmax as asm
from models.transformer import transformer
from models.transformer.context import Context

VOCAB, D, Z_LOSS = 16, 8, 0.01
BATCH, LENGTH = mtf.Dimension("batch", 2), mtf.Dimension("length", 8)
VOCAB_DIM, D_DIM = mtf.Dimension("vocab", VOCAB), mtf.Dimension("d_model", D)
# (start, end, factor) of the tail clusters; the head holds ids 0..7.
TAILS = [(8, 12, 0.5), (12, 16, 0.25)]
CLUSTERS = [{"token_count": 8},
            {"token_count": 4, "embedding_size": 4, "length_projection_factor": 0.5},
            {"token_count": 4, "embedding_size": 2, "length_projection_factor": 0.25}]
# Row 0 has three ids of the last cluster (12..15) where it keeps two per sequence.
TARGETS = np.array([[3, 13, 9, 12, 0, 15, 8, 1],
                    [10, 2, 14, 11, 9, 8, 5, 0]], np.int32)
CASES = [("placement", "", ""),
         ("placement", "rows:2;cols:4", "batch:rows;vocab:cols"),
         ("simd", "rows:2;cols:4", "batch:rows;d_model:cols")]


def _decoder(z_loss=Z_LOSS):
  return transformer.Unitransformer(
      transformer.LayerStack([]), d_model=D, input_vocab_size=VOCAB,
      output_vocab_size=VOCAB, autoregressive=True, vocab_divisor=8, z_loss=z_loss)


def _xent(logits, label, z_loss):
  lse = tf.reduce_logsumexp(logits)
  return lse - logits[label] + z_loss * tf.square(lse)


def tf_training_loss(hidden, p, z_loss=Z_LOSS):
  """The loss from the description, one position at a time."""
  h = hidden * D ** -0.5
  head = p["embedding_0"]
  tables = [p["embedding_11"] @ p["embedding_12"], p["embedding_21"] @ p["embedding_22"]]
  batch, length = TARGETS.shape
  head_loss = 0.0
  for b in range(batch):
    for l in range(length):
      t = int(TARGETS[b, l])
      if t == 0:
        continue
      label = next((8 + i for i, (s, e, _) in enumerate(TAILS) if s <= t < e), t)
      head_loss += _xent(tf.linalg.matvec(head, h[b, l]), label, z_loss)
  loss = head_loss / (batch * length)
  for (start, end, factor), table in zip(TAILS, tables):
    slots = math.ceil(factor * length)
    tail_loss = 0.0
    for b in range(batch):
      kept = [l for l in range(length) if start <= TARGETS[b, l] < end][:slots]
      for l in kept:
        tail_loss += _xent(tf.linalg.matvec(table, h[b, l]), int(TARGETS[b, l]) - start,
                           z_loss)
    loss += tail_loss / (batch * slots)
  return loss


@pytest.mark.parametrize("case", CASES, ids=["single", "placement_dp_mp", "simd_dp_mp"])
def test_training_loss_matches_tf(case):
  hidden = np.random.RandomState(1).normal(size=(2, 8, D)).astype(np.float32)
  decoder = _decoder()

  def build(ids, hidden):
    with mtf.variable_scope("decoder"):
      embedding = asm.AdaptiveSoftmaxVocabEmbedding(
          ids.mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(tf.float32), "embedding", None,
          clusters=CLUSTERS)
      context = Context(decoder, ids.mesh, [BATCH], LENGTH,
                        mtf.VariableDType(tf.float32), mode="train")
      logits = embedding.hidden_to_logits(hidden, context)
      assert logits is hidden  # the original returns the hidden states in training
      return asm.adaptive_softmax_loss_fn(decoder, context, logits, ids, VOCAB_DIM)

  def reference(xs, p):
    return tf_training_loss(xs[1], {k[len("decoder/"):]: v for k, v in p.items()})

  check_layer(mtf_testing.backend_mesh_impl(*case),
              [(TARGETS, [BATCH, LENGTH]), (hidden, [BATCH, LENGTH, D_DIM])],
              build, reference, rtol=1e-5, atol=1e-5)


def _embedding_on_hidden(seed, clusters):
  """(mesh, TARGETS, random hidden states (numpy), the same imported, an adaptive
  embedding) in a new graph."""
  hidden = np.random.RandomState(seed).normal(size=(2, 8, D)).astype(np.float32)
  mesh = mtf.Mesh(mtf.Graph(), "m")
  ids = mtf.import_tf_tensor(mesh, TARGETS, [BATCH, LENGTH])
  h = mtf.import_tf_tensor(mesh, hidden, [BATCH, LENGTH, D_DIM])
  embedding = asm.AdaptiveSoftmaxVocabEmbedding(
      mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(tf.float32), "embedding", None,
      clusters=clusters)
  return mesh, ids, hidden, h, embedding


def test_without_projection_or_z_loss_training_loss_is_the_eval_nll():
  clusters = [dict(c, length_projection_factor=1) for c in CLUSTERS]
  decoder = _decoder(z_loss=0.0)
  mesh, ids, _, h, embedding = _embedding_on_hidden(2, clusters)
  losses = []
  for mode in ("train", "eval"):
    context = Context(decoder, mesh, [BATCH], LENGTH, mtf.VariableDType(tf.float32),
                      mode=mode)
    logits = embedding.hidden_to_logits(h, context)
    losses.append(asm.adaptive_softmax_loss_fn(decoder, context, logits, ids, VOCAB_DIM))
  lowering = mtf.Lowering(mesh.graph,
                          {mesh: mtf_testing.backend_mesh_impl("placement", "", "")})
  train, evaluation = [float(lowering.export_to_tf_tensor(x).numpy()) for x in losses]
  assert train > 1.0  # a real loss, not a masked zero
  np.testing.assert_allclose(train, evaluation, rtol=1e-5)


def test_one_cluster_is_a_plain_softmax():
  decoder = _decoder(z_loss=0.0)
  mesh, ids, hidden, h, embedding = _embedding_on_hidden(3, [{"token_count": VOCAB}])
  contexts = [Context(decoder, mesh, [BATCH], LENGTH, mtf.VariableDType(tf.float32),
                      mode=mode) for mode in ("eval", "train")]
  log_probs = embedding.hidden_to_logits(h, contexts[0])
  loss = asm.adaptive_softmax_loss_fn(
      decoder, contexts[1], embedding.hidden_to_logits(h, contexts[1]), ids, VOCAB_DIM)
  lowering = mtf.Lowering(mesh.graph,
                          {mesh: mtf_testing.backend_mesh_impl("placement", "", "")})
  got, got_loss = [lowering.export_to_tf_tensor(x).numpy() for x in (log_probs, loss)]
  (table,) = [laid.read_full().numpy() for laid in lowering.variables.values()]
  expected = tf.nn.log_softmax(hidden * D ** -0.5 @ table.T, -1).numpy()
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  picked = np.take_along_axis(expected, TARGETS[..., None], -1)[..., 0]
  np.testing.assert_allclose(got_loss, -(picked * (TARGETS != 0)).sum() / TARGETS.size,
                             rtol=1e-5)


@pytest.mark.parametrize("factor", [0.0, 1.5])
def test_length_projection_factor_outside_zero_one_is_named(factor):
  mesh = mtf.Mesh(mtf.Graph(), "m")
  clusters = [CLUSTERS[0], dict(CLUSTERS[1], length_projection_factor=factor),
              CLUSTERS[2]]
  with pytest.raises(mtf.MtfError, match="cluster 1 has length_projection_factor"):
    asm.AdaptiveSoftmaxVocabEmbedding(mesh, VOCAB_DIM, D_DIM, mtf.VariableDType(),
                                      "embedding", None, clusters=clusters)
