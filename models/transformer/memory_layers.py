"""Product-key memory (Lample et al. 2019): `ProductKeyValueMemory`.

Each of n_heads heads turns a position's hidden state into two half-queries of
key_size // 2 ("query", then a layer norm over the key dim where the paper has batch
norm, as in the original), each scored against its n_keys sub-keys ("keys" [n_heads,
product_key, n_keys, key]). The knn best sub-keys of each half give knn**2 candidates
(i, j) with score s1[i] + s2[j]; the knn best select slots i * n_keys + j of "values"
[n_keys**2, d_model]. The output is the softmax(score)-weighted sum of the selected
values over heads and candidates. Names and shapes are the original's.
"""
import gin

import mesh_tf as mtf
from models.transformer.context import incremental_aware
from models.transformer.transformer_layer import TransformerLayer


@gin.configurable(module="memory_layers")
class ProductKeyValueMemory(TransformerLayer):
  """A product-key memory layer (see the module docstring).

  Args:
    key_size: width of each head's query; each half (sub-key) takes key_size // 2.
    n_keys: sub-keys per half; the memory holds n_keys**2 values.
    n_heads: independent query heads, whose read values are summed.
    knn: candidates kept per half and values read per head, at most n_keys.
  """

  def __init__(self, key_size=gin.REQUIRED, n_keys=gin.REQUIRED, n_heads=gin.REQUIRED,
               knn=gin.REQUIRED):
    if knn > n_keys:
      raise mtf.MtfError("ProductKeyValueMemory: knn=%d exceeds n_keys=%d" % (knn, n_keys))
    self.key_size = key_size
    self.n_keys = n_keys
    self.n_values = n_keys ** 2
    self.n_heads = n_heads
    self.knn = knn

  def get_indices(self, keys, query):
    """The knn best product keys of every query: (scores, memory slots), both
    [query dims..., n_heads, knn]. keys: [n_heads, product_key, n_keys, key]; query:
    [..., n_heads, product_key, key]."""
    keys_dim = keys.shape.dims[2]
    product_dim = query.shape.dims[-2]
    knn_dim = mtf.Dimension("knn", self.knn)
    half_scores = mtf.einsum(
        [query, keys], output_shape=mtf.Shape(query.shape.dims[:-1] + [keys_dim]))
    half_scores, half_ids = mtf.top_k(half_scores, keys_dim, knn_dim)
    scores_1, scores_2 = mtf.unstack(half_scores, product_dim)
    ids_1, ids_2 = mtf.unstack(half_ids, product_dim)
    knn2_dim = mtf.Dimension("knn2", self.knn)
    pair_dim = mtf.Dimension("knn_square_dim", self.knn ** 2)
    pair_shape = mtf.Shape(scores_1.shape.dims + [knn2_dim])
    flat = lambda t: mtf.replace_dimensions(t, [knn_dim, knn2_dim], pair_dim)
    pair_scores = flat(mtf.add(scores_1, mtf.rename_dimension(scores_2, "knn", "knn2"),
                               output_shape=pair_shape))
    pair_slots = flat(mtf.add(ids_1 * self.n_keys,
                              mtf.rename_dimension(ids_2, "knn", "knn2"),
                              output_shape=pair_shape))
    best_scores, best_pairs = mtf.top_k(pair_scores, pair_dim, knn_dim)
    slots = mtf.reduce_sum(
        mtf.one_hot(best_pairs, pair_dim, dtype=pair_slots.dtype) * pair_slots,
        reduced_dim=pair_dim)
    return best_scores, slots

  @incremental_aware
  def call(self, context, x):
    """Reads the memory at the best keys for every position of x (position-wise, so
    cached decoding needs nothing); the result has x's shape."""
    value_dim = x.shape.dims[-1]
    heads_dim = mtf.Dimension("n_heads", self.n_heads)
    product_dim = mtf.Dimension("product_key", 2)
    keys_dim = mtf.Dimension("n_keys", self.n_keys)
    key_dim = mtf.Dimension("key", self.key_size // 2)
    values_dim = mtf.Dimension("n_values", self.n_values)
    vdt = context.variable_dtype
    keys = mtf.get_variable(context.mesh, "keys",
                            mtf.Shape([heads_dim, product_dim, keys_dim, key_dim]),
                            dtype=vdt)
    values = mtf.layers.embedding_weights(context.mesh, values_dim, value_dim, vdt,
                                          name="values")
    query = mtf.layers.dense(x, [heads_dim, product_dim, key_dim],
                             reduced_dims=x.shape.dims[-1:], use_bias=True,
                             variable_dtype=vdt, name="query")
    query = mtf.layers.layer_norm(query, query.shape.dims[-1])
    scores, slots = self.get_indices(mtf.cast(keys, query.dtype), query)
    weights = mtf.softmax(scores, reduced_dim=scores.shape.dims[-1])
    read = mtf.gather(values, slots, values_dim)
    return mtf.einsum([mtf.cast(read, weights.dtype), weights],
                      reduced_dims=weights.shape.dims[-2:])
