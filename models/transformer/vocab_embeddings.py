"""Vocabulary embeddings: token ids to vectors, and (shared weights) vectors to logits.
`VocabEmbedding` holds one [vocab, d_model] matrix ("transformer/embedding", ...); the
gin hook `get_vocab_embedding_cls` swaps in another class with the same constructor.
"""
import gin
import tensorflow as tf

import mesh_tf as mtf


def _random_normal(stddev=1.0):
  """A TF1-style normal initializer, looked up when the variable is made (so a patched
  `tf.compat.v1.random_normal_initializer` is honoured, as by the original's layers)."""
  return tf.compat.v1.random_normal_initializer(stddev=stddev)


def _check_ids(ids, vocab_dim, what):
  if not isinstance(ids, mtf.Tensor):
    raise mtf.ShapeError("%s: ids must be an mtf Tensor, got %r" % (what, ids))
  if not ids.dtype.is_integer:
    raise mtf.ShapeError("%s: ids %s must be integer token ids, not %s" % (
        what, ids.name, ids.dtype.name), tensor=ids.name)
  if vocab_dim in ids.shape.dims:
    raise mtf.ShapeError("%s: ids %s %s already have the vocab dim %s" % (
        what, ids.name, ids.shape, vocab_dim), tensor=ids.name, dim=vocab_dim.name)


