"""2-D local attention over image blocks (local_2d_halo_exchange, the causal 2-D block
mask and local_2d_self_attention_spatial_blocks) against plain TF on the whole image."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from layer_testing import check_layer
from mtf_testing import HIDDEN, new_mesh, random_array

BATCH2 = mtf.Dimension("batch", 2)
H_BLOCKS = mtf.Dimension("h_blocks", 2)
W_BLOCKS = mtf.Dimension("w_blocks", 4)
H = mtf.Dimension("h", 2)
W = mtf.Dimension("w", 3)
HEADS = mtf.Dimension("heads", 4)
KV = mtf.Dimension("kv", 4)
IMAGE_SHAPE = [BATCH2, H_BLOCKS, W_BLOCKS, H, W, HIDDEN]
# One device; the blocks split over both mesh axes (halos cross processors both ways);
# heads split (model parallel) with batch on the other axis.
CASES = [("", ""), ("rows:2;cols:4", "h_blocks:rows;w_blocks:cols"),
         ("rows:2;cols:4", "batch:rows;heads:cols")]
CASE_IDS = ["single", "2x4/h_blocks:rows;w_blocks:cols", "2x4/batch:rows;heads:cols"]


def _to_image(blocks):
  """[b, hb, wb, h, w, c] numpy/tf blocks -> [b, hb*h, wb*w, c] image."""
  b, hb, wb, h, w, c = blocks.shape
  return tf.reshape(tf.transpose(blocks, [0, 1, 3, 2, 4, 5]), [b, hb * h, wb * w, c])


def _to_blocks(image, hb, wb):
  b, rows, cols, c = image.shape
  h, w = rows // hb, cols // wb
  return tf.transpose(tf.reshape(image, [b, hb, h, wb, w, c]), [0, 1, 3, 2, 4, 5])


def _visible(hb, wb, h, w, mask_right):
  """[rows*cols, padded rows*cols] bool: which memory positions of the zero-padded image
  (one block of padding above and left, and below and right unless mask_right) each
  query sees."""
  rows, cols = hb * h, wb * w
  after_h, after_w = (0, 0) if mask_right else (h, w)
  r, c = [a.reshape(-1, 1) for a in np.meshgrid(np.arange(rows), np.arange(cols),
                                                 indexing="ij")]
  pr, pc = [a.reshape(1, -1) for a in np.meshgrid(np.arange(rows + h + after_h),
                                                   np.arange(cols + w + after_w),
                                                   indexing="ij")]
  span = 2 if mask_right else 3
  top, left = (r // h) * h, (c // w) * w  # padded index of the neighbourhood's corner
  seen = (pr >= top) & (pr < top + span * h) & (pc >= left) & (pc < left + span * w)
  if mask_right:  # raster order: earlier rows, or this row up to this column
    seen &= (pr - h < r) | ((pr - h == r) & (pc - w <= c))
  return seen


def _tf_local_2d_attention(x, w, mask_right):
  hb, wb, h, wd = x.shape[1:5]
  image = _to_image(x)
  b, rows, cols, _ = image.shape
  after = [0, 0] if mask_right else [h, wd]
  pad = [[0, 0], [h, after[0]], [wd, after[1]], [0, 0]]
  flat = tf.reshape(image, [b, rows * cols, -1])
  q = tf.einsum("blh,nhk->bnlk", flat, w[0])
  k, v = [tf.reshape(tf.pad(tf.einsum("bijh,nhk->bijnk", image, w[i]), pad[:3] +
                            [[0, 0], [0, 0]]), [b, -1, w.shape[1], w.shape[3]])
          for i in (1, 2)]
  mask = np.where(_visible(hb, wb, h, wd, mask_right), 0.0, -1e9).astype(np.float32)
  weights = tf.nn.softmax(tf.einsum("bnlk,bmnk->bnlm", q, k) + mask, axis=-1)
  out = tf.einsum("bnlm,bmnk,nhk->blh", weights, v, w[3])
  return _to_blocks(tf.reshape(out, [b, rows, cols, -1]), hb, wb)


@pytest.mark.parametrize("mask_right", [False, True], ids=["full", "mask_right"])
@pytest.mark.parametrize("mesh_shape,layout", CASES, ids=CASE_IDS)
def test_local_2d_self_attention_spatial_blocks(make_mesh_impl, mesh_shape, layout,
                                                mask_right):
  def build(x):
    # The original's positional order: (..., heads, is_training, memory dims, mask_right)
    return mtf.layers.local_2d_self_attention_spatial_blocks(x, KV, HEADS, True, None,
                                                             None, mask_right)

  def reference(xs, p):
    return _tf_local_2d_attention(xs[0], p["multihead_attention/qkvo"], mask_right)
  check_layer(make_mesh_impl(mesh_shape, layout),
              [(random_array(IMAGE_SHAPE, 21), IMAGE_SHAPE)], build, reference,
              rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_right", [False, True], ids=["both_sides", "mask_right"])
@pytest.mark.parametrize("with_blocks", [True, False], ids=["blocks", "one_block"])
def test_local_2d_halo_exchange(make_mesh_impl, mask_right, with_blocks):
  impl = make_mesh_impl("rows:2;cols:4", "h_blocks:rows;w_blocks:cols")
  k_val, v_val = random_array(IMAGE_SHAPE, 22), random_array(IMAGE_SHAPE, 23)
  graph, mesh = new_mesh()
  k, v = mtf.layers.local_2d_halo_exchange(
      mtf.import_tf_tensor(mesh, k_val, IMAGE_SHAPE),
      mtf.import_tf_tensor(mesh, v_val, IMAGE_SHAPE),
      H_BLOCKS if with_blocks else None, H, W_BLOCKS if with_blocks else None, W,
      mask_right)
  lowering = mtf.Lowering(graph, {mesh: impl})
  after = 0 if mask_right else 1

  def expected(a):
    """Pads the image (or each block alone) by a block, then cuts overlapping windows."""
    if not with_blocks:
      return np.pad(a, [[0, 0]] * 3 + [[2, 2 * after], [3, 3 * after], [0, 0]])
    image = np.pad(_to_image(a).numpy(), [[0, 0], [2, 2 * after], [3, 3 * after], [0, 0]])
    out = np.zeros([2, 2, 4, 2 * (2 + after), 3 * (2 + after), 8], np.float32)
    for i in range(2):
      for j in range(4):
        out[:, i, j] = image[:, 2 * i:2 * i + 2 * (2 + after), 3 * j:3 * j + 3 * (2 + after)]
    return out
  for name, t, a in (("k", k, k_val), ("v", v, v_val)):
    np.testing.assert_array_equal(lowering.export_to_tf_tensor(t).numpy(), expected(a),
                                  err_msg=name)


def test_attention_bias_local_2d_block(make_mesh_impl):
  graph, mesh = new_mesh()
  bias = mtf.layers.attention_bias_local_2d_block(
      mesh, H, W, mtf.Dimension("memory_h", 1), mtf.Dimension("memory_w", 1))
  assert bias.shape == mtf.Shape([H, W, mtf.Dimension("memory_h", 4),
                                  mtf.Dimension("memory_w", 6)])
  got = mtf.Lowering(graph, {mesh: make_mesh_impl("all:8", "")}
                    ).export_to_tf_tensor(bias).numpy()
  # The same rule as the whole-image reference, on a single 2x2 neighbourhood of blocks.
  i, j, p, q = np.meshgrid(np.arange(2), np.arange(3), np.arange(4), np.arange(6),
                           indexing="ij")
  seen = (p - 2 < i) | ((p - 2 == i) & (q - 3 <= j))
  np.testing.assert_array_equal(got, np.where(seen, 0.0, -1e9).astype(np.float32))
  assert got[1, 2].max() == 0 and (got[0, 0, 2:, 3:] != 0).sum() == 5


def test_local_2d_bad_inputs_name_the_dim():
  _, mesh = new_mesh()
  x = mtf.zeros(mesh, IMAGE_SHAPE)
  with pytest.raises(mtf.ShapeError, match="must be \\[batch, num_h_blocks"):
    mtf.layers.local_2d_self_attention_spatial_blocks(mtf.reduce_sum(x, reduced_dim=H),
                                                      KV, HEADS, True)
  with pytest.raises(mtf.ShapeError, match="no dim depth:3") as info:
    mtf.layers.local_2d_halo_exchange(x, x, H_BLOCKS, H, W_BLOCKS,
                                      mtf.Dimension("depth", 3), False)
  assert info.value.dim == "depth"
  with pytest.raises(mtf.ShapeError, match="query dim w:3"):
    mtf.layers.attention_bias_local_2d_block(mesh, H, W, mtf.Dimension("memory_h", 4), W)
