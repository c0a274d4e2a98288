"""Inside tf.function, placement builds each slice function's ops once and copies them for
the other devices (backends/slice_replay.py); the copies compute what fresh calls would,
sit on their own devices, and are not used where a copy could differ.

These tests turn off `defer_copies` (the per-segment function calls of
slice_segments.py, tested in test_placement_slice_segments.py), under which the copies
are what every device runs."""
import collections

import numpy as np
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.backends import slice_replay
from mtf_testing import counts_added

DEVICES = ["/cpu:%d" % i for i in range(4)]
SHAPE = mtf.convert_to_shape("batch:4;hidden:6")
FULL = np.arange(24, dtype=np.float32).reshape(4, 6) / 10.0


def _impl():
  impl = mtf.PlacementMeshImpl("a:4", "batch:a", DEVICES)
  impl.defer_copies = False
  return impl


def _laid_out(impl, x):
  return impl.LaidOutTensor(impl.make_slices(x, SHAPE))


def _counts(run):
  return counts_added(slice_replay.stats, run)


def test_copies_compute_each_devices_slice_on_its_device():
  impl = _impl()

  def fn(t, s):  # several ops, a constant and a Python scalar argument
    return tf.nn.softmax(tf.reshape(t, [3, 2]) * s + 1.0), tf.reduce_sum(t, 1)

  @tf.function
  def run(x):
    probs, sums = impl.slicewise(fn, _laid_out(impl, x), 2.0)
    return tf.concat(probs.tensor_list, 0), tf.concat(sums.tensor_list, 0)
  counts = _counts(lambda: run.get_concrete_function(tf.constant(FULL)))
  assert counts == {"recorded": 1, "replayed": 3}, counts
  probs, sums = run(tf.constant(FULL))
  want = tf.nn.softmax(FULL.reshape(12, 2) * 2.0 + 1.0).numpy()
  np.testing.assert_allclose(probs.numpy(), want, rtol=1e-6)
  np.testing.assert_allclose(sums.numpy(), FULL.sum(1), rtol=1e-6)
  graph = run.get_concrete_function(tf.constant(FULL)).graph
  softmaxes = [op for op in graph.get_operations() if op.type == "Softmax"]
  assert sorted(op.device[-5:] for op in softmaxes) == ["CPU:%d" % i for i in range(4)]


def test_stateful_functions_and_gradient_tapes_run_the_function_per_device():
  impl = _impl()

  @tf.function
  def random_slices(x):
    out = impl.slicewise(lambda t: t + tf.random.uniform(t.shape), _laid_out(impl, x))
    return impl.combine_slices(out.tensor_list, SHAPE)
  counts = _counts(lambda: random_slices.get_concrete_function(tf.constant(FULL)))
  assert counts == {"called": 4}, counts
  # A fresh random op per device: the four slices get different noise.
  noise = random_slices(tf.constant(np.zeros_like(FULL))).numpy()
  assert len({float(row.sum()) for row in noise}) == 4

  @tf.function
  def under_tape(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = impl.slicewise(lambda t: t * t, _laid_out(impl, x))
      total = tf.add_n([tf.reduce_sum(t) for t in out.tensor_list])
    return tape.gradient(total, x)
  counts = _counts(lambda: under_tape.get_concrete_function(tf.constant(FULL)))
  assert counts == {"called": 4}, counts
  np.testing.assert_allclose(under_tape(tf.constant(FULL)).numpy(), 2 * FULL, rtol=1e-6)


def test_a_function_writing_into_its_input_runs_as_written_on_each_device():
  """tf.raw_ops.InplaceUpdate writes into its input's buffer (the decoding caches'
  in-place write): its function is called per device, never copied or deferred, and
  each device writes its own slice."""
  impl = _impl()

  @tf.function
  def write_first_row(x):
    private = impl.slicewise(lambda t: tf.raw_ops.DeepCopy(x=t), _laid_out(impl, x))
    out = impl.slicewise(lambda t: tf.raw_ops.InplaceUpdate(
        x=t, i=[0], v=tf.fill([1, t.shape[1]], -1.0)), private)
    return impl.combine_slices(out.tensor_list, SHAPE)
  counts = _counts(lambda: write_first_row.get_concrete_function(tf.constant(FULL)))
  assert counts == {"called": 8}, counts
  want = FULL.copy()
  want[:, :] = -1.0  # each device's slice is one row of the batch
  np.testing.assert_array_equal(write_first_row(tf.constant(FULL)).numpy(), want)


def test_a_train_step_on_four_devices_equals_one_device():
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  c = config.TinyLmConfig()
  batch = config.synthetic_batch(c)
  inputs, targets = tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])
  losses = []
  for impl in [mtf.PlacementMeshImpl("", "", [""]),
               mtf.PlacementMeshImpl("b:2;m:2", "batch:b;heads:m;d_ff:m;vocab:m", DEVICES)]:
    impl.defer_copies = False
    step = mtf_model.TinyLmModel(c, config.initial_weights(c)).make_train_step(impl)
    counts = _counts(lambda s=step: s.get_concrete_function(inputs, targets))
    losses.append([float(step(inputs, targets)) for _ in range(3)])
  assert counts.get("replayed", 0) > counts.get("recorded", 0) > 0, counts
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)


