"""Product-key memory (Lample et al. 2019): `ProductKeyValueMemory`.

Each of n_heads heads turns a position's hidden state into two half-queries of
key_size / 2 (a dense layer with bias, "query/kernel" [d_model, heads, 2, key_size / 2]
and "query/bias", then layer norm over the key, "layer_prepostprocess/layer_norm/
layer_norm_scale" and "..._bias": the original normalizes the queries so, in place of
the paper's batch norm). Half-query h is scored against the n_keys sub-keys
keys[:, h] ("keys", [heads, 2, n_keys, key_size / 2]). The knn best sub-keys of each
half give knn**2 candidate keys (i, j) with score s1[i] + s2[j]; the knn best of those
select memory slots i * n_keys + j of the value table ("values", [n_keys**2, d_model]).
The output is the sum over heads of the softmax(score)-weighted values. The variable
names and shapes are the original's.
"""
import gin
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.context import incremental_aware
from models.transformer.transformer_layer import TransformerLayer


@gin.configurable(module="memory_layers")
class ProductKeyValueMemory(TransformerLayer):
  """A product-key memory layer (see the module docstring).

  Args:
    key_size: width of each head's query (even; each sub-key takes half).
    n_keys: sub-keys per half; the memory holds n_keys**2 values.
    n_heads: independent query heads, whose read values are summed.
    knn: candidates kept per half and values read per head.
  """

  def __init__(self, key_size=gin.REQUIRED, n_keys=gin.REQUIRED, n_heads=gin.REQUIRED,
               knn=gin.REQUIRED):
    if key_size % 2:
      raise mtf.MtfError("ProductKeyValueMemory: key_size %d must be even (two halves)"
                         % key_size)
    if knn > n_keys:
      raise mtf.MtfError("ProductKeyValueMemory: knn=%d exceeds n_keys=%d" % (knn, n_keys))
    self.key_size = key_size
    self.n_keys = n_keys
    self.n_heads = n_heads
    self.knn = knn
    self._heads_dim = mtf.Dimension("pkm_heads", n_heads)
    self._key_dim = mtf.Dimension("pkm_key", key_size)
    self._half_dim = mtf.Dimension("pkm_half_key", key_size // 2)
    self._n_keys_dim = mtf.Dimension("pkm_keys", n_keys)
    self._values_dim = mtf.Dimension("pkm_values", n_keys ** 2)

  def get_indices(self, keys, query):
    """(scores, indices) of the knn sub-keys best matching query, along "pkm_knn".

    keys: [heads, (product_key,) pkm_keys, pkm_half_key]; query: [..., heads,
    (product_key,) pkm_half_key].
    """
    scores = mtf.einsum([query, keys], reduced_dims=[self._half_dim])
    return mtf.top_k(scores, self._n_keys_dim, mtf.Dimension("pkm_knn", self.knn))

  @incremental_aware
  def call(self, context, x):
    """Reads the memory at the best keys for every position of x (position-wise, so
    cached decoding needs nothing)."""
    model_dim = x.shape.dims[-1]
    vdt = context.variable_dtype
    product = mtf.Dimension("product_key", 2)
    query = mtf.layers.dense(x, [self._heads_dim, product, self._half_dim], use_bias=True,
                             variable_dtype=vdt, name="query")
    query = mtf.layers.layer_norm(query, self._half_dim)
    keys = mtf.get_variable(
        x.mesh, "keys",
        mtf.Shape([self._heads_dim, product, self._n_keys_dim, self._half_dim]),
        initializer=tf.random_normal_initializer(stddev=self._half_dim.size ** -0.5),
        dtype=vdt)
    values = mtf.get_variable(
        x.mesh, "values", mtf.Shape([self._values_dim, model_dim]),
        initializer=tf.random_normal_initializer(stddev=model_dim.size ** -0.5),
        dtype=vdt)
    one = mtf.Dimension(product.name, 1)
    half = lambda t, i: mtf.reduce_sum(mtf.slice(t, i, 1, product.name), reduced_dim=one)
    knn_1 = mtf.Dimension("pkm_knn_1", self.knn)
    knn_2 = mtf.Dimension("pkm_knn_2", self.knn)
    (s1, i1), (s2, i2) = [self.get_indices(half(keys, i), half(query, i)) for i in (0, 1)]
    s1, i1 = [mtf.rename_dimension(t, "pkm_knn", knn_1.name) for t in (s1, i1)]
    s2, i2 = [mtf.rename_dimension(t, "pkm_knn", knn_2.name) for t in (s2, i2)]
    pair_scores = s1 + s2
    pair_slots = i1 * self.n_keys + i2
    pairs = mtf.Dimension("pkm_pairs", self.knn ** 2)
    flat = pair_scores.shape.dims[:-2] + [pairs]
    pair_scores = mtf.reshape(pair_scores, flat)
    pair_slots = mtf.reshape(pair_slots, flat)
    knn = mtf.Dimension("pkm_knn", self.knn)
    best_scores, best_pairs = mtf.top_k(pair_scores, pairs, knn)
    slots = mtf.reduce_sum(mtf.one_hot(best_pairs, pairs, dtype=tf.int32) * pair_slots,
                           reduced_dim=pairs)
    weights = mtf.softmax(best_scores, knn)
    read = mtf.gather(values, slots, self._values_dim)
    return mtf.einsum([weights, mtf.cast(read, weights.dtype)], output_shape=x.shape)
