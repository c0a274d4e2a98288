"""Adaptive softmax (Grave et al. 2017): `AdaptiveSoftmaxVocabEmbedding` and
`adaptive_softmax_loss_fn`.

The ids are cut into clusters in id order, each with its own embedding width as in
AdaptiveVocabEmbedding; the same matrices give the logits. The head softmax ranges over
the first cluster's tokens and one entry per tail cluster (as in the original, rows of
the head's matrix "<name>_0" after its tokens'); a tail token's probability is p(its
cluster) * softmax within the cluster.

Outside training `hidden_to_logits` returns these log-probabilities over the whole
vocab. In training it returns the hidden states, as the original's did, and
`adaptive_softmax_loss_fn` computes the head's cross-entropy plus each tail cluster's
over its own tokens (each with the decoder's z_loss, divided by the loss denominator of
its targets). A tail cluster with "length_projection_factor" f < 1 is computed on
ceil(f * length) slots per sequence holding its tokens in order; its tokens beyond those
slots are left out of its loss (the original's speed-up).
"""
import math
import weakref

import gin
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.context import is_training
from models.transformer.vocab_embeddings import (FactorizedVocabEmbedding,
                                                 VocabEmbedding, _check_clusters,
                                                 _check_ids, _Cluster)

HEAD_DIM_NAME = "adaptive_softmax_head"


# Hidden states returned in training -> the embedding that returned them, so that the
# loss function finds it when the model's context does not share it.
_EMBEDDING_OF_HIDDEN = weakref.WeakKeyDictionary()