def test_repeated_layers_trace_each_slice_function_once():
  """The toy LM's two layers lower the same computations on same-shaped slices: each
  slice function (the fused attention, its gradient, ...) is traced once on one device,
  and the second layer copies the first's ops. A closure holding the mtf tensors rather
  than their shapes would key each layer's function apart."""
  from models.tiny_lm import config, mtf_model  # pylint: disable=g-import-not-at-top
  from mesh_tf.backends import slice_fn_key  # pylint: disable=g-import-not-at-top
  c = config.TinyLmConfig()
  batch = config.synthetic_batch(c)
  inputs, targets = tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])
  model = mtf_model.TinyLmModel(c, config.initial_weights(c))
  step = model.make_train_step(mtf.PlacementMeshImpl("", "", [""]))
  # eagerly, every function runs (nothing is recorded): the reference
  eager_loss = float(model.lowering(mtf.PlacementMeshImpl("", "", [""]), inputs, targets)
                     .export_to_tf_tensor(model.loss))
  graph = step.get_concrete_function(inputs, targets).graph
  recorded = collections.Counter(  # a call key starts with its function's key
      fn_key[1].co_qualname for fn_key, *_ in slice_fn_key.graph_cache(graph, "recordings")
      if isinstance(fn_key, tuple))
  for name in ("DotProductAttentionOperation.lower.<locals>.local",
               "AttentionGradOperation.lower.<locals>.local",
               "RangeOperation.lower.<locals>.<lambda>",
               "MeshImpl.laid_out_slice_begin.<locals>.begin"):
    assert recorded[name] == 1, (name, recorded)
  np.testing.assert_allclose(float(step(inputs, targets)), eager_loss, rtol=1e-6)


def test_each_device_holds_each_distinct_constant_once():
  impl = _impl()

  def fn(t):  # two reshapes to the same shape, two equal scalars, one other scalar
    a = tf.reshape(t * 2.0, [3, 2])
    b = tf.reshape(t + 2.0, [3, 2])
    return a - b * 3.0

  @tf.function
  def run(x):
    laid_out = _laid_out(impl, x)
    first = impl.slicewise(fn, laid_out)
    second = impl.slicewise(fn, laid_out)  # a second call: its constants are there too
    return tf.concat([f + s for f, s in zip(first.tensor_list, second.tensor_list)], 0)
  graph = run.get_concrete_function(tf.constant(FULL)).graph

  def constants_used_by_fn(device):  # the constant inputs of the Reshapes, Muls and Adds
    return sorted(t.op.get_attr("value").SerializeToString()
                  for op in graph.get_operations() if op.device.endswith(device) and
                  op.type in ("Reshape", "Mul", "AddV2", "Sub") for t in op.inputs
                  if t.op.type == "Const")
  recorded = constants_used_by_fn("CPU:0")
  assert len(recorded) == 10 and len(set(recorded)) == 3  # TF made one per use
  for d in range(1, 4):  # each copying device: one [3, 2] shape, one 2.0, one 3.0
    consts = {t.op for op in graph.get_operations() if op.device.endswith("CPU:%d" % d)
              for t in op.inputs if t.op.type == "Const"}
    assert len(consts) == 3, consts
    assert all(c.device.endswith("CPU:%d" % d) for c in consts)
    assert constants_used_by_fn("CPU:%d" % d) == recorded
  slices = [FULL[i:i + 1].reshape(3, 2) for i in range(4)]
  want = np.concatenate([2 * (s * 2 - (s + 2) * 3) for s in slices], 0)
  np.testing.assert_allclose(run(tf.constant(FULL)).numpy(), want, rtol=1e-6)


