"""Losses, masks and embeddings of mtf.layers (losses.py, masks.py, embedding.py)."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from layer_testing import FOCUSED_CASES, FOCUSED_IDS, check_layer
from mtf_testing import (BATCH, CLASSES, HIDDEN, LENGTH, away_from_zero, check_against_tf,
                         new_mesh, random_array, random_ints)

VOCAB = mtf.Dimension("vocab", 16)


def test_sigmoid_cross_entropy_every_layout(mesh_impl):
  shape = [BATCH, HIDDEN]
  check_against_tf(
      mesh_impl, [(away_from_zero(shape, 1), shape), (random_array(shape, 2, 0.0, 1.0),
                                                      shape)],
      mtf.layers.sigmoid_cross_entropy_with_logits,
      lambda l, t: tf.nn.sigmoid_cross_entropy_with_logits(labels=t, logits=l))


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_softmax_cross_entropy_with_z_loss(make_mesh_impl, case):
  shape = [BATCH, HIDDEN]
  labels = random_ints([BATCH], 3, 0, 8)

  def mtf_fn(logits):
    targets = mtf.one_hot(mtf.import_tf_tensor(logits.mesh, labels, [BATCH]), HIDDEN)
    return mtf.layers.softmax_cross_entropy_with_logits(logits, targets, HIDDEN,
                                                        z_loss=1e-2)

  def tf_fn(logits):
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return xent + 1e-2 * tf.square(tf.reduce_logsumexp(logits, axis=-1))
  check_against_tf(make_mesh_impl(*case), [(random_array(shape, 4), shape)], mtf_fn,
                   tf_fn)


def test_weights_nonzero(make_mesh_impl):
  ids = random_ints([BATCH, LENGTH], 5, 0, 3)
  for dtype in (tf.int32, tf.float32):
    got, _ = check_against_tf(
        make_mesh_impl("all:8", "batch:all"), [(ids, [BATCH, LENGTH])],
        lambda t, d=dtype: mtf.layers.weights_nonzero(t, dtype=d),
        lambda t, d=dtype: tf.cast(tf.not_equal(t, 0), d))
    assert got[0].dtype == dtype.as_numpy_dtype


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_attention_masks(make_mesh_impl, case):
  ids = random_ints([BATCH, LENGTH], 6, 0, 3)
  segments = np.sort(random_ints([BATCH, LENGTH], 7, 1, 3), axis=1)
  memory_segments = random_ints([BATCH, LENGTH], 8, 1, 3)

  def mtf_fn(mesh, t, s, ms):
    return [mtf.layers.attention_mask_ignore_padding(t),
            mtf.layers.attention_mask_autoregressive(mtf.range(mesh, LENGTH, tf.int32)),
            mtf.layers.attention_mask_same_segment(s),
            mtf.layers.attention_mask_same_segment(s, ms, dtype=tf.bfloat16)]

  def tf_fn(t, s, ms):
    pos = np.arange(3)
    return [tf.where(tf.equal(t, 0), -1e9, 0.0),
            np.where(pos[:, None] < pos[None, :], -1e9, 0.0).astype(np.float32),
            tf.where(tf.not_equal(s[:, :, None], s[:, None, :]), -1e9, 0.0),
            tf.cast(tf.where(tf.not_equal(s[:, :, None], ms[:, None, :]), -1e9, 0.0),
                    tf.bfloat16)]
  got, _ = check_against_tf(
      make_mesh_impl(*case), [(ids, [BATCH, LENGTH]), (segments, [BATCH, LENGTH]),
                              (memory_segments, [BATCH, LENGTH])],
      lambda *a: _named(mtf_fn(*a)), tf_fn, pass_mesh=True)
  assert got[0].shape == (8, 3)


def _named(masks):
  """Checks the masks' dim names (memory_length for the memory side)."""
  names = [m.shape.dimension_names for m in masks]
  assert names == [["batch", "memory_length"], ["length", "memory_length"],
                   ["batch", "length", "memory_length"],
                   ["batch", "length", "memory_length"]]
  return masks


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_embedding(make_mesh_impl, case):
  ids = random_ints([BATCH, LENGTH], 9, 0, 16)

  def build(t):
    return mtf.layers.embedding(t, VOCAB, HIDDEN, tf.float32)

  def reference(xs, p):
    return tf.gather(p["embedding"], xs[0])
  _, params = check_layer(make_mesh_impl(*case), [(ids, [BATCH, LENGTH])], build,
                          reference)
  assert params["embedding"].shape == (16, 8)
  assert 0.6 < params["embedding"].std() < 1.4  # unit normal by default


def test_embedding_weights_ensemble_and_initializer():
  graph, mesh = new_mesh()
  ensemble = mtf.Dimension("ensemble", 2)
  w = mtf.layers.embedding_weights(mesh, VOCAB, CLASSES, mtf.VariableDType(tf.float32),
                                   name="shared", ensemble_dim=ensemble,
                                   initializer=tf.constant_initializer(0.5))
  assert w.shape == mtf.Shape([ensemble, VOCAB, CLASSES])
  impl = mtf.PlacementMeshImpl("", "", ["/cpu:0"])
  mtf.Lowering(graph, {mesh: impl})
  np.testing.assert_array_equal(impl.variable_store["shared"].read_full().numpy(),
                                np.full([2, 16, 4], 0.5, np.float32))
