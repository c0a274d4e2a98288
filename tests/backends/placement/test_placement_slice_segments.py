"""Inside tf.function, placement makes processor 0's slice ops and defers the others'
copies: a run of slice computations becomes one function called on each other device
(backends/slice_segments.py), made when another device's slice is first read."""
import gc
import weakref

import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.backends import slice_segments
from mtf_testing import counts_added

DEVICES = ["/cpu:%d" % i for i in range(4)]
SHAPE = mtf.convert_to_shape("batch:4;hidden:6")
FULL = np.arange(24, dtype=np.float32).reshape(4, 6) / 10.0


def _impl(shape="a:4", layout="batch:a"):
  return mtf.PlacementMeshImpl(shape, layout, DEVICES)


def _laid_out(impl, x):
  return impl.LaidOutTensor(impl.make_slices(x, SHAPE))


def _counts(run):
  return counts_added(slice_segments.stats, run)


def _scale_shift(t):  # four ops, a constant of its own
  return tf.tanh(t * 0.5 + 1.0) - 0.25


def _chain(impl, laid_out, calls=3):
  for _ in range(calls):
    laid_out = impl.slicewise(_scale_shift, laid_out)
  return laid_out


def _want_chain(x, calls=3):
  for _ in range(calls):
    x = np.tanh(x * 0.5 + 1.0) - 0.25
  return x


def _ops(graph, op_type):
  return [op for op in graph.get_operations() if op.type == op_type]


def test_other_processors_call_one_function_of_the_first_processors_ops():
  impl = _impl()

  @tf.function(autograph=False)
  def run(x):
    return impl.combine_slices(_chain(impl, _laid_out(impl, x)).tensor_list, SHAPE)
  counts = _counts(lambda: run.get_concrete_function(tf.constant(FULL)))
  assert counts == {"deferred": 3, "segments": 1}, counts
  np.testing.assert_allclose(run(tf.constant(FULL)).numpy(), _want_chain(FULL), rtol=1e-6)
  graph = run.get_concrete_function(tf.constant(FULL)).graph
  assert [op.device[-5:] for op in _ops(graph, "Tanh")] == ["CPU:0"] * 3
  calls = _ops(graph, "PartitionedCall")
  assert sorted(op.device[-5:] for op in calls) == ["CPU:1", "CPU:2", "CPU:3"]
  # static shapes as processor 0's (TF is not asked to infer them through the body)
  assert all(o.shape.as_list() == [1, 6] for op in calls for o in op.outputs)
  # one function; its nodes unplaced, so each call runs them on its own device
  names = {op.get_attr("f").name for op in calls}
  assert len(names) == 1
  definition = graph._functions[names.pop()].definition  # pylint: disable=protected-access
  assert sum(n.op == "Tanh" for n in definition.node_def) == 3
  assert all(not n.device for n in definition.node_def)


def test_without_deferral_every_device_has_its_ops():
  impl = _impl()
  impl.defer_copies = False

  @tf.function(autograph=False)
  def run(x):
    return impl.combine_slices(_chain(impl, _laid_out(impl, x)).tensor_list, SHAPE)
  counts = _counts(lambda: run.get_concrete_function(tf.constant(FULL)))
  assert counts == {}, counts
  graph = run.get_concrete_function(tf.constant(FULL)).graph
  assert sorted(op.device[-5:] for op in _ops(graph, "Tanh")) == sorted(
      ["CPU:%d" % d for d in range(4)] * 3)
  np.testing.assert_allclose(run(tf.constant(FULL)).numpy(), _want_chain(FULL), rtol=1e-6)


def test_a_segment_of_a_few_ops_is_copied_per_device():
  impl = _impl()

  @tf.function(autograph=False)
  def run(x):
    return impl.combine_slices(_chain(impl, _laid_out(impl, x), calls=1).tensor_list, SHAPE)
  counts = _counts(lambda: run.get_concrete_function(tf.constant(FULL)))
  assert counts == {"deferred": 1, "copied segments": 1}, counts
  graph = run.get_concrete_function(tf.constant(FULL)).graph
  assert not _ops(graph, "PartitionedCall")
  assert sorted(op.device[-5:] for op in _ops(graph, "Tanh")) == [
      "CPU:%d" % d for d in range(4)]
  np.testing.assert_allclose(run(tf.constant(FULL)).numpy(), _want_chain(FULL, 1),
                             rtol=1e-6)


