"""The traced train step of a toy LM stays small: the TF ops it emits on one device are
bounded (name-based broadcasting, reductions and constants emit minimal TF ops), and the
SIMD emulation's step has the same ops at 8 and 64 emulated cores.

The bounds sit a little above what the lowering emits today (placement 458 ops on one
device and 1,583 on 8, function bodies included; on 8 devices the slices' einsums have
few rows, so they are reshapes around a MatMul, lowering/local_einsum.py: 1,506 before;
SIMD 513 on one core, 1,517 on 8 or 64, of which about 350 are the reshapes around the
batch matmuls that replace its mesh-labelled einsums and about 250 the transposes that
fold a mesh axis into one full-size matmul, which keep the step at 512 cores within
1.1x of 8: issue 34). They include the fused attention (ops/fused_attention.py:
transposes of q, k, v and the output around BatchMatMulV2) and the fused one-hot
cross-entropy. On 8 CPUs of one process placement
computes replicated values once and keeps one variable per distinct slice
(PlacementMeshImpl.shares_memory), and each device holds each distinct constant once
(backends/slice_replay.py): 2,277 ops, not 4,872; since the other devices call one
function per run of slice computations between collectives (backends/slice_segments.py),
1,506 (before the MatMuls above). Before issue 16's clean-up the same step traced 1,033
(placement, one device), 2,334 and 2,546 (SIMD).
"""
import collections

import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from models.tiny_lm import config, mtf_model

PLACEMENT_ONE_DEVICE_BOUND = 500
SIMD_ONE_CORE_BOUND = 530
SIMD_EIGHT_CORES_BOUND = 1540
PLACEMENT_EIGHT_DEVICES_BOUND = 1620
# Plain TF's step of the same model (tf.GradientTape) is the floor this is measured
# against; mesh_tf adds its variable-per-slice reads and the SGD update as mtf ops.
LAYOUT = "batch:rows;d_ff:cols;heads:cols;vocab:cols"


def _toy_config():
  return config.TinyLmConfig()  # batch 16, length 32, vocab 64, d_model 32, 2 layers


def _graph_and_loss(impl):
  """(traced graph, first loss) of the toy LM's train step on impl."""
  c = _toy_config()
  batch = config.synthetic_batch(c)
  inputs, targets = tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])
  step = mtf_model.TinyLmModel(c, config.initial_weights(c)).make_train_step(impl)
  graph = step.get_concrete_function(inputs, targets).graph
  return graph, float(step(inputs, targets))


def _op_types(graph):
  """Counter of TF op types in graph, nested function bodies included."""
  graph_def = graph.as_graph_def()
  kinds = collections.Counter(n.op for n in graph_def.node)
  for f in graph_def.library.function:
    kinds.update(n.op for n in f.node_def)
  return kinds


def _plain_tf_loss():
  """First loss of the same model written in plain TF on one device."""
  c = _toy_config()
  weights = {k: tf.Variable(w) for k, w in config.initial_weights(c).items()}
  batch = config.synthetic_batch(c)
  inputs, targets = batch[:, :-1], batch[:, 1:]

  def norm(x, scale):
    return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True) + 1e-6) * scale

  x = tf.gather(weights["embedding"], inputs)
  causal = tf.cast(tf.range(c.length)[:, None] < tf.range(c.length)[None, :],
                   tf.float32) * -1e9
  for i in range(c.num_layers):
    v = lambda n, i=i: weights["layer_%d/%s" % (i, n)]
    h = norm(x, v("attn_scale"))
    q = tf.einsum("bld,dhk->blhk", h, v("q"))
    k = tf.einsum("bmd,dhk->bmhk", h, v("k"))
    val = tf.einsum("bmd,dhk->bmhk", h, v("v"))
    logits = tf.einsum("blhk,bmhk->blhm", q, k) + causal[:, None, :]
    attn = tf.einsum("blhm,bmhk->blhk", tf.nn.softmax(logits, -1), val)
    x += tf.einsum("blhk,hkd->bld", attn, v("o"))
    h = norm(x, v("ffn_scale"))
    x += tf.einsum("blf,fd->bld", tf.nn.relu(tf.einsum("bld,df->blf", h, v("wi"))),
                   v("wo"))
  logits = tf.einsum("bld,dv->blv", norm(x, weights["final_scale"]), weights["softmax"])
  return float(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
      targets, logits)))


def test_placement_one_device_op_count_is_bounded():
  graph, loss = _graph_and_loss(mtf.make_mesh_impl("placement", "", "", [""]))
  kinds = _op_types(graph)
  total = sum(kinds.values())
  assert total <= PLACEMENT_ONE_DEVICE_BOUND, (total, kinds.most_common(12))
  # broadcasting by name adds at most one reshape per operand, never ExpandDims chains
  assert kinds["ExpandDims"] == 0, kinds.most_common(12)
  # each slice variable is read once, without an Identity after the read
  assert kinds["Identity"] <= 4, kinds.most_common(12)
  np.testing.assert_allclose(loss, _plain_tf_loss(), rtol=1e-5)


def test_simd_op_count_is_bounded_and_independent_of_core_count():
  counts, kinds, losses = {}, {}, {}
  for mesh_shape in ["", "rows:2;cols:4", "rows:16;cols:4"]:
    impl = mtf.SimdMeshImpl(mesh_shape, LAYOUT if mesh_shape else "")
    graph, losses[mesh_shape] = _graph_and_loss(impl)
    kinds[impl.size] = _op_types(graph)
    counts[impl.size] = sum(kinds[impl.size].values())
  assert counts[1] <= SIMD_ONE_CORE_BOUND, (counts[1], kinds[1].most_common(12))
  assert counts[8] <= SIMD_EIGHT_CORES_BOUND, (counts[8], kinds[8].most_common(12))
  assert counts[8] == counts[64], counts
  assert kinds[8] == kinds[64]
  # known axis arguments are shifted past the mesh axes in Python, not by a
  # GreaterEqual/SelectV2/AddV2 per axis argument (the model itself has 3 GreaterEqual)
  assert kinds[8]["GreaterEqual"] <= 4 and kinds[8]["ExpandDims"] == 0, kinds[8]
  reference = _plain_tf_loss()
  for mesh_shape, loss in losses.items():
    np.testing.assert_allclose(loss, reference, rtol=1e-5, err_msg=mesh_shape)


def test_placement_eight_devices_op_count_is_bounded():
  """Between CPUs of one process an allreduce is one AddN (or a tree), and the step is
  about one device's ops plus, per run of slice computations between collectives, a
  function of them called on the other devices (or, for a few ops, their copies)."""
  impl = mtf.make_mesh_impl("placement", "rows:2;cols:4", LAYOUT,
                            ["/cpu:%d" % i for i in range(8)])
  graph, loss = _graph_and_loss(impl)
  kinds = _op_types(graph)
  total = sum(kinds.values())
  assert total <= PLACEMENT_EIGHT_DEVICES_BOUND, (total, kinds.most_common(12))
  # no ring shards: no Split/ConcatV2 chains per collective (the Splits cut the inputs
  # and targets into slices)
  assert kinds["Split"] <= 2 and kinds["ConcatV2"] <= 8, kinds.most_common(20)
  np.testing.assert_allclose(loss, _plain_tf_loss(), rtol=1e-5)