def test_under_a_control_dependency_scope_constants_are_copied_with_it():
  impl = _impl()

  @tf.function
  def run(x, gate):
    laid_out = _laid_out(impl, x)
    impl.slicewise(lambda t: tf.reshape(t, [3, 2]), laid_out)  # shares the shape const
    with tf.control_dependencies([tf.identity(gate, name="gate")]):
      out = impl.slicewise(lambda t: tf.reshape(t, [3, 2]), laid_out)
    return out.tensor_list
  graph = run.get_concrete_function(tf.constant(FULL), tf.constant(1.0)).graph
  reshapes = [op for op in graph.get_operations() if op.type == "Reshape"]
  assert len(reshapes) == 8
  # the four made under the scope each have their own shape constant, gated like them
  gated = [op for op in reshapes
           if [c.type for c in op.inputs[1].op.control_inputs] == ["Identity"]]
  assert len(gated) == 4 and len({op.inputs[1].op for op in gated}) == 4, gated


def _scaled_rows(factor):
  return lambda t: tf.reduce_sum(t * factor, 1)


def test_a_later_call_of_the_same_computation_copies_the_first_recording():
  impl = _impl()

  @tf.function(autograph=False)  # autograph would wrap each closure anew
  def run(x):
    laid_out = _laid_out(impl, x)
    outs = [impl.slicewise(_scaled_rows(f), laid_out) for f in (2.0, 2.0, 3.0)]
    return [tf.concat(o.tensor_list, 0) for o in outs]
  counts = _counts(lambda: run.get_concrete_function(tf.constant(FULL)))
  # 2.0 recorded once and copied 7 times; 3.0 differs in its closure: recorded anew
  assert counts == {"recorded": 2, "replayed": 10}, counts
  for got, f in zip(run(tf.constant(FULL)), (2.0, 2.0, 3.0)):
    np.testing.assert_allclose(got.numpy(), (FULL * f).sum(1), rtol=1e-6)


def test_a_traced_graph_is_freed_with_its_recordings_and_shared_constants():
  """The recordings and shared constants live on the graph: once the function is
  dropped, the graph is collected (a table keyed weakly by graph would keep it)."""
  import gc  # pylint: disable=g-import-not-at-top
  import weakref  # pylint: disable=g-import-not-at-top
  impl = _impl()

  def trace():
    @tf.function(autograph=False)
    def run(x):
      laid_out = _laid_out(impl, x)
      outs = [impl.slicewise(_scaled_rows(2.0), laid_out) for _ in range(2)]
      return [tf.concat(o.tensor_list, 0) for o in outs]
    return weakref.ref(run.get_concrete_function(tf.constant(FULL)).graph)
  graph = trace()
  gc.collect()
  assert graph() is None


def test_a_recording_made_under_control_dependencies_is_not_copied_for_later_calls():
  impl = _impl()

  @tf.function(autograph=False)
  def run(x, gate):
    laid_out = _laid_out(impl, x)
    with tf.control_dependencies([tf.identity(gate)]):
      first = impl.slicewise(_scaled_rows(2.0), laid_out)
    second = impl.slicewise(_scaled_rows(2.0), laid_out)  # outside the scope
    return first.tensor_list + second.tensor_list
  counts = _counts(lambda: run.get_concrete_function(tf.constant(FULL), tf.constant(1.0)))
  assert counts == {"recorded": 2, "replayed": 6}, counts
  graph = run.get_concrete_function(tf.constant(FULL), tf.constant(1.0)).graph
  ungated = [op for op in graph.get_operations() if op.type == "Sum" and not any(
      c.type == "Identity" for i in op.inputs for c in i.op.control_inputs + op.control_inputs)]
  assert len(ungated) == 4  # the second call's sums do not wait for the gate
