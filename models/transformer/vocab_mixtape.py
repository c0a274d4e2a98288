"""`Mixtape` (Yang et al. 2019): a softmax layer past the softmax bottleneck, offered as
`vocab_embeddings.Mixtape`.

Four context vectors h_k = tanh(W_k g + b_k) of the hidden state g (times d_model**-0.5)
each give logits h_k . w_x over the vocab (w_x the rows of the shared embedding matrix).
They are mixed per token: the weights pi_k(g, x) come from a sigmoid tree over three
gate logits, pi = (s1 s2, s1 (1 - s2), (1 - s1) s3, (1 - s1) (1 - s3)). Frequent tokens
(the first frequent_token_fraction of the ids, and the extra_ids last ones: F ids in
all) have their own gate logits v_x . tanh(U g + c) + u . g + b_x; the other tokens
share u . g ("gate sharing"). The mixed logits go through one softmax, in the loss.

Variables (in the enclosing scope, named as the original names them):
"<name>_embedding_weights" [vocab, d_model]; the contexts' "<name>_context_weights"
[mixtape_components, _d_model_copy, d_model] and "<name>_context_weights_bias"
[mixtape_components, d_model]; the gates' U "<name>_prior_weights" [mixtape_gates,
gate_embedding, _d_model_copy] and c "<name>_prior_weights_bias" [mixtape_gates,
gate_embedding], v "<name>_prior_vocab_vector" [frequent_vocab, gate_embedding], u
"<name>_prior_gates_vector" [mixtape_gates, _d_model_copy] and b "<name>_prior_bias"
[frequent_vocab, mixtape_gates]. Row i of the frequent_vocab tables belongs to id i for
the frequent ordinary ids and to the extra ids after them.
"""
import gin
import tensorflow as tf

import mesh_tf as mtf