@gin.configurable(module="transformer")
class VocabEmbedding:
  """A [ensemble?, vocab, d_model] embedding matrix, usable as the softmax weights too.

  scale_variable_like_classifier_weights: initialize with stddev d_model**-0.5 and
  multiply looked-up embeddings by d_model**0.5 (instead of unit stddev and scaling the
  hidden state by d_model**-0.5 before the logits).
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim,
               scale_variable_like_classifier_weights=False):
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._scale_like_classifier = scale_variable_like_classifier_weights
    stddev = output_dim.size ** -0.5 if self._scale_like_classifier else 1.0
    self._embedding_weights = mtf.layers.embedding_weights(
        mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim=ensemble_dim,
        initializer=_random_normal(stddev))

  @property
  def embedding_weights(self):
    """The embedding matrix (an mtf Tensor)."""
    return self._embedding_weights

  def ids_to_embedding(self, ids, context):
    """The rows of the matrix at ids: shape ids.shape + [d_model]."""
    del context
    _check_ids(ids, self._vocab_dim, "VocabEmbedding.ids_to_embedding")
    ret = mtf.gather(self._embedding_weights, ids, self._vocab_dim)
    if self._scale_like_classifier:
      ret *= self._output_dim.size ** 0.5
    return ret

  def hidden_to_logits(self, hidden, context):
    """Logits over the vocab: hidden (scaled by d_model**-0.5) times the matrix."""
    del context
    if not self._scale_like_classifier:
      hidden *= self._output_dim.size ** -0.5
    return mtf.einsum([hidden, self._embedding_weights], reduced_dims=[self._output_dim])


@gin.configurable(module="transformer")
def get_vocab_embedding_cls(cls=VocabEmbedding):
  """The vocab-embedding class the models build (gin-configurable)."""
  return cls


@gin.configurable(module="vocab_embeddings")
class FactorizedVocabEmbedding:
  """A low-rank embedding (ALBERT-style): "<name>1" [vocab, inner_dimension_size] times
  "<name>2" [inner, d_model], as the original named them."""

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim,
               inner_dimension_size=gin.REQUIRED):
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._inner_dim = mtf.Dimension("inner_vocab", inner_dimension_size)
    ensemble = [ensemble_dim] if ensemble_dim else []
    # Both factors start with stddev inner**-0.25, so their product has unit variance
    # per entry as an unfactored embedding would.
    stddev = inner_dimension_size ** -0.25
    self._factor1 = mtf.get_variable(
        mesh, "%s1" % name, mtf.Shape(ensemble + [vocab_dim, self._inner_dim]),
        initializer=_random_normal(stddev), dtype=variable_dtype)
    self._factor2 = mtf.get_variable(
        mesh, "%s2" % name, mtf.Shape(ensemble + [self._inner_dim, output_dim]),
        initializer=_random_normal(stddev), dtype=variable_dtype)

  def ids_to_embedding(self, ids, context):
    """Looks up the inner-dim rows and projects them to d_model."""
    del context
    _check_ids(ids, self._vocab_dim, "FactorizedVocabEmbedding.ids_to_embedding")
    inner = mtf.gather(self._factor1, ids, self._vocab_dim)
    return mtf.einsum([inner, self._factor2], reduced_dims=[self._inner_dim])

  def hidden_to_logits(self, hidden, context):
    """hidden * d_model**-0.5 through the transposed factors."""
    del context
    hidden *= self._output_dim.size ** -0.5
    inner = mtf.einsum([hidden, self._factor2], reduced_dims=[self._output_dim])
    return mtf.einsum([inner, self._factor1], reduced_dims=[self._inner_dim])


class _Cluster:
  """The tokens [start, end) of an AdaptiveVocabEmbedding, with their own embedding."""

  def __init__(self, embedding, start_token_id, end_token_id):
    self._embedding = embedding
    self._start = start_token_id
    self._end = end_token_id

  def ids_to_embedding(self, ids, context):
    """Embeddings of the ids in this cluster; zeros at the other ids."""
    in_cluster = mtf.logical_and(mtf.greater_equal(ids, self._start),
                                 mtf.less(ids, self._end))
    local_ids = mtf.where(in_cluster, ids - self._start, mtf.zeros_like(ids))
    embedding = self._embedding.ids_to_embedding(local_ids, context)
    return embedding * mtf.cast(in_cluster, embedding.dtype)

  def hidden_to_logits(self, hidden, context):
    """Logits over this cluster's tokens (a vocab dim of the cluster's size)."""
    return self._embedding.hidden_to_logits(hidden, context)


def _check_clusters(clusters, vocab_dim, what):
  if not clusters or not all(isinstance(c, dict) and {"token_count", "embedding_size"}
                             <= set(c) for c in clusters):
    raise mtf.MtfError("%s: clusters must be a non-empty list of dicts with keys "
                       "'token_count' and 'embedding_size', got %r" % (what, clusters))
  total = sum(c["token_count"] for c in clusters)
  if total != vocab_dim.size:
    raise mtf.ShapeError(
        "%s: the clusters' token counts sum to %d, but the (padded) vocab dim %s has %d "
        "ids; make the last cluster take the padding" % (what, total, vocab_dim.name,
                                                         vocab_dim.size),
        dim=vocab_dim.name)


@gin.configurable(module="vocab_embeddings")
class AdaptiveVocabEmbedding:
  """Adaptive input embeddings (Baevski & Auli 2018): frequent ids get wide embeddings,
  rare ones narrow embeddings projected up to d_model.

  clusters: a list of {"token_count": n, "embedding_size": k}, in id order, whose counts
  sum to the padded vocab size. Cluster i owns "<name>_<i>" ([n, k]; plus
  "<name>_<i>_projection" [k, d_model] when k != d_model, as FactorizedVocabEmbedding).
  The logits (with shared softmax weights) concatenate every cluster's logits.
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim,
               clusters=gin.REQUIRED):
    _check_clusters(clusters, vocab_dim, "AdaptiveVocabEmbedding")
    self._vocab_dim = vocab_dim
    self._clusters = []
    start = 0
    for i, spec in enumerate(clusters):
      cluster_vocab_dim = mtf.Dimension(vocab_dim.name, spec["token_count"])
      cluster_name = "%s_%d" % (name, i)
      if spec["embedding_size"] == output_dim.size:
        embedding = VocabEmbedding(mesh, cluster_vocab_dim, output_dim, variable_dtype,
                                   cluster_name, ensemble_dim)
      else:
        embedding = FactorizedVocabEmbedding(
            mesh, cluster_vocab_dim, output_dim, variable_dtype, cluster_name,
            ensemble_dim, inner_dimension_size=spec["embedding_size"])
      self._clusters.append(_Cluster(embedding, start, start + spec["token_count"]))
      start += spec["token_count"]

  @property
  def clusters(self):
    """The clusters, in id order (each has ids_to_embedding and hidden_to_logits)."""
    return list(self._clusters)

  def ids_to_embedding(self, ids, context):
    """The embedding of each id, from the cluster it belongs to."""
    _check_ids(ids, self._vocab_dim, "AdaptiveVocabEmbedding.ids_to_embedding")
    return mtf.add_n([c.ids_to_embedding(ids, context) for c in self._clusters])

  def hidden_to_logits(self, hidden, context):
    """Logits over the whole vocab: the clusters' logits side by side."""
    logits = [c.hidden_to_logits(hidden, context) for c in self._clusters]
    return logits[0] if len(logits) == 1 else mtf.concat(logits, self._vocab_dim.name)


