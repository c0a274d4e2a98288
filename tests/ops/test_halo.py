"""halo_exchange / left_halo_exchange (mesh_tf/ops/halo.py) against a TF reference that
pads the reassembled dim and cuts overlapping windows, with the blocks dim split or not."""
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mtf_testing import BATCH, HIDDEN, check_against_tf, new_mesh, random_array

BLOCKS, SIZE = mtf.Dimension("hb", 4), mtf.Dimension("h", 3)
X = [BATCH, BLOCKS, SIZE, HIDDEN]


def tf_halo(x, left, right, wrap):
  """Reference on [batch, blocks, size, c]: block j gets positions
  [j*size - left, (j+1)*size + right) of the reassembled dim."""
  b, n, size, c = x.shape
  full = tf.reshape(x, [b, n * size, c])
  if wrap:
    reps = -(-max(left, right) // (n * size)) + 1
    full = tf.concat([full] * (2 * reps + 1), 1)
    offset = reps * n * size
  else:
    full = tf.pad(full, [[0, 0], [left, right], [0, 0]])
    offset = left
  return tf.stack([full[:, offset + j * size - left:offset + (j + 1) * size + right]
                   for j in range(n)], 1)


def _cases(a, b, c, d):
  return [mtf.halo_exchange(a, BLOCKS, SIZE, 1), mtf.halo_exchange(b, "hb", "h", 5),
          mtf.halo_exchange(c, BLOCKS, SIZE, 2, wrap=True),
          mtf.left_halo_exchange(d, BLOCKS, SIZE, 4)]


def _tf_cases(a, b, c, d):
  return [tf_halo(a, 1, 1, False), tf_halo(b, 5, 5, False), tf_halo(c, 2, 2, True),
          tf_halo(d, 4, 0, False)]


LABELS = ["halo 1", "halo 5 (more than a block)", "halo 2 wrapped", "left halo 4"]


def test_halo_exchange(mesh_impl):
  check_against_tf(mesh_impl, [(random_array(X, 0), X)] * 4,
                   _cases, _tf_cases, labels=LABELS)


@pytest.mark.parametrize("layout", ["hb:cols", "hb:rows;batch:cols", "hb:cols;hidden:rows"])
def test_halo_exchange_with_split_blocks(make_mesh_impl, layout):
  """Blocks split one (hb:cols) or two (hb:rows) per processor exchange with neighbours."""
  check_against_tf(make_mesh_impl("rows:2;cols:4", layout), [(random_array(X, 1), X)] * 4,
                   _cases, _tf_cases, labels=LABELS)


def test_split_blocks_use_neighbour_receives(make_mesh_impl):
  impl = make_mesh_impl("rows:2;cols:4", "hb:cols")
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X, 2), X)
  y = mtf.halo_exchange(x, BLOCKS, SIZE, 1)
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.export_to_tf_tensor(y)
  kinds = sorted(set(r.kind for r in lowering.comm_records))
  assert kinds == ["receive"], kinds


def test_halo_bad_input_raises():
  _, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X, 3), X)
  with pytest.raises(mtf.ShapeError, match="blocks_dim 'wb' is not a dim of"):
    mtf.halo_exchange(x, "wb", SIZE, 1)
  with pytest.raises(mtf.ShapeError, match="block_size_dim 'w' is not a dim of"):
    mtf.left_halo_exchange(x, BLOCKS, "w", 1)
  with pytest.raises(mtf.ShapeError, match="halo sizes must be >= 0"):
    mtf.halo_exchange(x, BLOCKS, SIZE, -1)
  with pytest.raises(mtf.ShapeError, match="both"):
    mtf.halo_exchange(x, SIZE, SIZE, 1)
  assert mtf.halo_exchange(x, BLOCKS, SIZE, 0) is x