@gin.configurable(module="adaptive_softmax")
class AdaptiveSoftmaxVocabEmbedding:
  """Adaptive input embeddings tied to an adaptive softmax (see the module docstring).

  clusters: a list of {"token_count": n} dicts, in id order, whose counts sum to the
  padded vocab size; optional keys "embedding_size" (default d_model) and, for tail
  clusters, "length_projection_factor" in (0, 1] (default 1; ignored for the head).
  One cluster is a plain softmax.
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim,
               clusters=gin.REQUIRED):
    if isinstance(clusters, (list, tuple)):
      clusters = [dict({"embedding_size": output_dim.size}, **c) if isinstance(c, dict)
                  else c for c in clusters]
    _check_clusters(clusters, vocab_dim, "AdaptiveSoftmaxVocabEmbedding")
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._num_tails = len(clusters) - 1
    self._clusters, self._rows, self._factors = [], [], []
    start = 0
    for i, spec in enumerate(clusters):
      count = spec["token_count"]
      factor = spec.get("length_projection_factor", 1)
      if not 0 < factor <= 1:
        raise mtf.MtfError(
            "AdaptiveSoftmaxVocabEmbedding: cluster %d has length_projection_factor %r; "
            "it must be in (0, 1]" % (i, factor))
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
      self._rows.append(rows)
      self._factors.append(factor)
      start += count
    self._head_size = clusters[0]["token_count"]

  def ids_to_embedding(self, ids, context):
    """The embedding of each id, from its cluster."""
    _check_ids(ids, self._vocab_dim, "AdaptiveSoftmaxVocabEmbedding.ids_to_embedding")
    return mtf.add_n([c.ids_to_embedding(ids, context) for c in self._clusters])

  def hidden_to_logits(self, hidden, context):
    """In training the hidden states themselves (adaptive_softmax_loss_fn takes them);
    otherwise log-probabilities over the whole vocab (see the module docstring)."""
    if context is not None and is_training(getattr(context, "mode", None)):
      _EMBEDDING_OF_HIDDEN[hidden] = self
      return hidden
    return self._log_probs(hidden, context)

  def _log_probs(self, hidden, context):
    clusters = self._clusters
    head_dim = self._rows[0]
    head = mtf.log_softmax(clusters[0].hidden_to_logits(hidden, context),
                           reduced_dim=head_dim)
    head_tokens = (head if not self._num_tails else
                   mtf.slice(head, 0, self._head_size, HEAD_DIM_NAME))
    pieces = [mtf.rename_dimension(head_tokens, HEAD_DIM_NAME, self._vocab_dim.name)]
    one = mtf.Dimension(HEAD_DIM_NAME, 1)
    for i, cluster in enumerate(clusters[1:]):
      log_p_cluster = mtf.reduce_sum(
          mtf.slice(head, self._head_size + i, 1, HEAD_DIM_NAME), reduced_dim=one)
      tail = cluster.hidden_to_logits(hidden, context)
      pieces.append(log_p_cluster + mtf.log_softmax(tail, reduced_dim=tail.shape.dims[-1]))
    return pieces[0] if len(pieces) == 1 else mtf.concat(pieces, self._vocab_dim.name)

  def compute_loss(self, decoder, hidden, targets, context):
    """The training loss from the hidden states (see the module docstring). Given
    log-probabilities over the vocab instead (outside training), their summed
    negative log-likelihood over the nonzero targets / the loss denominator."""
    if self._vocab_dim in hidden.shape.dims:
      return _nll(decoder, context, hidden, targets, self._vocab_dim)
    z_loss = getattr(decoder, "z_loss", 0.0)
    loss = 0.0
    head_targets = targets
    for i, cluster in enumerate(self._clusters[1:]):
      mask = mtf.logical_and(mtf.greater_equal(targets, cluster._start),  # pylint: disable=protected-access
                             mtf.less(targets, cluster._end))  # pylint: disable=protected-access
      head_targets = mtf.where(mask, mtf.ones_like(targets) * (self._head_size + i),
                               head_targets)
      if self._factors[i + 1] == 1:
        cluster_targets = mtf.where(mask, targets, mtf.zeros_like(targets))
        cluster_hidden = hidden * mtf.cast(mask, hidden.dtype)
      else:
        cluster_targets, cluster_hidden = self._project(mask, targets, hidden, i + 1)
      loss += self._cluster_loss(decoder, i + 1, cluster_hidden, cluster_targets,
                                 context, z_loss)
    return loss + self._cluster_loss(decoder, 0, hidden, head_targets, context, z_loss)

  def _project(self, mask, targets, hidden, index):
    """targets and hidden of cluster `index`'s tokens, moved in order to the first
    ceil(factor * length) slots of a shorter length dim (the rest are dropped)."""
    length_dim = targets.shape.get_dim_by_name("length")
    slots = mtf.Dimension("%s_cluster_%d" % (length_dim.name, index),
                          int(math.ceil(self._factors[index] * length_dim.size)))
    slot = mtf.cumsum(mtf.cast(mask, tf.int32), length_dim) - 1
    project = mtf.cast(mask, hidden.dtype) * mtf.one_hot(slot, slots, dtype=hidden.dtype)
    moved_targets = mtf.einsum([project, mtf.cast(targets, hidden.dtype)],
                               reduced_dims=[length_dim])
    moved_hidden = mtf.einsum([project, hidden], reduced_dims=[length_dim])
    moved_targets = mtf.cast(mtf.rename_dimension(moved_targets, slots.name,
                                                  length_dim.name), targets.dtype)
    return moved_targets, mtf.rename_dimension(moved_hidden, slots.name, length_dim.name)

  def _cluster_loss(self, decoder, index, hidden, targets, context, z_loss):
    cluster, rows = self._clusters[index], self._rows[index]
    dtype = context.activation_dtype
    logits = cluster.hidden_to_logits(hidden, context)
    labels = targets - cluster._start if index else targets  # pylint: disable=protected-access
    xent = mtf.layers.softmax_cross_entropy_with_logits(
        logits, mtf.one_hot(labels, rows, dtype=dtype), rows, z_loss=z_loss)
    weights = mtf.layers.weights_nonzero(targets, dtype=dtype)
    return (mtf.reduce_sum(xent * weights) /
            decoder.loss_denominator(targets, context.num_microbatches))


def _nll(decoder, context, logits, targets, vocab_dim):
  xent = mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(targets, vocab_dim, dtype=logits.dtype), vocab_dim)
  weights = mtf.layers.weights_nonzero(targets, dtype=logits.dtype)
  return (mtf.reduce_sum(xent * weights) /
          decoder.loss_denominator(targets, context.num_microbatches))


def _embedding_for(context, logits):
  shared = getattr(context, "shared_params", None) or {}
  embedding = shared.get("embedding") if isinstance(shared, dict) else None
  if not isinstance(embedding, AdaptiveSoftmaxVocabEmbedding):
    embedding = _EMBEDDING_OF_HIDDEN.get(logits)
  return embedding


@gin.configurable(module="adaptive_softmax")
def adaptive_softmax_loss_fn(decoder, context, logits, targets, output_vocab_dim):
  """A Unitransformer loss_fn for AdaptiveSoftmaxVocabEmbedding (with shared softmax
  weights). In training `logits` are the hidden states the embedding returned and the
  loss is the original's adaptive-softmax loss (module docstring); otherwise the
  cross-entropy of the log-probabilities over the nonzero targets / the decoder's loss
  denominator."""
  embedding = _embedding_for(context, logits)
  if embedding is not None:
    return embedding.compute_loss(decoder, logits, targets, context)
  if output_vocab_dim is None or output_vocab_dim not in logits.shape.dims:
    raise mtf.MtfError(
        "adaptive_softmax_loss_fn: %s are not log-probabilities over the vocab and no "
        "AdaptiveSoftmaxVocabEmbedding made them; use it as the vocab embedding with "
        "Unitransformer.shared_embedding_and_softmax_weights = True" % (logits,))
  return _nll(decoder, context, logits, targets, output_vocab_dim)
