"""softmax_cross_entropy_with_logits against mtf.one_hot targets runs as one fused op
(ops/fused_cross_entropy.py) and equals the dense composite in loss and gradient, with
the vocab whole or split, ids outside the vocab giving 0, and z_loss; other targets keep
the composite."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.ops.fused_cross_entropy import OneHotCrossEntropyOperation
from mesh_tf.plans import rules as plan_rules

B, L, V = 2, 3, 8
LOGITS = np.random.RandomState(0).randn(B, L, V).astype(np.float32)
# -1 and V are outside the vocabulary: their one-hot rows are all zeros.
IDS = np.array([[3, 2, 6], [4, V, -1]], np.int32)
SOFT = np.random.RandomState(1).dirichlet(np.ones(V), size=(B, L)).astype(np.float32)


def _reference(targets, z_loss):
  x = tf.Variable(LOGITS)
  with tf.GradientTape() as tape:
    lse = tf.reduce_logsumexp(x, -1)
    loss = tf.reduce_sum((lse[..., None] - x) * targets, -1) + z_loss * tf.square(lse)
    total = tf.reduce_sum(loss)
  return loss.numpy(), tape.gradient(total, x).numpy()


def _mtf(impl, one_hot_targets, z_loss):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  b, l, v = mtf.Dimension("batch", B), mtf.Dimension("length", L), mtf.Dimension("vocab", V)
  logits = mtf.get_variable(mesh, "logits", [b, l, v],
                            initializer=lambda shape, dtype, **_: tf.constant(LOGITS))
  if one_hot_targets:
    targets = mtf.one_hot(mtf.import_tf_tensor(mesh, tf.constant(IDS), [b, l]), v)
  else:
    targets = mtf.import_tf_tensor(mesh, tf.constant(SOFT), [b, l, v])
  loss = mtf.layers.softmax_cross_entropy_with_logits(logits, targets, v, z_loss=z_loss)
  grad, = mtf.gradients([mtf.reduce_sum(loss)], [logits])
  fused = any(isinstance(op, OneHotCrossEntropyOperation) for op in graph.operations)
  lowering = mtf.Lowering(graph, {mesh: impl})
  return (lowering.export_to_tf_tensor(loss).numpy(),
          lowering.export_to_tf_tensor(grad).numpy(), fused)


LAYOUTS = [("placement", "", ""), ("placement", "a:4", "vocab:a"),
           ("placement", "a:2;b:2", "batch:a;vocab:b"), ("simd", "a:4", "vocab:a"),
           ("simd", "a:2;b:2", "batch:a;vocab:b"), ("gspmd", "a:2;b:2", "batch:a;vocab:b")]


@pytest.mark.parametrize("backend,mesh,layout", LAYOUTS,
                         ids=["%s-%s" % (b, m or "single") for b, m, _ in LAYOUTS])
@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
def test_one_hot_targets_fuse_and_match_the_composite(backend, mesh, layout, z_loss):
  devices = ["/cpu:%d" % i for i in range(4)] if mesh else [""]
  loss, grad, fused = _mtf(mtf.make_mesh_impl(backend, mesh, layout, devices), True, z_loss)
  want_loss, want_grad = _reference(tf.one_hot(IDS, V), z_loss)
  assert fused
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-5)
  assert loss[1, 1] == pytest.approx(z_loss * np.log(np.exp(LOGITS[1, 1]).sum()) ** 2,
                                     rel=1e-5)  # id V: only the z_loss term


def test_soft_targets_keep_the_composite():
  impl = mtf.make_mesh_impl("placement", "a:4", "vocab:a", ["/cpu:%d" % i for i in range(4)])
  loss, grad, fused = _mtf(impl, False, 0.0)
  want_loss, want_grad = _reference(SOFT, 0.0)
  assert not fused
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-5)


def test_split_vocab_plan_is_three_allreduces_of_the_reduced_shape():
  layout = mtf.MeshLayout("a:2;b:2", "batch:a;vocab:b")
  shape = mtf.Shape([mtf.Dimension("batch", B), mtf.Dimension("length", L),
                     mtf.Dimension("vocab", V)])
  plan = plan_rules.cross_entropy_plan(layout, shape, shape.dims[-1], 4)
  assert [(m.steps[0].mesh_axes, m.steps[0].reduction) for m in plan.middle] == [
      ((1,), "MAX"), ((1,), "SUM"), ((1,), "SUM")]  # mesh axis 1 ("b") splits vocab
  assert all(m.shape == shape - [shape.dims[-1]] for m in plan.middle)
  assert not plan_rules.cross_entropy_plan(
      mtf.MeshLayout("a:2;b:2", "batch:a"), shape, shape.dims[-1], 4).middle


@pytest.mark.parametrize("mesh,layout", [("", ""), ("a:4", "vocab:a")])
def test_loss_stays_finite_where_the_target_probability_underflows(mesh, layout):
  """The target's logit 150 below the largest: its probability is 0 in float32, and the
  loss is still lse - logit (about 150), as the composite gives."""
  graph = mtf.Graph()
  m = mtf.Mesh(graph, "m")
  b, v = mtf.Dimension("batch", 2), mtf.Dimension("vocab", V)
  values = np.zeros([2, V], np.float32)
  values[:, 0] = 150.0
  logits = mtf.import_tf_tensor(m, tf.constant(values), [b, v])
  ids = mtf.import_tf_tensor(m, tf.constant([3, 0], tf.int32), [b])
  loss = mtf.layers.softmax_cross_entropy_with_logits(logits, mtf.one_hot(ids, v), v)
  devices = ["/cpu:%d" % i for i in range(4)] if mesh else [""]
  got = mtf.Lowering(graph, {m: mtf.make_mesh_impl("placement", mesh, layout, devices)}
                     ).export_to_tf_tensor(loss).numpy()
  want = tf.reduce_logsumexp(values, -1).numpy() - values[[0, 1], [3, 0]]
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
