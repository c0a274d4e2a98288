"""The backend conformance suite: every backend in BACKENDS against numpy and one device.

Each MeshImpl primitive (docs/adding_a_backend.md) is checked on a 2x4 mesh against a
numpy model of what each processor should hold, and the program of every_op_program.py
is lowered on each backend and compared, tensor by tensor, with a single-device run.

A new backend joins by adding one entry to BACKENDS: name -> factory(mesh_shape, layout)
returning its MeshImpl. Nothing below looks at a backend's own classes: values go in and
come out through the primitives themselves.

How processors are observed. A laid-out value whose slices have shape S is exported as
the mtf tensor [proc_rows, proc_cols, *S] with proc_rows/proc_cols split over the mesh
(each slice becomes a [1, 1, *S] piece: `_view`), and per-processor inputs are imported
the same way (`_put`). A backend whose `slice_layout` splits nothing (GSPMD: one global
program written from processor 0's view) shows that one view at every position; the
suite then compares each position with the numpy model's result for the processor number
that `laid_out_pnum` shows there (0 for GSPMD), from inputs as the backend sees them.
"""
# Tests take the module's fixtures as arguments of the same names.
# pylint: disable=redefined-outer-name
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from every_op_program import OUTPUT_NAMES, build_program

MESH = "rows:2;cols:4"
MESH_SIZES = [2, 4]
PROC_DIMS = [mtf.Dimension("proc_rows", 2), mtf.Dimension("proc_cols", 4)]
# Rules for the primitive tests: the proc_* dims observe processors; batch, hidden and
# length are split as a model's would be.
LAYOUT = "proc_rows:rows;proc_cols:cols;batch:rows;hidden:cols"
SCRAMBLED = [5, 2, 7, 0, 3, 6, 1, 4]  # SIMD: logical pnum -> physical core


def _devices(mesh_shape):
  return ["/cpu:%d" % i for i in range(mtf.convert_to_shape(mesh_shape).size)]


def _scrambled(mesh_shape):
  n = mtf.convert_to_shape(mesh_shape).size
  return SCRAMBLED if n == len(SCRAMBLED) else None


# name -> factory(mesh_shape, layout) -> MeshImpl. Append a backend here.
BACKENDS = {
    "placement": lambda mesh_shape, layout: mtf.make_mesh_impl(
        "placement", mesh_shape, layout, _devices(mesh_shape)),
    "simd_emulation": lambda mesh_shape, layout: mtf.make_mesh_impl(
        "simd", mesh_shape, layout, logical_to_physical=_scrambled(mesh_shape)),
    "gspmd": lambda mesh_shape, layout: mtf.make_mesh_impl(
        "gspmd", mesh_shape, layout),
}
REDUCE = {"SUM": np.sum, "MAX": np.max, "MIN": np.min}
RTOL, ATOL = 1e-5, 1e-5


class _Holder:
  """What import_tf_tensor / export_to_tf_tensor read of an mtf Tensor."""

  def __init__(self, dims, name="x"):
    self.shape = mtf.Shape(dims)
    self.name = name


def _slice_dims(slice_shape):
  return [mtf.Dimension("s%d" % i, n) for i, n in enumerate(slice_shape)]


def _put(impl, per_processor):
  """A laid-out value whose slice on processor (r, c) is per_processor[r, c]."""
  per_processor = np.asarray(per_processor)
  holder = _Holder(PROC_DIMS + _slice_dims(per_processor.shape[2:]))
  stacked = impl.import_tf_tensor(holder, tf.constant(per_processor))
  return impl.slicewise(lambda t: t[0, 0], stacked)


def _view(impl, laid_out):
  """numpy [2, 4, *slice]: what each processor holds (processor 0's view everywhere on
  a backend whose slice_layout splits nothing)."""
  return np.asarray(_stacked(impl, laid_out))


def _stacked(impl, laid_out):
  """_view as a tf.Tensor (usable inside a tf.function)."""
  shape = list(laid_out.slice_shape)
  holder = _Holder(PROC_DIMS + _slice_dims(shape))
  piece = impl.slice_shape(holder.shape)

  def to_piece(t):
    t = tf.reshape(t, [1, 1] + shape)
    return t if piece[:2] == [1, 1] else tf.broadcast_to(t, piece)
  return impl.export_to_tf_tensor(holder, impl.slicewise(to_piece, laid_out))