def test_each_processor_reads_its_own_pnum_and_pcoord():
  """Processor 0's pnum is a constant of its graph; the function must take each
  processor's as an input, not hold processor 0's."""
  impl = _impl("r:2;c:2", "batch:r;hidden:c")

  @tf.function(autograph=False)
  def run(x):
    laid_out = _chain(impl, _laid_out(impl, x))
    pnum, col = impl.laid_out_pnum(), impl.laid_out_pcoord(1)
    tagged = impl.slicewise(
        lambda t, p, c: _scale_shift(t) * 0.0 + tf.cast(p * 10 + c, tf.float32),
        laid_out, pnum, col)
    return impl.combine_slices(tagged.tensor_list, SHAPE)
  got = run(tf.constant(FULL)).numpy()
  want = np.zeros([4, 6], np.float32)
  for pnum in range(4):
    row, col = divmod(pnum, 2)
    want[row * 2:row * 2 + 2, col * 3:col * 3 + 3] = pnum * 10 + col
  np.testing.assert_array_equal(got, want)


def test_replicated_slices_are_computed_once_per_distinct_slice():
  impl = _impl("r:2;c:2", "hidden:c")  # replicated over r: two distinct slices
  assert impl.shares_memory

  @tf.function(autograph=False)
  def run(x):
    out = _chain(impl, _laid_out(impl, x))
    assert out.peek_slices()[1] is None  # waiting
    slices = out.tensor_list
    assert slices[2] is slices[0] and slices[3] is slices[1]
    return impl.combine_slices(slices, SHAPE)
  np.testing.assert_allclose(run(tf.constant(FULL)).numpy(), _want_chain(FULL), rtol=1e-6)
  graph = run.get_concrete_function(tf.constant(FULL)).graph
  assert [op.device[-5:] for op in _ops(graph, "PartitionedCall")] == ["CPU:1"]


def test_a_collective_on_waiting_slices_is_made_when_read():
  impl = _impl()

  @tf.function(autograph=False)
  def run(x):
    graph = tf.compat.v1.get_default_graph()
    laid_out = _chain(impl, _laid_out(impl, x))
    total = impl.allreduce(laid_out, [0], "SUM")
    later = _chain(impl, laid_out, calls=1)  # joins the same segment
    assert not _ops(graph, "AddN") and laid_out.segment is later.segment is not None
    assert total.slice_shape == [1, 6]
    out = impl.combine_slices(total.tensor_list, SHAPE)
    assert len(_ops(graph, "AddN")) == 1 and laid_out.segment is None
    with tf.control_dependencies([out]):  # under a scope the allreduce is made at once
      again = impl.allreduce(_chain(impl, later, calls=1), [0], "SUM")
      assert len(_ops(graph, "AddN")) == 2
    return out, impl.combine_slices(again.tensor_list, SHAPE)
  counts = _counts(lambda: run.get_concrete_function(tf.constant(FULL)))
  assert counts == {"deferred": 4, "segments": 1}, counts
  out, again = run(tf.constant(FULL))
  chained = _want_chain(FULL)
  np.testing.assert_allclose(out.numpy(), np.tile(chained.sum(0, keepdims=True), [4, 1]),
                             rtol=1e-5)
  twice = _want_chain(_want_chain(FULL, 1) * 0 + _want_chain(FULL, 4), 1)
  np.testing.assert_allclose(again.numpy(), np.tile(twice.sum(0, keepdims=True), [4, 1]),
                             rtol=1e-5)


def test_stateful_and_control_scoped_calls_are_made_per_device():
  impl = _impl()

  @tf.function(autograph=False)
  def run(x, gate):
    noisy = impl.slicewise(lambda t: t + tf.random.uniform(t.shape), _laid_out(impl, x))
    with tf.control_dependencies([tf.identity(gate)]):
      gated = _chain(impl, _laid_out(impl, x))
    return (impl.combine_slices(noisy.tensor_list, SHAPE),
            impl.combine_slices(gated.tensor_list, SHAPE))
  counts = _counts(lambda: run.get_concrete_function(tf.constant(FULL), tf.constant(1.0)))
  assert counts == {}, counts
  noise, gated = run(tf.constant(np.zeros_like(FULL)), tf.constant(1.0))
  assert len({float(row.sum()) for row in noise.numpy()}) == 4  # a fresh draw per device
  np.testing.assert_allclose(gated.numpy(), _want_chain(np.zeros_like(FULL)), rtol=1e-6)


