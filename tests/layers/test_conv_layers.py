"""Convolution and pooling layers (mesh_tf/layers/convolution.py, pooling.py) against TF
on one device with the same weights; the *_with_blocks layers on meshes that split the
blocks dims, against one unblocked TF convolution of the reassembled image."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from layer_testing import FOCUSED_CASES, FOCUSED_IDS, check_layer
from mtf_testing import BATCH, CLASSES, HIDDEN, new_mesh, random_array

H, W, D = mtf.Dimension("h", 6), mtf.Dimension("w", 4), mtf.Dimension("d", 2)
OUT = mtf.Dimension("out", 3)
X2 = [BATCH, H, W, CLASSES]
X3 = [BATCH, D, H, W, CLASSES]
TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_conv2d_layers(make_mesh_impl, case):
  """Two conv2d layers (the second unnamed one gets scope conv2d_1), then a transpose."""
  def build(x):
    y = mtf.layers.conv2d(x, HIDDEN)
    y = mtf.layers.conv2d(y, OUT, filter_size=(2, 3), strides=(2, 1), padding="VALID")
    return mtf.layers.conv2d_transpose(y, HIDDEN, name="up")

  def reference(xs, p):
    y = tf.nn.conv2d(xs[0], p["conv2d/kernel"], 1, "SAME")
    y = tf.nn.conv2d(y, p["conv2d_1/kernel"], [1, 2, 1, 1], "VALID")
    return tf.nn.conv2d_transpose(y, p["up/kernel"], [8, 6, 4, 8], 2, "SAME")
  _, params = check_layer(make_mesh_impl(*case), [(random_array(X2, 0), X2)], build,
                          reference, **TOL)
  assert {k: v.shape for k, v in params.items()} == {
      "conv2d/kernel": (3, 3, 4, 8), "conv2d_1/kernel": (2, 3, 8, 3),
      "up/kernel": (2, 2, 8, 3)}


@pytest.mark.parametrize("case", FOCUSED_CASES[1:], ids=FOCUSED_IDS[1:])
def test_conv3d_layers(make_mesh_impl, case):
  def build(x):
    y = mtf.layers.conv3d(x, HIDDEN, filter_size=(2, 3, 1))
    return mtf.layers.conv3d_transpose(y, OUT, strides=(1, 2, 2))

  def reference(xs, p):
    y = tf.nn.conv3d(xs[0], p["conv3d/kernel"], [1] * 5, "SAME")
    return tf.nn.conv3d_transpose(y, p["conv3d_transpose/kernel"], [8, 2, 12, 8, 3],
                                  [1, 1, 2, 2, 1], "SAME")
  _, params = check_layer(make_mesh_impl(*case), [(random_array(X3, 1), X3)], build,
                          reference, **TOL)
  assert params["conv3d/kernel"].shape == (2, 3, 1, 4, 8)
  assert params["conv3d_transpose/kernel"].shape == (2, 2, 2, 3, 8)


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_conv1d_and_separable_conv1d(make_mesh_impl, case):
  length = mtf.Dimension("length", 5)
  shape = [BATCH, length, CLASSES]

  def build(x):
    return [mtf.layers.conv1d(x, HIDDEN, filter_size=3, stride=2),
            mtf.layers.separable_conv1d(x, HIDDEN, min_relative_pos=-2, max_relative_pos=1)]

  def reference(xs, p):
    x = xs[0]
    conv = tf.nn.conv1d(x, p["conv2d/kernel"][0], 2, "SAME")
    taps = "separable_conv1d/depthwise_conv_hack/depthwise_dense_%d/"
    padded = tf.pad(x, [[0, 0], [2, 1], [0, 0]])
    mixed = tf.add_n([padded[:, k:k + 5] * p[taps % k + "kernel"] for k in range(4)])
    mixed += p[taps % 0 + "bias"]
    sep = (tf.einsum("blc,co->blo", mixed, p["separable_conv1d/pointwise_dense/kernel"]) +
           p["separable_conv1d/pointwise_dense/bias"])
    return [conv, sep]
  _, params = check_layer(make_mesh_impl(*case), [(random_array(shape, 2), shape)], build,
                          reference, **TOL)
  assert params["conv2d/kernel"].shape == (1, 3, 4, 8)
  assert sorted(n for n in params if n.startswith("separable_conv1d/")) == sorted(
      ["separable_conv1d/depthwise_conv_hack/depthwise_dense_%d/kernel" % k
       for k in range(4)] + ["separable_conv1d/depthwise_conv_hack/depthwise_dense_0/bias",
                             "separable_conv1d/pointwise_dense/kernel",
                             "separable_conv1d/pointwise_dense/bias"])
  assert params["separable_conv1d/depthwise_conv_hack/depthwise_dense_1/kernel"].shape == (4,)


@pytest.mark.parametrize("case", FOCUSED_CASES, ids=FOCUSED_IDS)
def test_pooling_layers(make_mesh_impl, case):
  x3 = [BATCH, mtf.Dimension("d", 4), H, W, HIDDEN]

  def build(x, v):
    return [mtf.layers.max_pool2d(x), mtf.layers.avg_pool2d(x, ksize=(3, 2)),
            mtf.layers.max_pool3d(v, ksize=(2, 3, 1)), mtf.layers.avg_pool3d(v),
            mtf.layers.max_pool2d(x, ksize=(1, 1))]

  def reference(xs, p):
    del p
    x, v = xs
    return [tf.nn.max_pool2d(x, 2, 2, "VALID"), tf.nn.avg_pool2d(x, [3, 2], [3, 2], "VALID"),
            tf.nn.max_pool3d(v, [2, 3, 1], [2, 3, 1], "VALID"),
            tf.nn.avg_pool3d(v, 2, 2, "VALID"), x]
  check_layer(make_mesh_impl(*case), [(random_array(X2, 3), X2), (random_array(x3, 4), x3)],
              build, reference)


# ------------------------------------------------------------------ blocked layers
HB, WB = mtf.Dimension("hb", 2), mtf.Dimension("wb", 4)
BH, BW = mtf.Dimension("h", 3), mtf.Dimension("w", 2)
B2 = mtf.Dimension("batch", 2)
XB = [B2, HB, WB, BH, BW, mtf.Dimension("c", 2)]   # a 6x8 image in 2x4 blocks of 3x2
BLOCK_MESHES = [("rows:2;cols:4", "hb:rows;wb:cols"),
                ("rows:2;cols:4", "wb:cols;batch:rows"), ("b1:2;b2:2", "hb:b1;wb:b2")]
BLOCK_IDS = ["hb:2,wb:4", "wb:4,batch:2", "mnist-style 2x2"]


def unblock(t, n_blocked):
  """[b, blocks (n), sizes (n), rest..., c] -> [b, whole dims (n), rest..., c]."""
  s = t.shape.as_list()
  perm = [0]
  for i in range(n_blocked):
    perm += [1 + i, 1 + n_blocked + i]
  perm += list(range(1 + 2 * n_blocked, len(s)))
  whole = [s[1 + i] * s[1 + n_blocked + i] for i in range(n_blocked)]
  return tf.reshape(tf.transpose(t, perm), [s[0]] + whole + s[1 + 2 * n_blocked:])


def reblock(t, blocks):
  """Inverse of unblock, given the number of blocks of each blocked dim."""
  s = t.shape.as_list()
  n = len(blocks)
  sizes = [s[1 + i] // blocks[i] for i in range(n)]
  split = [s[0]] + [v for pair in zip(blocks, sizes) for v in pair] + s[1 + n:]
  perm = [0] + [1 + 2 * i for i in range(n)] + [2 + 2 * i for i in range(n)]
  perm += list(range(1 + 2 * n, len(split)))
  return tf.transpose(tf.reshape(t, split), perm)


@pytest.mark.parametrize("case", BLOCK_MESHES, ids=BLOCK_IDS)
def test_conv2d_with_blocks(make_mesh_impl, case):
  """3x3 (halo 1), 5x5 (halo 2: more than a w block) and 2x4 with stride 2 along w."""
  def build(x):
    y = mtf.layers.conv2d_with_blocks(x, OUT, h_blocks_dim=HB, w_blocks_dim=WB, name="a")
    z = mtf.layers.conv2d_with_blocks(x, OUT, filter_size=(5, 5), h_blocks_dim=HB,
                                      w_blocks_dim=WB, name="b")
    s = mtf.layers.conv2d_with_blocks(x, OUT, filter_size=(2, 4), strides=(1, 2),
                                      h_blocks_dim=HB, w_blocks_dim=WB, name="c")
    return [y, z, s]

  def reference(xs, p):
    image = unblock(xs[0], 2)
    return [reblock(tf.nn.conv2d(image, p[k + "/kernel"], [1, 1, st, 1], "SAME"), [2, 4])
            for k, st in (("a", 1), ("b", 1), ("c", 2))]
  check_layer(make_mesh_impl(*case), [(random_array(XB, 5), XB)], build, reference, **TOL)


@pytest.mark.parametrize("case", BLOCK_MESHES[:2], ids=BLOCK_IDS[:2])
def test_conv2d_transpose_with_blocks(make_mesh_impl, case):
  def build(x):
    return [mtf.layers.conv2d_transpose_with_blocks(x, OUT, h_blocks_dim=HB,
                                                    w_blocks_dim=WB, name="a"),
            mtf.layers.conv2d_transpose_with_blocks(x, OUT, filter_size=(3, 5),
                                                    strides=(1, 2), h_blocks_dim=HB,
                                                    w_blocks_dim=WB, name="b")]

  def reference(xs, p):
    image = unblock(xs[0], 2)
    a = tf.nn.conv2d_transpose(image, p["a/kernel"], [2, 12, 16, 3], 2, "SAME")
    b = tf.nn.conv2d_transpose(image, p["b/kernel"], [2, 6, 16, 3], [1, 1, 2, 1], "SAME")
    return [reblock(a, [2, 4]), reblock(b, [2, 4])]
  check_layer(make_mesh_impl(*case), [(random_array(XB, 6), XB)], build, reference, **TOL)


def test_conv3d_with_blocks_and_transpose(make_mesh_impl):
  db, hb = mtf.Dimension("db", 2), mtf.Dimension("hb", 4)
  shape = [B2, db, hb, D, mtf.Dimension("h", 2), mtf.Dimension("w", 3), CLASSES]

  def build(x):
    return [mtf.layers.conv3d_with_blocks(x, OUT, d_blocks_dim=db, h_blocks_dim=hb),
            mtf.layers.conv3d_transpose_with_blocks(x, OUT, d_blocks_dim=db,
                                                    h_blocks_dim=hb)]

  def reference(xs, p):
    volume = unblock(xs[0], 2)
    y = tf.nn.conv3d(volume, p["conv3d/kernel"], [1] * 5, "SAME")
    t = tf.nn.conv3d_transpose(volume, p["conv3d_transpose/kernel"], [2, 8, 16, 6, 3], 2,
                               "SAME")
    return [reblock(y, [2, 4]), reblock(t, [2, 4])]
  check_layer(make_mesh_impl("rows:2;cols:4", "db:rows;hb:cols"),
              [(random_array(shape, 7), shape)], build, reference, **TOL)


def test_with_blocks_without_blocks_dims_is_the_plain_layer():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X2, 8), X2)
  y = mtf.layers.conv2d_with_blocks(x, OUT, padding="VALID")
  assert y.shape == mtf.Shape([BATCH, mtf.Dimension("h", 4), mtf.Dimension("w", 2), OUT])
  assert isinstance(y.operation, mtf.Conv2dOperation)
  assert [v.name for v in graph.all_variables] == ["conv2d/kernel"]


def test_conv_layer_bad_input_raises():
  _, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(XB, 9), XB)
  with pytest.raises(mtf.ShapeError, match="padding 'VALID' is not supported with blocks"):
    mtf.layers.conv2d_with_blocks(x, OUT, padding="VALID", h_blocks_dim=HB, name="e1")
  with pytest.raises(mtf.ShapeError, match="stride 2 does not divide the block size h:3"):
    mtf.layers.conv2d_with_blocks(x, OUT, strides=(2, 1), h_blocks_dim=HB, name="e2")
  with pytest.raises(mtf.ShapeError, match="blocks dim db:2 is not a leading dim"):
    mtf.layers.conv2d_with_blocks(x, OUT, h_blocks_dim=mtf.Dimension("db", 2), name="e3")
  with pytest.raises(mtf.ShapeError, match="output_dim hb:2 has the name of a dim"):
    mtf.layers.conv2d(x, HB, name="e4")
  with pytest.raises(mtf.ShapeError, match="filter_size \\(3, 3\\) needs 3 values"):
    mtf.layers.conv3d(x, OUT, filter_size=(3, 3), name="e5")
  with pytest.raises(mtf.ShapeError, match="input .* needs \\[batch dims"):
    mtf.layers.conv3d(mtf.import_tf_tensor(mesh, np.zeros([2, 4], np.float32),
                                           [B2, CLASSES]), OUT, name="e6")
  with pytest.raises(mtf.ShapeError, match="max_relative_pos -2 < min_relative_pos"):
    mtf.layers.separable_conv1d(x, OUT, min_relative_pos=1, max_relative_pos=-2)
  with pytest.raises(mtf.ShapeError, match="window 3 does not fit in dim w:2"):
    mtf.layers.max_pool2d(x, ksize=(3, 3))


def test_blocked_conv_exchanges_only_halos(make_mesh_impl):
  """Forward: neighbour receives, no gathers; the kernel gradient allreduces over the
  mesh axes of the split blocks dims (they are batch dims of the convolution)."""
  impl = make_mesh_impl("rows:2;cols:4", "hb:rows;wb:cols")
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(XB, 10), XB)
  y = mtf.layers.conv2d_with_blocks(x, OUT, h_blocks_dim=HB, w_blocks_dim=WB)
  kernel = graph.trainable_variables[0].outputs[0]
  dk = mtf.gradients([y], [kernel])[0]
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.export_to_tf_tensor(y)
  forward = sorted(set(r.kind for r in lowering.comm_records))
  assert forward == ["receive"], forward
  lowering.export_to_tf_tensor(dk)
  assert ("allreduce", (0, 1)) in [(r.kind, r.mesh_axes) for r in lowering.comm_records]


def test_blocked_conv_in_tf_function_matches_eager(make_mesh_impl):
  impl = make_mesh_impl("b1:2;b2:2", "hb:b1;wb:b2")
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, tf.TensorSpec(mtf.Shape(XB).to_integer_list), XB)
  y = mtf.layers.conv2d_with_blocks(x, OUT, filter_size=(5, 3), h_blocks_dim=HB,
                                    w_blocks_dim=WB)
  value = random_array(XB, 11)
  eager = mtf.Lowering(graph, {mesh: impl}, feeds={x: tf.constant(value)})
  expected = eager.export_to_tf_tensor(y).numpy()

  @tf.function
  def step(v):
    return mtf.Lowering(graph, {mesh: impl}, feeds={x: v}).export_to_tf_tensor(y)
  np.testing.assert_allclose(step(tf.constant(value)).numpy(), expected, rtol=1e-5,
                             atol=1e-6)


@pytest.mark.parametrize("backend", ["simd", "gspmd"])
def test_blocked_conv_on_other_backends(backend):
  """The SIMD emulation and GSPMD backends give the blocked convolution's numbers too."""
  make = {"simd": mtf.SimdMeshImpl, "gspmd": mtf.GSPMDMeshImpl}[backend]

  def build(x):
    return [mtf.layers.conv2d_with_blocks(x, OUT, filter_size=(5, 3), h_blocks_dim=HB,
                                          w_blocks_dim=WB),
            mtf.layers.max_pool2d(x, ksize=(3, 2))]

  def reference(xs, p):
    image = unblock(xs[0], 2)
    y = tf.nn.conv2d(image, p["conv2d/kernel"], 1, "SAME")
    pooled = tf.nn.max_pool2d(tf.reshape(xs[0], [16, 3, 2, 2]), [3, 2], [3, 2], "VALID")
    return [reblock(y, [2, 4]), tf.reshape(pooled, [2, 2, 4, 1, 1, 2])]
  check_layer(make("rows:2;cols:4", "hb:rows;wb:cols"), [(random_array(XB, 12), XB)],
              build, reference, **TOL)