def _splits_processors(impl):
  return impl.slice_shape(mtf.Shape(PROC_DIMS)) == [1, 1]


def _pnums(impl):
  return _view(impl, impl.laid_out_pnum())


def _expect(impl, got, want, what):
  """Each position of got equals want's value for the processor number shown there."""
  pnums = _pnums(impl)
  flat = np.reshape(want, [-1] + list(want.shape[2:]))
  np.testing.assert_array_equal(got.shape, want.shape, err_msg=what + ": shape")
  for r in range(MESH_SIZES[0]):
    for c in range(MESH_SIZES[1]):
      np.testing.assert_allclose(got[r, c], flat[pnums[r, c]], rtol=RTOL, atol=ATOL,
                                 err_msg="%s, processor (%d, %d)" % (what, r, c))


def _random(shape, seed):
  return np.random.RandomState(seed).uniform(-2, 2, size=shape).astype(np.float32)


# ---- numpy models of the collectives, on [2, 4, *slice] per-processor arrays ----
def _np_allreduce(x, mesh_axes, reduction):
  return np.broadcast_to(REDUCE[reduction](x, axis=tuple(mesh_axes), keepdims=True),
                         x.shape)


def _np_allconcat(x, mesh_axis, concat_axis):
  n, k = x.shape[mesh_axis], len(MESH_SIZES)
  whole = np.concatenate([np.take(x, i, axis=mesh_axis) for i in range(n)],
                         axis=k - 1 + concat_axis)
  return np.stack([whole] * n, axis=mesh_axis)


def _np_alltoall(x, mesh_axis, split_axis, concat_axis):
  n, k = x.shape[mesh_axis], len(MESH_SIZES)
  out = []
  for c in range(n):
    pieces = [np.split(np.take(x, q, axis=mesh_axis), n, axis=k - 1 + split_axis)[c]
              for q in range(n)]
    out.append(np.concatenate(pieces, axis=k - 1 + concat_axis))
  return np.stack(out, axis=mesh_axis)


def _np_receive(x, mesh_axis, sources):
  return np.stack([np.zeros_like(np.take(x, 0, axis=mesh_axis)) if s is None
                   else np.take(x, s, axis=mesh_axis) for s in sources], axis=mesh_axis)


def _shift_sources(n, offset, wrap):
  """Processor c receives from c - offset (modulo n if wrap, else None off the end)."""
  return [(c - offset) % n if wrap else (c - offset if 0 <= c - offset < n else None)
          for c in range(n)]


# ---- fixtures: one MeshImpl per backend and one input for the whole module ----
@pytest.fixture(scope="module", params=sorted(BACKENDS))
def impl(request):
  return BACKENDS[request.param](MESH, LAYOUT)


X = _random([2, 4, 4, 8], 0)  # distinct [4, 8] slices


@pytest.fixture(scope="module")
def x_in(impl):
  """(laid-out X, X as the backend holds it)."""
  laid = _put(impl, X)
  return laid, _view(impl, laid)


# ---- the primitives ----
def test_laid_out_pnum_and_pcoord(impl):
  pnums = _pnums(impl)
  want = np.arange(8).reshape(MESH_SIZES) if _splits_processors(impl) else np.zeros(
      MESH_SIZES, np.int32)
  np.testing.assert_array_equal(pnums, want)
  assert _view(impl, impl.laid_out_pnum()).dtype == np.int32
  for axis in range(2):
    coords = np.indices(MESH_SIZES)[axis]
    _expect(impl, _view(impl, impl.laid_out_pcoord(axis)), coords, "pcoord %d" % axis)