def test_one_first_slice_with_two_meanings_is_not_deferred():
  """Two laid-out tensors sharing processor 0's tensor but not the others' cannot both
  be function inputs named by that tensor: the second call runs per device."""
  impl = _impl()

  @tf.function(autograph=False)
  def run(x, y):
    a, b = _laid_out(impl, x), _laid_out(impl, y)
    mixed = impl.LaidOutTensor([a.tensor_list[0]] + b.tensor_list[1:])
    first = _chain(impl, a, calls=1)
    second = impl.slicewise(lambda s, t: s + t, first, mixed)  # mixed vs the segment's a
    third = impl.slicewise(lambda s, t: s * t, a, mixed)  # within one call
    return (impl.combine_slices(second.tensor_list, SHAPE),
            impl.combine_slices(third.tensor_list, SHAPE))
  y = FULL * 3.0
  counts = _counts(lambda: run.get_concrete_function(tf.constant(FULL), tf.constant(y)))
  assert counts == {"deferred": 1, "copied segments": 1}, counts
  mixed = np.concatenate([FULL[:1], y[1:]], 0)
  second, third = run(tf.constant(FULL), tf.constant(y))
  np.testing.assert_allclose(second.numpy(), _want_chain(FULL, 1) + mixed, rtol=1e-6)
  np.testing.assert_allclose(third.numpy(), FULL * mixed, rtol=1e-6)


def test_waiting_slices_read_inside_a_cond_branch():
  impl = _impl()

  @tf.function(autograph=False)
  def run(x, flag):
    laid_out = _chain(impl, _laid_out(impl, x))

    def branch():  # reads the waiting slices, and computes on them, in a branch graph
      return impl.combine_slices(_chain(impl, laid_out, calls=1).tensor_list, SHAPE)
    return tf.cond(flag, branch, lambda: tf.zeros([4, 6]))
  got = run(tf.constant(FULL), tf.constant(True)).numpy()
  np.testing.assert_allclose(got, _want_chain(FULL, 4), rtol=1e-6)


def test_a_train_step_is_one_segment_and_equals_one_device():
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  c = config.TinyLmConfig()
  batch = config.synthetic_batch(c)
  inputs, targets = tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])
  losses = []
  for impl, defer in [(mtf.PlacementMeshImpl("", "", [""]), True),
                      (_impl("b:4", "batch:b"), True), (_impl("b:4", "batch:b"), False)]:
    impl.defer_copies = defer
    step = mtf_model.TinyLmModel(c, config.initial_weights(c)).make_train_step(impl)
    counts = _counts(lambda s=step: s.get_concrete_function(inputs, targets))
    if impl.size > 1:
      # forward and backward pass: the loss's allreduce waits to be exported, the
      # gradients' until the updates read them
      assert counts == ({"deferred": counts.get("deferred"), "segments": 1} if defer
                        else {}), counts
    losses.append([float(step(inputs, targets)) for _ in range(3)])
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
  np.testing.assert_allclose(losses[2], losses[0], rtol=1e-5)


def test_a_traced_graph_with_segments_is_freed():
  impl = _impl()

  def trace():
    @tf.function(autograph=False)
    def run(x):
      return _chain(impl, _laid_out(impl, x)).tensor_list
    return weakref.ref(run.get_concrete_function(tf.constant(FULL)).graph)
  graph = trace()
  gc.collect()
  assert graph() is None


def test_a_tape_outside_the_traced_function_differentiates_through_the_calls():
  grads = []
  for defer in (True, False):
    impl = _impl()
    impl.defer_copies = defer

    @tf.function(autograph=False)
    def run(x, impl=impl):
      out = _chain(impl, _laid_out(impl, x))
      return tf.reduce_sum(impl.combine_slices(out.tensor_list, SHAPE) ** 2)
    x = tf.constant(FULL)
    run.get_concrete_function(x)  # traced without a tape: calls are made
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = run(x)
    grads.append(tape.gradient(y, x).numpy())
  assert np.abs(grads[0]).sum() > 0
  np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5)


def test_a_saved_model_of_a_traced_step_with_calls_loads_and_runs(tmp_path):
  impl = _impl()

  class Chain(tf.Module):

    @tf.function(input_signature=[tf.TensorSpec([4, 6], tf.float32)], autograph=False)
    def run(self, x):
      return impl.combine_slices(_chain(impl, _laid_out(impl, x)).tensor_list, SHAPE)
  module = Chain()
  graph = module.run.get_concrete_function().graph
  assert len(_ops(graph, "PartitionedCall")) == 3
  tf.saved_model.save(module, str(tmp_path))
  loaded = tf.saved_model.load(str(tmp_path))
  np.testing.assert_allclose(loaded.run(tf.constant(FULL)).numpy(), _want_chain(FULL),
                             rtol=1e-6)


