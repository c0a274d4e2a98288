"""Bad input to mtf.layers raises an MtfError naming the layer, tensor and dimension."""
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, LENGTH, new_mesh

FF = mtf.Dimension("ff", 16)
HEADS = mtf.Dimension("heads", 2)
KV = mtf.Dimension("kv", 4)
OTHER = mtf.Dimension("nowhere", 5)


def _x(shape=(BATCH, LENGTH, HIDDEN), dtype=tf.float32):
  _, mesh = new_mesh()
  return mtf.zeros(mesh, list(shape), dtype=dtype)


def _raises(error, fn, *fragments):
  with pytest.raises(error) as info:
    fn()
  for fragment in fragments:
    assert fragment in str(info.value), "%r not in %r" % (fragment, str(info.value))
  return info.value


def test_dense_reduced_dim_not_in_input():
  x = _x()
  err = _raises(mtf.ShapeError, lambda: mtf.layers.dense(x, FF, reduced_dims=[OTHER],
                                                         name="wi"),
                "dense 'wi'", "reduced_dims", "nowhere", x.name)
  assert err.dim == "nowhere" and err.tensor == x.name


def test_dense_expert_dim_not_in_input_and_new_dim_clash():
  x = _x()
  _raises(mtf.ShapeError, lambda: mtf.layers.dense(x, FF, expert_dims=[OTHER]),
          "expert_dims", "nowhere")
  _raises(mtf.ShapeError, lambda: mtf.layers.dense(x, LENGTH, name="clash"),
          "dense 'clash'", "new dim", "length")
  # No new dims is allowed, as in the original: a weighted sum over the reduced dim.
  assert mtf.layers.dense(x, [], name="empty").shape.dims == x.shape.dims[:-1]


def test_dense_product_unknown_activation():
  _raises(mtf.ShapeError, lambda: mtf.layers.dense_product(
      _x(), [HIDDEN], [FF], activation_functions=["linear", "no_such_fn"]), "no_such_fn")


def test_same_explicit_layer_name_twice():
  x = _x()
  mtf.layers.dense(x, FF, name="proj")
  _raises(mtf.ShapeError, lambda: mtf.layers.dense(x, FF, name="proj"), "proj/kernel",
          "already exists")


def test_normalization_dim_not_in_input():
  x = _x()
  _raises(mtf.ShapeError, lambda: mtf.layers.layer_norm(x, OTHER), "layer_norm",
          "nowhere", x.name)
  _raises(mtf.ShapeError, lambda: mtf.layers.rms_norm(x, OTHER, name="final"),
          "rms_norm 'final'", "nowhere")
  _raises(mtf.ShapeError, lambda: mtf.layers.batch_norm(x, True, 0.9, dims_idx_start=2,
                                                        dims_idx_end=2), "batch_norm",
          "select no dim")


def test_loss_shapes_must_match():
  x = _x()
  y = _x((BATCH, LENGTH))
  _raises(mtf.ShapeError, lambda: mtf.layers.sigmoid_cross_entropy_with_logits(x, y),
          "sigmoid_cross_entropy_with_logits", "same shape")


def test_embedding_needs_integer_indices():
  x = _x((BATCH, LENGTH))
  _raises(mtf.ShapeError, lambda: mtf.layers.embedding(x, mtf.Dimension("vocab", 4),
                                                       HIDDEN, tf.float32),
          "embedding", "integers", x.name)


def test_attention_shape_errors():
  x = _x()
  memory = _x((BATCH, mtf.Dimension("memory_length", 3), mtf.Dimension("hidden2", 8)))
  _raises(mtf.ShapeError, lambda: mtf.layers.multihead_attention(
      x, memory, None, KV, HEADS, False, name="encdec"), "encdec", "memory channels",
          "hidden2")
  q = _x((BATCH, HEADS, LENGTH, KV))
  k = _x((BATCH, HEADS, mtf.Dimension("memory_length", 3), mtf.Dimension("kv2", 4)))
  _raises(mtf.ShapeError, lambda: mtf.layers.dot_product_attention(q, k, k, None),
          "dot_product_attention", "channels")
  _raises(mtf.ShapeError, lambda: mtf.layers.compress_mean(x, LENGTH, 2), "compress_mean",
          "does not divide", "length")
  _raises(mtf.ShapeError, lambda: mtf.layers.compress_mean(x, OTHER, 1), "nowhere")
  _raises(mtf.ShapeError, lambda: mtf.layers.masked_local_attention_1d(
      x, KV, HEADS, False, window_size=2, length_per_split=2), "length_per_split",
          "length")


def test_regularizer_arguments():
  x = _x()
  _raises(mtf.MtfError, lambda: mtf.layers.annealed_dropout(x, True, 10, 10, 0.5),
          "end_step", x.name)
  _raises(mtf.ShapeError, lambda: mtf.layers.clip_activation_gradient(x, 0.0),
          "clip_rms_norm", x.name)