@pytest.mark.parametrize("dims", [["batch", "hidden"], ["hidden"], ["length"]], ids=str)
def test_laid_out_slice_begin_and_num(impl, dims):
  shape = mtf.Shape([mtf.Dimension(d, 8) for d in dims])
  begins = np.array([impl.slice_begin(shape, p) for p in range(8)]).reshape(
      MESH_SIZES + [len(dims)])
  _expect(impl, _view(impl, impl.laid_out_slice_begin(shape)), begins, "slice begin")
  # The row-major number of the coordinates on the mesh axes that split the tensor.
  axes = sorted(impl.slice_layout.tensor_layout(shape).mesh_axes)
  coords = np.indices(MESH_SIZES)
  nums = np.zeros(MESH_SIZES, np.int32)
  for a in axes:
    nums = nums * MESH_SIZES[a] + coords[a]
  _expect(impl, _view(impl, impl.laid_out_slice_num(shape)), nums, "slice num")


def test_per_processor_values_go_in_and_come_out(impl, x_in):
  _, seen = x_in
  want = X if _splits_processors(impl) else np.broadcast_to(X[:1, :1], X.shape)
  np.testing.assert_array_equal(seen, want)


def test_slicewise(impl, x_in):
  laid, seen = x_in
  pnum = impl.laid_out_pnum()
  scaled, summed = impl.slicewise(
      lambda t, p, k: (t * k + tf.cast(p, t.dtype), tf.reduce_sum(t, 1)), laid, pnum, 3.0)
  ones = impl.slicewise(lambda: tf.ones([2, 3]))
  assert scaled.slice_shape == [4, 8] and summed.slice_shape == [4]
  p = np.arange(8, dtype=np.float32).reshape(MESH_SIZES + [1, 1])
  _expect(impl, _view(impl, scaled), seen * 3.0 + p, "slicewise (t * k + pnum)")
  _expect(impl, _view(impl, summed), seen.sum(3), "slicewise second output")
  _expect(impl, _view(impl, ones), np.ones(MESH_SIZES + [2, 3]), "slicewise of no input")


@pytest.mark.parametrize("reduction", sorted(REDUCE))
@pytest.mark.parametrize("mesh_axes", [[0], [1], [0, 1]], ids=str)
def test_allreduce(impl, x_in, mesh_axes, reduction):
  laid, seen = x_in
  out = impl.allreduce(laid, mesh_axes, reduction)
  assert out.slice_shape == [4, 8]
  _expect(impl, _view(impl, out), _np_allreduce(seen, mesh_axes, reduction),
          "allreduce %s over %s" % (reduction, mesh_axes))


def test_allreduce_takes_any_case_and_no_axes(impl, x_in):
  laid, seen = x_in
  _expect(impl, _view(impl, impl.allreduce(laid, [1], "max")),
          _np_allreduce(seen, [1], "MAX"), "allreduce 'max'")
  _expect(impl, _view(impl, impl.allreduce(laid, [], "SUM")), seen, "allreduce over []")


@pytest.mark.parametrize("mesh_axes", [[1], []], ids=str)
def test_allreduce_rejects_an_unknown_reduction(impl, x_in, mesh_axes):
  with pytest.raises(mtf.LayoutError, match="unknown reduction 'bogus'"):
    impl.allreduce(x_in[0], mesh_axes, "bogus")


@pytest.mark.parametrize("mesh_axis,concat_axis", [(0, 0), (1, 1), (1, 0)])
def test_allconcat(impl, x_in, mesh_axis, concat_axis):
  laid, seen = x_in
  out = impl.allconcat(laid, mesh_axis, concat_axis)
  _expect(impl, _view(impl, out), _np_allconcat(seen, mesh_axis, concat_axis),
          "allconcat over %d on %d" % (mesh_axis, concat_axis))


@pytest.mark.parametrize("mesh_axis,split_axis,concat_axis",
                         [(1, 1, 0), (1, 0, 1), (0, 0, 0), (0, 1, 1)])
def test_alltoall(impl, x_in, mesh_axis, split_axis, concat_axis):
  laid, seen = x_in
  out = impl.alltoall(laid, mesh_axis, split_axis, concat_axis)
  _expect(impl, _view(impl, out), _np_alltoall(seen, mesh_axis, split_axis, concat_axis),
          "alltoall over %d, split %d, concat %d" % (mesh_axis, split_axis, concat_axis))


@pytest.mark.parametrize("mesh_axis,sources", [(0, [1, 0]), (0, [None, 0]),
                                               (1, [2, 0, 3, 1]), (1, [None, 3, 0, None])],
                         ids=str)