@gin.configurable(module="vocab_embeddings")
class MixtureOfSoftmaxes:
  """A mixture of softmaxes (Yang et al. 2017) sharing one [vocab, d_model] matrix.

  For hidden state h (times d_model**-0.5), component k has the context
  c_k = tanh(W_k h) and the prior p(k) = softmax_k(m_k . h); the returned logits are
  log sum_k p(k) softmax(E c_k), i.e. normalized log-probabilities. Variables (named as
  the original names them): "<name>_embedding_weights" [vocab, d_model],
  "<name>_mixture_weights" [softmax_components, d_model] and "<name>_context_weights"
  [softmax_components, _d_model_copy, d_model].
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim,
               num_softmaxes=gin.REQUIRED):
    if not isinstance(num_softmaxes, int) or num_softmaxes < 1:
      raise mtf.MtfError("MixtureOfSoftmaxes: num_softmaxes must be a positive int, got "
                         "%r" % (num_softmaxes,))
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._copy_output_dim = mtf.Dimension("_%s_copy" % output_dim.name, output_dim.size)
    self._components_dim = mtf.Dimension("softmax_components", num_softmaxes)
    ensemble = [ensemble_dim] if ensemble_dim else []
    self._embedding_weights = mtf.layers.embedding_weights(
        mesh, vocab_dim, output_dim, variable_dtype, name + "_embedding_weights",
        ensemble_dim=ensemble_dim)
    self._mixture_weights = mtf.layers.embedding_weights(
        mesh, self._components_dim, output_dim, variable_dtype, name + "_mixture_weights",
        ensemble_dim=ensemble_dim)
    self._context_weights = mtf.layers.embedding_weights(
        mesh, self._copy_output_dim, output_dim, variable_dtype,
        name + "_context_weights", ensemble_dim=ensemble + [self._components_dim])

  def ids_to_embedding(self, ids, context):
    """The rows of the shared matrix at ids."""
    del context
    _check_ids(ids, self._vocab_dim, "MixtureOfSoftmaxes.ids_to_embedding")
    return mtf.gather(self._embedding_weights, ids, self._vocab_dim)

  def hidden_to_logits(self, hidden, context):
    """Log-probabilities of the mixture over the vocab."""
    del context
    hidden *= self._output_dim.size ** -0.5
    prior = mtf.log_softmax(
        mtf.einsum([hidden, self._mixture_weights], reduced_dims=[self._output_dim]),
        reduced_dim=self._components_dim)
    contexts = mtf.tanh(mtf.einsum(
        [mtf.rename_dimension(hidden, self._output_dim.name, self._copy_output_dim.name),
         self._context_weights], reduced_dims=[self._copy_output_dim]))
    component_logits = mtf.log_softmax(
        mtf.einsum([contexts, self._embedding_weights], reduced_dims=[self._output_dim]),
        reduced_dim=self._vocab_dim)
    return mtf.reduce_logsumexp(prior + component_logits,
                                reduced_dim=self._components_dim)


from models.transformer.vocab_mixtape import Mixtape  # pylint: disable=unused-import,g-import-not-at-top,wrong-import-position
