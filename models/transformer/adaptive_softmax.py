"""Adaptive softmax (Grave et al. 2017): `AdaptiveSoftmaxVocabEmbedding` and
`adaptive_softmax_loss_fn`.

The ids are cut into clusters in id order (most frequent first), each with its own
embedding width as in AdaptiveVocabEmbedding ("<name>_<i>", plus
"<name>_<i>_projection" when narrower than d_model); the same matrices give the logits.
The head softmax ranges over the first cluster's tokens and one entry per tail cluster
(weights "<name>_cluster_logits" [adaptive_softmax_clusters, d_model]); a tail token's
probability is p(its cluster) * softmax within the cluster. `hidden_to_logits` returns
these log-probabilities over the whole vocab (normalized), so the usual cross-entropy of
them is the adaptive-softmax loss. Cluster specs may carry "length_projection_factor"
(the original's speed-up that runs tail clusters on a fraction of the positions); it is
accepted and every position is computed.
"""
import gin
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.vocab_embeddings import AdaptiveVocabEmbedding, _check_ids


@gin.configurable(module="adaptive_softmax")
class AdaptiveSoftmaxVocabEmbedding:
  """Adaptive input embeddings tied to an adaptive softmax (see the module docstring).

  clusters: a list of {"token_count": n, "embedding_size": k} (optionally with
  "length_projection_factor"), in id order, whose counts sum to the padded vocab size;
  at least two clusters (a head and a tail).
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim,
               clusters=gin.REQUIRED):
    if not isinstance(clusters, (list, tuple)) or len(clusters) < 2:
      raise mtf.MtfError("AdaptiveSoftmaxVocabEmbedding: needs at least two clusters (a "
                         "head and a tail), got %r" % (clusters,))
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._embedding = AdaptiveVocabEmbedding(
        mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim,
        clusters=[{"token_count": c.get("token_count"),
                   "embedding_size": c.get("embedding_size")} for c in clusters])
    self._clusters_dim = mtf.Dimension("adaptive_softmax_clusters", len(clusters) - 1)
    ensemble = [ensemble_dim] if ensemble_dim else []
    self._cluster_weights = mtf.get_variable(
        mesh, name + "_cluster_logits", mtf.Shape(ensemble + [self._clusters_dim,
                                                              output_dim]),
        initializer=tf.random_normal_initializer(), dtype=variable_dtype)

  def ids_to_embedding(self, ids, context):
    """The embedding of each id, from its cluster."""
    _check_ids(ids, self._vocab_dim, "AdaptiveSoftmaxVocabEmbedding.ids_to_embedding")
    return self._embedding.ids_to_embedding(ids, context)

  def hidden_to_logits(self, hidden, context):
    """Log-probabilities over the whole vocab (see the module docstring)."""
    clusters = self._embedding.clusters
    head = clusters[0].hidden_to_logits(hidden, context)
    cluster_logits = mtf.einsum(
        [hidden * self._output_dim.size ** -0.5, self._cluster_weights],
        reduced_dims=[self._output_dim])
    head_lse = mtf.reduce_logsumexp(head, reduced_dim=head.shape.dims[-1])
    cluster_lse = mtf.reduce_logsumexp(cluster_logits, reduced_dim=self._clusters_dim)
    top = mtf.stop_gradient(mtf.maximum(head_lse, cluster_lse))
    norm = top + mtf.log(mtf.exp(head_lse - top) + mtf.exp(cluster_lse - top))
    pieces = [head - norm]
    one = mtf.Dimension(self._clusters_dim.name, 1)
    for i, cluster in enumerate(clusters[1:]):
      log_p_cluster = mtf.reduce_sum(
          mtf.slice(cluster_logits, i, 1, self._clusters_dim.name), reduced_dim=one) - norm
      tail = cluster.hidden_to_logits(hidden, context)
      pieces.append(log_p_cluster + mtf.log_softmax(tail, reduced_dim=tail.shape.dims[-1]))
    return mtf.concat(pieces, self._vocab_dim.name)

  def compute_loss(self, decoder, hidden, targets, context):
    """The summed negative log-likelihood of the (nonzero) targets, divided by the
    decoder's loss denominator."""
    log_probs = self.hidden_to_logits(hidden, context)
    return _nll(decoder, context, log_probs, targets, self._vocab_dim)


def _nll(decoder, context, logits, targets, vocab_dim):
  xent = mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(targets, vocab_dim, dtype=logits.dtype), vocab_dim)
  weights = mtf.layers.weights_nonzero(targets, dtype=logits.dtype)
  return (mtf.reduce_sum(xent * weights) /
          decoder.loss_denominator(targets, context.num_microbatches))


@gin.configurable(module="adaptive_softmax")
def adaptive_softmax_loss_fn(decoder, context, logits, targets, output_vocab_dim):
  """A Unitransformer loss_fn for AdaptiveSoftmaxVocabEmbedding (with shared softmax
  weights): the cross-entropy of its log-probabilities, over the nonzero targets,
  divided by the decoder's loss denominator."""
  return _nll(decoder, context, logits, targets, output_vocab_dim)