def test_receive(impl, x_in, mesh_axis, sources):
  laid, seen = x_in
  out = impl.receive(laid, mesh_axis, sources)
  _expect(impl, _view(impl, out), _np_receive(seen, mesh_axis, sources),
          "receive over %d from %s" % (mesh_axis, sources))


@pytest.mark.parametrize("mesh_axis,offset,wrap", [(1, 1, False), (1, -1, False),
                                                   (1, 1, True), (1, -2, True),
                                                   (0, 1, True), (0, -1, False)])
def test_shift_by_n_processors(impl, x_in, mesh_axis, offset, wrap):
  laid, seen = x_in
  out = impl.shift_by_n_processors(laid, mesh_axis, offset, wrap)
  sources = _shift_sources(MESH_SIZES[mesh_axis], offset, wrap)
  _expect(impl, _view(impl, out), _np_receive(seen, mesh_axis, sources),
          "shift over %d by %d, wrap=%s" % (mesh_axis, offset, wrap))


def test_reduce_scatter_and_allsplit(impl, x_in):
  laid, seen = x_in
  summed = _np_allreduce(seen, [1], "SUM")
  want = np.stack([np.split(summed[:, c], 4, axis=2)[c] for c in range(4)], axis=1)
  _expect(impl, _view(impl, impl.reduce_scatter(laid, 1, 1)), want, "reduce_scatter")
  back = impl.allsplit(impl.allconcat(laid, 1, 0), 1, 0)
  _expect(impl, _view(impl, back), seen, "allsplit of allconcat")


# Full shapes under LAYOUT: both dims split, transposed, one split, none, a scalar.
B, H, L = mtf.Dimension("batch", 4), mtf.Dimension("hidden", 8), mtf.Dimension("length", 6)


@pytest.mark.parametrize("dims", [[B, H], [H, B], [B, L], [L, H, B], [L], []],
                         ids=lambda d: "[%s]" % ",".join(x.name for x in d))
