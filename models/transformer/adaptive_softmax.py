"""Adaptive softmax (Grave et al. 2017): `AdaptiveSoftmaxVocabEmbedding` and
`adaptive_softmax_loss_fn`.

The ids are cut into clusters in id order (most frequent first), each with its own
embedding width as in AdaptiveVocabEmbedding ("<name>_<i>", plus
"<name>_<i>_projection" when narrower than d_model); the same matrices give the logits.
The head softmax ranges over the first cluster's tokens and one entry per tail cluster:
as in the original, the head's matrix "<name>_0" has a row for each of them after its
tokens' rows ([head tokens + tail clusters, ...]); a tail token's probability is p(its cluster) * softmax within the cluster. `hidden_to_logits` returns
these log-probabilities over the whole vocab (normalized), so the usual cross-entropy of
them is the adaptive-softmax loss. Cluster specs may carry "length_projection_factor"
(the original's speed-up that runs tail clusters on a fraction of the positions); it is
accepted and every position is computed.
"""
import gin

import mesh_tf as mtf
from models.transformer.vocab_embeddings import (FactorizedVocabEmbedding,
                                                 VocabEmbedding, _check_clusters,
                                                 _check_ids, _Cluster)

HEAD_DIM_NAME = "adaptive_softmax_head"


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
    _check_clusters(clusters, vocab_dim, "AdaptiveSoftmaxVocabEmbedding")
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._num_tails = len(clusters) - 1
    self._clusters = []
    start = 0
    for i, spec in enumerate(clusters):
      count = spec["token_count"]
      # The head's rows: its tokens, then one per tail cluster (a dim of its own name,
      # so that a layout splitting the vocab need not divide its odd size).
      rows = (mtf.Dimension(HEAD_DIM_NAME, count + self._num_tails) if i == 0 else
              mtf.Dimension(vocab_dim.name, count))
      if spec["embedding_size"] == output_dim.size:
        embedding = VocabEmbedding(mesh, rows, output_dim, variable_dtype,
                                   "%s_%d" % (name, i), ensemble_dim)
      else:
        embedding = FactorizedVocabEmbedding(
            mesh, rows, output_dim, variable_dtype, "%s_%d" % (name, i), ensemble_dim,
            inner_dimension_size=spec["embedding_size"])
      self._clusters.append(_Cluster(embedding, start, start + count))
      start += count
    self._head_size = clusters[0]["token_count"]

  def ids_to_embedding(self, ids, context):
    """The embedding of each id, from its cluster."""
    _check_ids(ids, self._vocab_dim, "AdaptiveSoftmaxVocabEmbedding.ids_to_embedding")
    return mtf.add_n([c.ids_to_embedding(ids, context) for c in self._clusters])

  def hidden_to_logits(self, hidden, context):
    """Log-probabilities over the whole vocab (see the module docstring)."""
    clusters = self._clusters
    head_dim = mtf.Dimension(HEAD_DIM_NAME, self._head_size + self._num_tails)
    head = mtf.log_softmax(clusters[0].hidden_to_logits(hidden, context),
                           reduced_dim=head_dim)
    pieces = [mtf.rename_dimension(mtf.slice(head, 0, self._head_size, HEAD_DIM_NAME),
                                   HEAD_DIM_NAME, self._vocab_dim.name)]
    one = mtf.Dimension(HEAD_DIM_NAME, 1)
    for i, cluster in enumerate(clusters[1:]):
      log_p_cluster = mtf.reduce_sum(
          mtf.slice(head, self._head_size + i, 1, HEAD_DIM_NAME), reduced_dim=one)
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