@gin.configurable(module="vocab_embeddings")
class Mixtape:
  """The Mixtape softmax (see the module docstring); use with shared softmax weights.

  Args:
    mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim: as VocabEmbedding.
    extra_ids: the last extra_ids ids (sentinels) count as frequent tokens.
    dropout_rate: dropout on the context vectors in training.
    gate_embedding_size: the width of the frequent tokens' gate embeddings.
    frequent_token_fraction: the fraction of the other ids, from id 0, that is frequent.
    noise_std_dev: Gaussian noise added to the gate logits in training.
  """

  def __init__(self, mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim,
               extra_ids=0, dropout_rate=0.0, gate_embedding_size=gin.REQUIRED,
               frequent_token_fraction=0.1, noise_std_dev=0.0):
    if ensemble_dim is not None:
      raise mtf.MtfError("Mixtape: ensembles (ensemble_dim=%s) are not supported" % (
          ensemble_dim,))
    if not isinstance(gate_embedding_size, int) or gate_embedding_size < 1:
      raise mtf.MtfError("Mixtape: gate_embedding_size must be a positive int, got %r" % (
          gate_embedding_size,))
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._copy_dim = mtf.Dimension("_%s_copy" % output_dim.name, output_dim.size)
    self._components_dim = mtf.Dimension("mixtape_components", 4)
    self._gates_dim = mtf.Dimension("mixtape_gates", 3)
    gate_dim = mtf.Dimension("gate_embedding", gate_embedding_size)
    self._dropout_rate = dropout_rate
    self._noise_std_dev = noise_std_dev
    self._num_frequent = int(frequent_token_fraction * (vocab_dim.size - extra_ids))
    self._extra_ids = extra_ids
    self._frequent_dim = mtf.Dimension("frequent_vocab", self._num_frequent + extra_ids)
    if self._frequent_dim.size == 0:
      raise mtf.MtfError("Mixtape: no frequent tokens (frequent_token_fraction %r of %d "
                         "ids, extra_ids %d)" % (frequent_token_fraction, vocab_dim.size,
                                                 extra_ids))

    def variable(suffix, dims, random=True):
      # As the original: biases start at zero, every other table at a unit normal from
      # tf.compat.v1.random_normal_initializer, looked up now (a patched one is used).
      init = (tf.compat.v1.random_normal_initializer() if random else
              tf.compat.v1.zeros_initializer())
      return mtf.get_variable(mesh, name + suffix, mtf.Shape(dims), initializer=init,
                              dtype=variable_dtype)
    self._embedding = variable("_embedding_weights", [vocab_dim, output_dim])
    self._context = variable("_context_weights", [self._components_dim, self._copy_dim,
                                                  output_dim])
    self._context_bias = variable("_context_weights_bias",
                                  [self._components_dim, output_dim], random=False)
    self._prior_weights = variable("_prior_weights", [self._gates_dim, gate_dim,
                                                      self._copy_dim])
    self._prior_weights_bias = variable("_prior_weights_bias", [self._gates_dim, gate_dim],
                                        random=False)
    self._prior_vocab_vector = variable("_prior_vocab_vector", [self._frequent_dim,
                                                                gate_dim])
    self._prior_gates_vector = variable("_prior_gates_vector",
                                        [self._gates_dim, self._copy_dim])
    self._prior_bias = variable("_prior_bias", [self._frequent_dim, self._gates_dim])

  def ids_to_embedding(self, ids, context):
    """The rows of the shared matrix at ids."""
    del context
    from models.transformer.vocab_embeddings import _check_ids  # pylint: disable=g-import-not-at-top
    _check_ids(ids, self._vocab_dim, "Mixtape.ids_to_embedding")
    return mtf.gather(self._embedding, ids, self._vocab_dim)

  def _to_vocab(self, mesh, dtype):
    """[frequent_vocab, vocab]: 1.0 where row i of the frequent tables is that id."""
    rows = mtf.range(mesh, self._frequent_dim, tf.int32)
    rare = self._vocab_dim.size - self._extra_ids - self._num_frequent
    ids = rows + rare * mtf.cast(mtf.greater_equal(rows, self._num_frequent), tf.int32)
    return mtf.one_hot(ids, self._vocab_dim, dtype=dtype)

  def _node(self, s, i):
    one = mtf.Dimension(self._gates_dim.name, 1)
    return mtf.reduce_sum(mtf.slice(s, i, 1, self._gates_dim.name), reduced_dim=one)

  def hidden_to_logits(self, hidden, context):
    """Logits over the vocab: the gate-weighted mixture of the four contexts' logits."""
    train = context is not None and context.train
    g = mtf.rename_dimension(hidden * self._output_dim.size ** -0.5,
                             self._output_dim.name, self._copy_dim.name)
    contexts = mtf.tanh(mtf.einsum([g, self._context], reduced_dims=[self._copy_dim]) +
                        self._context_bias)
    if train and self._dropout_rate:
      contexts = mtf.dropout(contexts, is_training=True, rate=self._dropout_rate)
    component_logits = mtf.einsum([contexts, self._embedding],
                                  reduced_dims=[self._output_dim])
    gate_hidden = mtf.tanh(mtf.einsum([g, self._prior_weights],
                                      reduced_dims=[self._copy_dim]) +
                           self._prior_weights_bias)
    own = mtf.einsum([gate_hidden, self._prior_vocab_vector],
                     reduced_dims=gate_hidden.shape.dims[-1:]) + self._prior_bias
    own = mtf.einsum([own, self._to_vocab(hidden.mesh, hidden.dtype)],
                     reduced_dims=[self._frequent_dim])
    gate_logits = (mtf.einsum([g, self._prior_gates_vector],
                              reduced_dims=[self._copy_dim]) + own)
    if train and self._noise_std_dev:
      gate_logits += mtf.random_normal(hidden.mesh, gate_logits.shape,
                                       stddev=self._noise_std_dev, dtype=hidden.dtype)
    s = mtf.sigmoid(gate_logits)
    s1, s2, s3 = self._node(s, 0), self._node(s, 1), self._node(s, 2)
    weights = mtf.stack([s1 * s2, s1 * (1.0 - s2), (1.0 - s1) * s3,
                         (1.0 - s1) * (1.0 - s3)], self._components_dim.name,
                        axis=s1.shape.ndims)
    return mtf.einsum([weights, component_logits],
                      output_shape=hidden.shape.dims[:-1] + [self._vocab_dim])