def test_import_export_round_trip(impl, dims):
  shape = mtf.Shape(dims)
  full = _random(shape.to_integer_list, 1)
  x = _Holder(dims)
  for how, laid in [("import_tf_tensor", impl.import_tf_tensor(x, tf.constant(full))),
                    ("import_constant", impl.import_constant(x, full))]:
    np.testing.assert_array_equal(impl.export_to_tf_tensor(x, laid), full, err_msg=how)
    size = impl.slice_shape(shape)
    assert laid.slice_shape == size, how
    pieces = np.zeros(MESH_SIZES + size, np.float32)
    for pnum in range(8):
      index = tuple(slice(b, b + n) for b, n in zip(impl.slice_begin(shape, pnum), size))
      pieces[pnum // 4, pnum % 4] = full[index]
    _expect(impl, _view(impl, laid), pieces, how + " slices")


def test_primitives_in_a_tf_function_match_eager(impl):
  full = tf.constant(_random([4, 8], 2))
  x = _Holder(_slice_dims([4, 8]))  # whole on every processor, like X's slices

  def run(value):
    t = impl.slicewise(tf.add, impl.import_tf_tensor(x, value), _put(impl, X))
    t = impl.allreduce(impl.alltoall(t, 1, 1, 0), [0], "MAX")
    t = impl.shift_by_n_processors(impl.allconcat(t, 1, 1), 1, 1, False)
    return _stacked(impl, impl.allsplit(t, 0, 0))
  np.testing.assert_allclose(tf.function(run, autograph=False)(full), run(full),
                             rtol=RTOL, atol=ATOL)


def test_slicewise_in_a_tf_function_reads_a_laid_out_tensor_made_eagerly(impl, x_in):
  laid, seen = x_in  # made eagerly, outside the function

  def run():
    return _stacked(impl, impl.slicewise(tf.add, _put(impl, X), laid))
  np.testing.assert_allclose(tf.function(run, autograph=False)(), run(), rtol=RTOL,
                             atol=ATOL)
  _expect(impl, np.asarray(run()), seen + seen, "slicewise of an eager input")


def _variable_program(v0):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  w = mtf.get_variable(mesh, "w", [H, B], initializer=tf.constant_initializer(v0))
  return graph, mesh, w, mtf.assign(w, w * 2.0 + 1.0)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_variables_make_assign_read(backend):
  v0, v1 = _random([8, 4], 3), _random([8, 4], 4)
  impl = BACKENDS[backend](MESH, LAYOUT)
  graph, mesh, w, update = _variable_program(v0)
  lowering = mtf.Lowering(graph, {mesh: impl})
  made = impl.variable_store["w"]
  assert made.name == "w" and made.shape == w.shape
  np.testing.assert_array_equal(made.read_full(), v0)
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(w), v0)
  lowering.lowered_operation(update)
  np.testing.assert_allclose(made.read_full(), v0 * 2.0 + 1.0, rtol=RTOL)
  made.assign_full(tf.constant(v1))
  np.testing.assert_array_equal(made.read_full(), v1)
  # The laid-out read holds each processor's slice of the variable.
  size = impl.slice_shape(w.shape)
  pieces = np.zeros(MESH_SIZES + size, np.float32)
  for pnum in range(8):
    begin = impl.slice_begin(w.shape, pnum)
    pieces[pnum // 4, pnum % 4] = v1[begin[0]:begin[0] + size[0], begin[1]:begin[1] + size[1]]
  _expect(impl, _view(impl, made.laid_out_tensor), pieces, "variable slices")
  # assign_to_slices writes a laid-out value slice by slice.
  value = impl.import_tf_tensor(w, tf.constant(v0))
  made.assign_to_slices(lambda var, val: var.assign(val), value)
  np.testing.assert_array_equal(made.read_full(), v0)


# ---- every op: each backend against one device, tensor by tensor ----
# Eagerly, every tensor under the first; in a tf.function, the outputs under the second.
EVERY_OP_LAYOUTS = ["batch:rows;hidden:cols", "length:rows;vocab:cols"]


@pytest.fixture(scope="module")
def every_op():
  """The every-op program, built once, and its single-device values of every tensor."""
  graph, mesh, outputs, update = build_program()
  return graph, mesh, outputs, update, _lower_everything(
      graph, mesh, update, mtf.PlacementMeshImpl("", "", [""]))


def _lower_everything(graph, mesh, update, impl):
  """{tensor name: value} for every tensor, then w after the update."""
  impl.next_random_step()  # as every_op_program.run_eager does
  lowering = mtf.Lowering(graph, {mesh: impl})
  values = {t.name: np.asarray(lowering.export_to_tf_tensor(t))
            for op in graph.operations for t in op.outputs}
  lowering.lowered_operation(update)
  values["w_after_update"] = impl.variable_store["w"].read_full().numpy()
  return values


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_op_matches_one_device(every_op, backend):
  graph, mesh, _, update, reference = every_op
  layout = EVERY_OP_LAYOUTS[0]
  got = _lower_everything(graph, mesh, update, BACKENDS[backend](MESH, layout))
  assert sorted(got) == sorted(reference)
  for op in graph.operations:  # in program order: the first wrong op fails first
    for t in op.outputs:
      np.testing.assert_allclose(got[t.name], reference[t.name], rtol=1e-4, atol=1e-5,
                                 err_msg="%s on %s: %s (output of %s)"
                                 % (backend, layout, t.name, op.name))
  np.testing.assert_allclose(got["w_after_update"], reference["w_after_update"],
                             rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_op_in_a_tf_function_matches_one_device(every_op, backend):
  graph, mesh, outputs, update, reference = every_op
  impl = BACKENDS[backend](MESH, EVERY_OP_LAYOUTS[1])
  mtf.Lowering(graph, {mesh: impl})  # variables, eagerly
  impl.next_random_step()

  @tf.function(autograph=False)
  def step():
    lowering = mtf.Lowering(graph, {mesh: impl})
    values = [lowering.export_to_tf_tensor(t) for t in outputs]
    with tf.control_dependencies(values):
      lowering.lowered_operation(update)
    return values
  got = [t.numpy() for t in step()] + [impl.variable_store["w"].read_full().numpy()]
  want = [reference[t.name] for t in outputs] + [reference["w_after_update"]]
  for name, g, w in zip(OUTPUT_NAMES, got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg="%s: %s" % (backend, name))
