"""A small Transformer-style stack of mtf.layers gives the same numbers (and gradients)
on every backend: placement [2,4], SIMD emulation [8,8] and GSPMD, against one device."""
import functools

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, new_mesh, random_ints

LENGTH = mtf.Dimension("length", 8)
VOCAB = mtf.Dimension("vocab", 16)
HEADS = mtf.Dimension("heads", 8)
KV = mtf.Dimension("kv", 4)
FF = mtf.Dimension("ff", 16)
IDS = random_ints([BATCH, LENGTH], 1, 0, 16)
LABELS = random_ints([BATCH, LENGTH], 2, 0, 16)


def _stack(mesh):
  """Embedding, attention, local attention, FFN, norms and a loss; returns
  (loss, logits, gradients of the loss w.r.t. every trainable variable)."""
  ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
  labels = mtf.import_tf_tensor(mesh, LABELS, [BATCH, LENGTH])
  x = mtf.layers.embedding(ids, VOCAB, HIDDEN, tf.float32)
  mask = mtf.layers.attention_mask_autoregressive(mtf.range(mesh, LENGTH, tf.int32))
  x += mtf.layers.multihead_attention(mtf.layers.layer_norm(x, HIDDEN), None, mask, KV,
                                      HEADS, False)
  x += mtf.layers.masked_local_attention_1d(mtf.layers.rms_norm(x, HIDDEN), KV, HEADS,
                                            False, window_size=3, length_per_split=4,
                                            name="local")
  x += mtf.layers.dense_relu_dense(x, FF, False)
  logits = mtf.layers.dense(x, VOCAB, name="logits")
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(labels, VOCAB), VOCAB))
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  return [loss, logits] + grads


def _run(impl, values=None):
  """Lowers the stack on impl (setting its variables from values); returns (outputs,
  {variable name: value})."""
  graph, mesh = new_mesh()
  outputs = _stack(mesh)
  lowering = mtf.Lowering(graph, {mesh: impl})
  if values is not None:
    for name, value in values.items():
      impl.variable_store[name].assign_full(value)
  got = [lowering.export_to_tf_tensor(t).numpy() for t in outputs]
  return got, {v.name: impl.variable_store[v.name].read_full().numpy()
               for v in graph.all_variables}


def _backends():
  return {
      "placement-2x4": lambda: mtf.PlacementMeshImpl(
          "rows:2;cols:4", "batch:rows;heads:cols;vocab:cols",
          ["/cpu:%d" % i for i in range(8)]),
      "simd-8x8": lambda: mtf.SimdMeshImpl("rows:8;cols:8",
                                           "batch:rows;heads:cols;ff:cols;vocab:cols"),
      "gspmd-2x4": lambda: mtf.GSPMDMeshImpl("rows:2;cols:4",
                                             "batch:rows;ff:cols;heads:cols"),
  }


@functools.lru_cache(maxsize=None)
def _single_device():
  return _run(mtf.PlacementMeshImpl("", "", ["/cpu:0"]))


@pytest.mark.parametrize("backend", sorted(_backends()))
def test_layer_stack_matches_single_device(backend):
  expected, values = _single_device()
  assert len(values) == 10  # embedding, 2 qkvo, 2 norms, wi, wo, logits kernel+bias
  got, _ = _run(_backends()[backend](), values)
  names = ["loss", "logits"] + ["gradient %d" % i for i in range(len(got) - 2)]
  for name, a, b in zip(names, got, expected):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5, err_msg="%s on %s" % (
        name, backend))
  assert np.isfinite(got[0]) and got[0] > 0
