"""Shape changes (mesh_tf/ops/reshape.py): reshape, rename/replace dims, broadcast."""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.shapes.mesh_layout import MeshLayout
from mtf_testing import (BATCH, HIDDEN, LENGTH, backend_mesh_impl, check_against_tf, dims,
                         new_mesh, random_array)

X_SHAPE = [BATCH, LENGTH, HIDDEN]
A2, B4 = mtf.Dimension("a", 2), mtf.Dimension("b", 4)
LH = mtf.Dimension("length_hidden", 24)
BL = mtf.Dimension("batch_length", 24)
FLAT = mtf.Dimension("flat", 192)

# (label, input shape, output shape). Sizes are row-major reinterpretations, as tf.reshape.
RESHAPES = [
    ("merge length and hidden", X_SHAPE, [BATCH, LH]),
    ("merge batch and length", X_SHAPE, [BL, HIDDEN]),
    ("merge all", X_SHAPE, [FLAT]),
    ("split hidden into a, b", [BATCH, HIDDEN], [BATCH, A2, B4]),
    ("split flat into batch, length, hidden", [FLAT], X_SHAPE),
    ("a, b become hidden", [BATCH, A2, B4], [BATCH, HIDDEN]),
    ("same dims, batch moved", X_SHAPE, [LENGTH, BATCH, HIDDEN]),
    ("batch and hidden swap places", [BATCH, HIDDEN, LENGTH], [HIDDEN, BATCH, LENGTH]),
    ("hidden keeps its block position", [A2, B4, HIDDEN], [B4, A2, HIDDEN]),
    ("batch absorbs length", X_SHAPE, [mtf.Dimension("batch", 24), HIDDEN]),
    ("batch absorbs hidden", [BATCH, HIDDEN], [mtf.Dimension("batch", 64)]),
]


def test_reshape(mesh_impl):
  inputs = [(random_array(r[1], k), r[1]) for k, r in enumerate(RESHAPES)]
  check_against_tf(
      mesh_impl, inputs,
      lambda *xs: [mtf.reshape(x, r[2]) for x, r in zip(xs, RESHAPES)],
      lambda *ts: [tf.reshape(t, dims(r[2])) for t, r in zip(ts, RESHAPES)],
      labels=[r[0] for r in RESHAPES], input_labels=[r[0] for r in RESHAPES])


def test_rename_and_replace_dimensions(mesh_impl):
  d8 = mtf.Dimension("d", 8)
  x = random_array(X_SHAPE, 10)
  z = random_array([LENGTH, d8], 11)
  check_against_tf(
      mesh_impl, [(x, X_SHAPE), (x, X_SHAPE), (z, [LENGTH, d8]), (x, X_SHAPE)],
      lambda a, b, c, e: [
          mtf.rename_dimension(a, "hidden", "features"),  # split -> unsplit
          mtf.rename_dimension(b, "batch", "examples"),
          mtf.rename_dimension(c, "d", "hidden"),  # unsplit -> split
          mtf.replace_dimensions(e, [LENGTH, HIDDEN], LH),
      ],
      lambda a, b, c, e: [a, b, c, tf.reshape(e, [8, 24])],
      labels=["rename hidden", "rename batch", "rename d to hidden", "replace_dimensions"])


def test_rename_and_replace_on_shapes():
  shape = mtf.Shape(X_SHAPE)
  assert mtf.rename_dimension(shape, "length", "time").dimension_names == [
      "batch", "time", "hidden"]
  assert mtf.replace_dimensions(shape, LENGTH, [A2, mtf.Dimension("c", 1)]).dims[1:3] == [
      A2, mtf.Dimension("c", 1)]
  with pytest.raises(ValueError, match="consecutive"):
    mtf.replace_dimensions(shape, [BATCH, HIDDEN], FLAT)


def test_broadcast(mesh_impl):
  h = random_array([HIDDEN], 12)
  bh = random_array([BATCH, HIDDEN], 13)
  lb = random_array([LENGTH, BATCH], 14)
  check_against_tf(
      mesh_impl, [(h, [HIDDEN]), (bh, [BATCH, HIDDEN]), (lb, [LENGTH, BATCH]),
                  (h, [HIDDEN])],
      lambda a, b, c, d: [mtf.broadcast(a, X_SHAPE),
                          mtf.broadcast(b, [HIDDEN, LENGTH, BATCH]),
                          mtf.broadcast(c, X_SHAPE), mtf.broadcast(d, [HIDDEN])],
      lambda a, b, c, d: [tf.broadcast_to(a, [8, 3, 8]),
                          tf.broadcast_to(tf.transpose(b)[:, None, :], [8, 3, 8]),
                          tf.broadcast_to(tf.transpose(c)[:, :, None], [8, 3, 8]), d],
      labels=["[hidden] to x", "[batch, hidden] reordered", "[length, batch] to x",
              "to its own shape"])


def test_anonymize(mesh_impl):
  x = random_array(X_SHAPE, 15)
  got, _ = check_against_tf(mesh_impl, [(x, X_SHAPE)],
                            lambda a: [mtf.anonymize(a)], lambda t: [t])
  assert got[0].shape == (8, 3, 8)


def test_reshape_errors():
  graph, mesh = new_mesh()
  x = mtf.import_tf_tensor(mesh, random_array(X_SHAPE, 0), X_SHAPE)
  with pytest.raises(ValueError, match="sizes differ"):
    mtf.reshape(x, [BATCH, HIDDEN])
  with pytest.raises(ValueError, match="classes"):
    mtf.rename_dimension(x, "classes", "c")
  with pytest.raises(ValueError, match="missing"):
    mtf.broadcast(x, [BATCH, HIDDEN])
  assert mtf.reshape(x, X_SHAPE) is x and graph is x.graph


