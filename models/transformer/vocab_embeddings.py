"""Vocabulary embeddings: token ids to vectors, and (shared weights) vectors to logits.

`VocabEmbedding` holds one [vocab, d_model] matrix named `name` ("embedding") in the
enclosing scope, e.g. "transformer/embedding" or "shared/embedding". The gin hook
`get_vocab_embedding_cls` swaps in another class with the same constructor, such as
`FactorizedVocabEmbedding`.
"""
import gin
import tensorflow as tf

import mesh_tf as mtf


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

  Args:
    mesh: the mtf.Mesh.
    vocab_dim, output_dim: the (padded) vocab Dimension and the d_model Dimension.
    variable_dtype: mtf.VariableDType of the matrix.
    name: variable name ("embedding").
    ensemble_dim: optional leading ensemble Dimension.
    scale_variable_like_classifier_weights: initialize with stddev d_model**-0.5 and
      multiply looked-up embeddings by d_model**0.5 (instead of unit stddev and scaling
      the hidden state by d_model**-0.5 before the logits).
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim,
               scale_variable_like_classifier_weights=False):
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._scale_like_classifier = scale_variable_like_classifier_weights
    stddev = output_dim.size ** -0.5 if self._scale_like_classifier else 1.0
    self._embedding_weights = mtf.layers.embedding_weights(
        mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim=ensemble_dim,
        initializer=tf.random_normal_initializer(stddev=stddev))

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
  """A low-rank embedding: [vocab, inner] times [inner, d_model] (ALBERT-style).

  Variables "<name>" ([vocab, inner_dimension_size]) and "<name>_projection"
  ([inner, d_model]) in the enclosing scope.
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim,
               inner_dimension_size=gin.REQUIRED):
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._inner_dim = mtf.Dimension("inner_vocab", inner_dimension_size)
    ensemble = [ensemble_dim] if ensemble_dim else []
    self._factor1 = mtf.get_variable(
        mesh, name, mtf.Shape(ensemble + [vocab_dim, self._inner_dim]),
        initializer=tf.random_normal_initializer(), dtype=variable_dtype)
    self._factor2 = mtf.get_variable(
        mesh, "%s_projection" % name, mtf.Shape(ensemble + [self._inner_dim, output_dim]),
        initializer=tf.random_normal_initializer(stddev=inner_dimension_size ** -0.5),
        dtype=variable_dtype)

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
