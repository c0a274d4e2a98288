"""The lowering runs the ops' plans and the cost model sums them: on every op of
every_op_program.py, and on the ops with their own plans (convolution, pooling, top_k,
halo exchange), the collectives the placement backend records equal the predicted ones,
op by op, under layouts that split each dim."""
import collections

import pytest

import mesh_tf as mtf
import every_op_program
from mtf_testing import random_array

EVERY_OP_LAYOUTS = [
    ("rows:2;cols:4", "batch:rows;hidden:cols"),
    ("rows:2;cols:4", "length:rows;vocab:cols"),
    ("all:8", "vocab:all"),
    ("rows:2;cols:4", "batch:cols;vocab:rows"),
]

IMAGE, BLOCKS, ROWS = (mtf.Dimension("batch", 8), mtf.Dimension("hb", 4),
                       mtf.Dimension("h", 4))
IMAGE_ROWS, WIDTH = mtf.Dimension("ih", 8), mtf.Dimension("w", 2)
CHANNELS, OUT = mtf.Dimension("hidden", 8), mtf.Dimension("out", 8)
FILTER = [mtf.Dimension("fh", 3), mtf.Dimension("fw", 3), CHANNELS, OUT]
OTHER_OP_LAYOUTS = [
    ("rows:2;cols:4", "batch:rows;hidden:cols"),
    ("rows:2;cols:4", "hb:cols;out:rows"),
    ("rows:2;cols:4", "ih:rows;out:cols"),
]


def _key(r):
  return (r.op, r.kind, r.mesh_axes, r.group_size, r.slice_bytes)


def _placement(mesh_shape, layout):
  n = mtf.convert_to_shape(mesh_shape).size
  return mtf.PlacementMeshImpl(mesh_shape, layout, ["/cpu:%d" % i for i in range(n)])


def _check(graph, mesh, fetches, mesh_shape, layout):
  lowering = mtf.Lowering(graph, {mesh: _placement(mesh_shape, layout)})
  for f in fetches:
    if isinstance(f, mtf.Tensor):
      lowering.export_to_tf_tensor(f)
    else:
      lowering.lowered_operation(f)
  predicted = mtf.analysis.estimate_cost(graph, mesh_shape, layout, fetches=fetches)
  measured = collections.Counter(_key(r) for r in lowering.comm_records)
  assert measured, "these layouts split dims the ops communicate over"
  assert measured == collections.Counter(_key(r) for r in predicted.comm_records)
  return measured


@pytest.mark.parametrize("mesh_shape,layout", EVERY_OP_LAYOUTS)
def test_every_op_program(mesh_shape, layout):
  graph, mesh, outputs, update = every_op_program.build_program()
  _check(graph, mesh, outputs + [update], mesh_shape, layout)


def _other_ops():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.import_tf_tensor(mesh, random_array([IMAGE, BLOCKS, ROWS, CHANNELS], 0),
                           [IMAGE, BLOCKS, ROWS, CHANNELS])
  halo = mtf.halo_exchange(x, BLOCKS, ROWS, 1)
  image = mtf.reshape(x, [IMAGE, IMAGE_ROWS, WIDTH, CHANNELS])
  f = mtf.import_tf_tensor(mesh, random_array(FILTER, 1), FILTER)
  conv = mtf.Conv2dOperation(image, f, [1, 1, 1, 1], "SAME").outputs[0]
  pooled = mtf.layers.max_pool2d(conv, ksize=(3, 1))
  values, _ = mtf.top_k(conv, OUT, mtf.Dimension("k", 2))
  loss = (mtf.reduce_sum(halo) + mtf.reduce_sum(pooled) + mtf.reduce_sum(values))
  df, = mtf.gradients([loss], [f])
  return graph, mesh, [loss, df]


@pytest.mark.parametrize("mesh_shape,layout", OTHER_OP_LAYOUTS)
def test_convolution_pooling_top_k_and_halo(mesh_shape, layout):
  graph, mesh, fetches = _other_ops()
  _check(graph, mesh, fetches, mesh_shape, layout)