def test_where_tf_cannot_make_the_function_the_ops_are_copied(monkeypatch):
  def refuse(*args):
    raise ValueError("no function today")
  monkeypatch.setattr(slice_segments, "graph_function", refuse)
  impl = _impl()

  @tf.function(autograph=False)
  def run(x):
    return impl.combine_slices(_chain(impl, _laid_out(impl, x)).tensor_list, SHAPE)
  counts = _counts(lambda: run.get_concrete_function(tf.constant(FULL)))
  assert counts == {"deferred": 3, "functions failed": 1, "segments": 1}, counts
  graph = run.get_concrete_function(tf.constant(FULL)).graph
  assert not _ops(graph, "PartitionedCall")
  assert sorted(op.device[-5:] for op in _ops(graph, "Tanh")) == sorted(
      ["CPU:%d" % d for d in range(4)] * 3)
  np.testing.assert_allclose(run(tf.constant(FULL)).numpy(), _want_chain(FULL), rtol=1e-6)


def _chain_read_by_none(impl, laid_out, calls):
  """_chain whose results say no code yet to be built reads them (as the lowering says
  of a tensor whose readers are all lowered)."""
  outs = []
  for _ in range(calls):
    laid_out = impl.slicewise(_scale_shift, laid_out)
    laid_out.may_be_read_later(lambda: False)
    outs.append(laid_out)
  return outs


def test_calls_return_what_may_be_read_and_make_the_rest_when_read():
  impl = _impl()

  @tf.function(autograph=False)
  def run(x):
    graph = tf.compat.v1.get_default_graph()
    first, second, third = _chain_read_by_none(impl, _laid_out(impl, x), 3)
    last = impl.combine_slices(third.tensor_list, SHAPE)  # third: read as it completes
    assert [len(op.outputs) for op in _ops(graph, "PartitionedCall")] == [1] * 3
    # read after all: one more call per device returns every result left out
    early = impl.combine_slices(first.tensor_list, SHAPE)
    assert [len(op.outputs) for op in _ops(graph, "PartitionedCall")] == [1] * 3 + [2] * 3
    middle = impl.combine_slices(second.tensor_list, SHAPE)
    assert len(_ops(graph, "PartitionedCall")) == 6
    return early, middle, last
  counts = _counts(lambda: run.get_concrete_function(tf.constant(FULL)))
  assert counts == {"deferred": 3, "segments": 1, "late segments": 1}, counts
  for calls, got in zip((1, 2, 3), run(tf.constant(FULL))):
    np.testing.assert_allclose(got.numpy(), _want_chain(FULL, calls), rtol=1e-6)


def test_a_lowering_keeps_what_unlowered_ops_read_in_the_calls():
  """The lowering tells which results may be read later: those of mtf tensors with a
  reader still to be lowered. A tensor whose readers are all lowered is left out of the
  calls, and exporting it after all costs one more call per device."""
  impl = _impl()

  @tf.function(autograph=False)
  def run(x):
    graph = tf.compat.v1.get_default_graph()
    mesh = mtf.Mesh(mtf.Graph(), "m")
    a = mtf.import_tf_tensor(mesh, x, SHAPE)
    for _ in range(3):
      a = mtf.tanh(a * 0.5 + 1.0) - 0.25
    b = a * 3.0
    total = mtf.reduce_sum(b, reduced_dim=SHAPE.dims[0])  # an allreduce over batch
    squares = mtf.reduce_sum(a * a, reduced_dim=SHAPE.dims[0])
    lowering = mtf.Lowering(mesh.graph, {mesh: impl})
    out = [lowering.export_to_tf_tensor(total)]
    (call,) = _ops(graph, "PartitionedCall")[:1]
    # of the segment's results: a (read by a * a, not lowered yet) and the partial
    # sums of `total` (read now); not b, nor the chain's steps (their readers lowered)
    assert [o.shape.as_list() for o in call.outputs] == [[1, 6], [6]]
    assert slice_segments.stats["late segments"] == late_before
    out.append(lowering.export_to_tf_tensor(squares))
    assert slice_segments.stats["late segments"] == late_before
    out.append(lowering.export_to_tf_tensor(b))
    assert slice_segments.stats["late segments"] == late_before + 1
    return out
  late_before = slice_segments.stats["late segments"]
  total, squares, b = run(tf.constant(FULL))
  want_a = _want_chain(FULL)
  np.testing.assert_allclose(total.numpy(), (want_a * 3.0).sum(0), rtol=1e-5)
  np.testing.assert_allclose(squares.numpy(), (want_a * want_a).sum(0), rtol=1e-5)
  np.testing.assert_allclose(b.numpy(), want_a * 3.0, rtol=1e-5)
