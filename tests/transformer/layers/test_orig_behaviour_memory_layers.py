"""Issue 32, item 5: ProductKeyValueMemory as the original: any key_size (an odd one
gives halves of key_size // 2), the original's dim names, `get_indices(keys, query)`
returning the knn best product keys' (scores, slots) of shape [..., n_heads, knn], and
`call` keeping x's shape, the values table coming from
tf.compat.v1.random_normal_initializer; the read is checked against numpy."""
from unittest import mock

import numpy as np
import pytest
import scipy.special
import tensorflow as tf
import tensorflow.compat.v1 as tf1

import mesh_tf as mtf
from models.transformer import memory_layers


def _mesh():
  graph = mtf.Graph()
  return graph, mtf.Mesh(graph, "m")


def _lower(graph, mesh, tensors):
  lowering = mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl([], {}, [""])})
  return [lowering.export_to_tf_tensor(t).numpy() for t in tensors], lowering


def test_get_indices_matches_hand_computed_product_keys():
  graph, mesh = _mesh()
  dims = {n: mtf.Dimension(n, s) for n, s in [("batch", 2), ("length", 2), ("n_heads", 2),
                                               ("product_key", 2), ("key", 1),
                                               ("n_keys", 3)]}
  query = mtf.ones(mesh, mtf.Shape([dims[n] for n in
                                    ("batch", "length", "n_heads", "product_key", "key")]))
  keys_vals = [[[[4], [1], [2]], [[2], [-1], [2]]], [[[1], [2], [5]], [[6], [1], [4]]]]
  keys = mtf.constant(mesh, keys_vals, mtf.Shape(
      [dims[n] for n in ("n_heads", "product_key", "n_keys", "key")]))
  pkm = memory_layers.ProductKeyValueMemory(2, 3, 2, 2)
  scores, slots = pkm.get_indices(keys, query)
  expected_shape = mtf.Shape([dims["batch"], dims["length"], dims["n_heads"],
                              mtf.Dimension("knn", 2)])
  assert scores.shape == expected_shape and slots.shape == expected_shape
  (got_s, got_i), _ = _lower(graph, mesh, [scores, slots])
  np.testing.assert_array_equal(got_s, np.broadcast_to([[6, 6], [11, 9]], [2, 2, 2, 2]))
  np.testing.assert_array_equal(got_i, np.broadcast_to([[0, 2], [6, 8]], [2, 2, 2, 2]))


def _numpy_get_indices(keys, query, n_keys, knn):
  """keys [h, 2, n, k], query [..., h, 2, k] -> scores, slots [..., h, knn]."""
  half = np.einsum("...hpk,hpnk->...hpn", query, keys)
  order = np.argsort(-half, axis=-1, kind="stable")[..., :knn]
  top = np.take_along_axis(half, order, -1)
  pair = top[..., 0, :, None] + top[..., 1, None, :]
  slot = order[..., 0, :, None] * n_keys + order[..., 1, None, :]
  pair = pair.reshape(pair.shape[:-2] + (-1,))
  slot = slot.reshape(slot.shape[:-2] + (-1,))
  best = np.argsort(-pair, axis=-1, kind="stable")[..., :knn]
  return np.take_along_axis(pair, best, -1), np.take_along_axis(slot, best, -1)


@pytest.mark.parametrize("key_size", [5, 4])
def test_call_shape_and_values(key_size):
  graph, mesh = _mesh()
  n_keys, n_heads, knn, model = 6, 2, 3, 10
  batch, length = mtf.Dimension("batch", 5), mtf.Dimension("length", 4)
  model_dim = mtf.Dimension("model", model)
  rng = np.random.RandomState(0)
  x_val = rng.randn(5, 4, model).astype(np.float32)
  x = mtf.import_tf_tensor(mesh, tf.constant(x_val), mtf.Shape([batch, length, model_dim]))
  table = np.arange(n_keys ** 2 * model, dtype=np.float32).reshape(n_keys ** 2, model)

  def values_init(shape, dtype=tf.float32, **unused):
    assert tuple(shape) == table.shape
    return tf.constant(table, dtype)

  context = mock.MagicMock()
  context.mesh = mesh
  context.variable_dtype = tf.float32
  layer = memory_layers.ProductKeyValueMemory(key_size, n_keys, n_heads, knn)
  with mock.patch.object(tf1, "random_normal_initializer", return_value=values_init):
    out = layer.call(context, x)
  assert out.shape == x.shape
  (got,), lowering = _lower(graph, mesh, [out])
  params = {v.name: laid.read_full().numpy() for v, laid in lowering.variables.items()}
  half = key_size // 2
  assert params["keys"].shape == (n_heads, 2, n_keys, half)
  np.testing.assert_array_equal(params["values"], table)
  query = np.einsum("bld,dhpk->blhpk", x_val, params["query/kernel"]) + params["query/bias"]
  mean = query.mean(-1, keepdims=True)
  var = ((query - mean) ** 2).mean(-1, keepdims=True)
  ln = {k.split("/")[-1]: v for k, v in params.items() if "layer_norm" in k}
  scale = next(v for k, v in ln.items() if "scale" in k)
  bias = next(v for k, v in ln.items() if "bias" in k)
  query = (query - mean) / np.sqrt(var + 1e-6) * scale + bias
  scores, slots = _numpy_get_indices(params["keys"], query, n_keys, knn)
  weights = scipy.special.softmax(scores, axis=-1)
  expected = np.einsum("blhk,blhkv->blv", weights, table[slots])
  np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-3)