# A mesh axis moving from one dim to another of the same flat positions: [hidden_unsplit,
# batch, length] -> [hidden, batch_unsplit, length] (the MoE dispatch, with batch and
# hidden on one mesh dim) is one alltoall; the second entry's output dims also regroup.
MOVED_SPLITS = [
    ("placement", "all:8", "batch:all;hidden:all"),
    ("placement", "rows:2;cols:4", "batch:rows;hidden:rows;length_x:cols"),
    ("simd", "rows:2;cols:4", "batch:cols;hidden:cols"),
    ("gspmd", "rows:2;cols:4", "batch:rows;hidden:rows"),
]


@pytest.mark.parametrize("backend,mesh_shape,layout", MOVED_SPLITS)
def test_reshape_moving_a_split_is_one_alltoall(backend, mesh_shape, layout):
  hu, bu = mtf.Dimension("hidden_unsplit", 8), mtf.Dimension("batch_unsplit", 8)
  old, new = [hu, BATCH, LENGTH], [HIDDEN, bu, LENGTH]
  regrouped = [HIDDEN, mtf.Dimension("length_x", 24)]
  x = random_array(old, 21)
  check_against_tf(backend_mesh_impl(backend, mesh_shape, layout), [(x, old)],
                   lambda t: [mtf.reshape(t, new), mtf.reshape(t, regrouped)],
                   lambda t: [t, tf.reshape(t, [8, 24])], labels=["moved", "regrouped"])
  graph, mesh = new_mesh()
  y = mtf.reshape(mtf.import_tf_tensor(mesh, x, old), new)
  lowering = mtf.Lowering(graph, {mesh: backend_mesh_impl(backend, mesh_shape, layout)})
  lowering.export_to_tf_tensor(y)
  kinds = [r.kind for r in lowering.comm_records]
  predicted = mtf.analysis.estimate_cost(graph, mesh_shape, layout, fetches=[y])
  assert [r.kind for r in predicted.comm_records] == ["alltoall"]
  if backend == "gspmd":  # XLA inserts the collectives; the lowering emits none
    assert kinds == [], kinds
  else:
    assert lowering.comm_records == predicted.comm_records


def _random_reshape_case(rng, mesh_shape):
  """(old shape, new shape, layout): random dims of 256 elements regrouped (adjacent dims
  merged), one mesh dim splitting a dim of each (so the split is kept, moved or
  gathered), sometimes one more rule."""
  sizes, left = [], 256
  while left > 1:
    size = left if len(sizes) == 3 else rng.choice([s for s in (2, 4, 8, 16) if left % s == 0])
    sizes.append(size)
    left //= size
  rng.shuffle(sizes)
  merged = [sizes[0]]
  for size in sizes[1:]:
    if rng.random() < 0.3:
      merged[-1] *= size
    else:
      merged.append(size)
  old = mtf.Shape([mtf.Dimension("o%d" % i, n) for i, n in enumerate(sizes)])
  new = mtf.Shape([mtf.Dimension("n%d" % i, n) for i, n in enumerate(merged)])
  if rng.random() < 0.5:
    old, new = new, old
  mesh = mtf.convert_to_shape(mesh_shape)
  m = mesh.dims[rng.randint(mesh.ndims)]

  def pick(dims, divisor):
    names = [d.name for d in dims if d.size % divisor == 0]
    return names[rng.randint(len(names))] if names else None
  rules = [(pick(old.dims, m.size), m.name), (pick(new.dims, m.size), m.name)]
  if rng.random() < 0.5:
    rules.append((pick(old.dims + new.dims, 2), mesh.dims[rng.randint(mesh.ndims)].name))
  return old, new, ";".join("%s:%s" % r for r in rules if r[0])


@pytest.mark.parametrize("mesh_shape", ["all:8", "rows:2;cols:4"])
def test_random_reshapes_match_numpy_and_their_plans(mesh_shape):
  """Seeded random reshapes and layouts, most moving a split (alltoall): the values are
  numpy's and the collectives are the plan's."""
  rng = np.random.RandomState(5)
  checked = moved = 0
  for _ in range(200):
    if checked == 12:
      break
    old, new, layout = _random_reshape_case(rng, mesh_shape)
    layout_obj = MeshLayout(mesh_shape, layout)
    try:
      layout_obj.tensor_layout(old)
      layout_obj.tensor_layout(new)
    except mtf.LayoutError:
      continue
    graph, mesh = new_mesh()
    x = np.arange(old.size, dtype=np.float32).reshape(old.to_integer_list)
    y = mtf.reshape(mtf.import_tf_tensor(mesh, x, old), new)
    kinds = [s.kind for s in y.operation.plan(layout_obj).operands[0].steps]
    if "alltoall" not in kinds and checked > moved:
      continue  # keep at least half of the cases moving a split
    lowering = mtf.Lowering(graph, {mesh: backend_mesh_impl("placement", mesh_shape,
                                                               layout)})
    got = lowering.export_to_tf_tensor(y).numpy()
    np.testing.assert_array_equal(got, x.reshape(new.to_integer_list),
                                  err_msg="%s -> %s under %s" % (old, new, layout))
    predicted = mtf.analysis.estimate_cost(graph, mesh_shape, layout, fetches=[y])
    assert lowering.comm_records == predicted.comm_records
    checked += 1
    moved += "alltoall" in kinds
  assert checked == 12 and moved >= 6, (checked, moved)
