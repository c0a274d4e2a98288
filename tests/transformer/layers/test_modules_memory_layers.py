"""ProductKeyValueMemory: forward and every gradient against plain TF (tf.math.top_k)
from the same weights, on one device and dp+mp layouts (placement, SIMD emulation)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
import mtf_testing
from test_transformer_layers import (  # pylint: disable=g-multiple-import
    D_MODEL, SCOPE, _x, check_against_reference, run_layer)
from models.transformer.memory_layers import ProductKeyValueMemory

KEY, N_KEYS, HEADS, KNN = 8, 4, 2, 2
CASES = [("placement", "", ""),
         ("placement", "rows:2;cols:4", "batch:rows;pkm_values:cols"),
         ("simd", "rows:2;cols:4", "batch:rows;d_model:cols")]
CASE_IDS = ["single", "placement_dp_mp", "simd_dp_mp"]


def tf_memory(x, query_kernel, query_bias, norm_scale, norm_bias, keys, values):
  """query_kernel [d_model, heads, 2, key / 2]; keys [heads, 2, n_keys, key / 2]."""
  q = tf.einsum("bld,dhpk->blhpk", x, query_kernel) + query_bias
  mean = tf.reduce_mean(q, -1, keepdims=True)
  variance = tf.reduce_mean(tf.square(q - mean), -1, keepdims=True)
  q = (q - mean) * tf.math.rsqrt(variance + 1e-6) * norm_scale + norm_bias
  s1 = tf.einsum("blhk,hnk->blhn", q[..., 0, :], keys[:, 0])
  s2 = tf.einsum("blhk,hnk->blhn", q[..., 1, :], keys[:, 1])
  v1, i1 = tf.math.top_k(s1, KNN)
  v2, i2 = tf.math.top_k(s2, KNN)
  pair_scores = tf.reshape(v1[..., :, None] + v2[..., None, :], v1.shape[:-1] + [KNN * KNN])
  pair_slots = tf.reshape(i1[..., :, None] * N_KEYS + i2[..., None, :],
                          v1.shape[:-1] + [KNN * KNN])
  best, which = tf.math.top_k(pair_scores, KNN)
  slots = tf.gather(pair_slots, which, batch_dims=3)
  weights = tf.nn.softmax(best, -1)
  read = tf.einsum("blhkv,vd->blhkd", tf.one_hot(slots, N_KEYS ** 2), values)
  return tf.einsum("blhk,blhkd->bld", weights, read)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_product_key_memory_matches_tf(case):
  x = _x(5)
  layer = ProductKeyValueMemory(key_size=KEY, n_keys=N_KEYS, n_heads=HEADS, knn=KNN)
  result, w = run_layer(layer, mtf_testing.backend_mesh_impl(*case), x)
  shapes = {n[len(SCOPE) + 1:]: v.shape for n, v in result.values.items()}
  norm = "layer_prepostprocess/layer_norm/layer_norm_"
  assert shapes == {"query/kernel": (D_MODEL, HEADS, 2, KEY // 2),
                    "query/bias": (HEADS, 2, KEY // 2),
                    norm + "scale": (KEY // 2,), norm + "bias": (KEY // 2,),
                    "keys": (HEADS, 2, N_KEYS, KEY // 2),
                    "values": (N_KEYS ** 2, D_MODEL)}, shapes

  def ref(x, **v):
    norm = "layer_prepostprocess_layer_norm_layer_norm_"
    return tf_memory(x, v["query_kernel"], v["query_bias"], v[norm + "scale"],
                     v[norm + "bias"], v["keys"], v["values"])
  check_against_reference(result, w, x, ref, rtol=1e-4, atol=1e-5)
  assert np.any(result.grads[SCOPE + "/values"])


def test_bad_configurations_are_named():
  # an odd key_size is the original's too (halves of key_size // 2): no error
  ProductKeyValueMemory(key_size=3, n_keys=4, n_heads=1, knn=2)
  with pytest.raises(mtf.MtfError, match="knn=5 exceeds n_keys=4"):
    ProductKeyValueMemory(key_size=4, n_keys=4, n_heads=1, knn=5)
