"""Placement on CPUs of one process (PlacementMeshImpl.shares_memory): what a processor
would compute from the very tensors another already used is computed once, so a
model-parallel step does its replicated work (norms, residual adds, the update of
replicated weights) once instead of once per device, with the same results."""
import collections

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.tiny_lm import config, mtf_model

CPUS = ["/cpu:%d" % i for i in range(8)]


def _step_ops_and_loss(mesh_shape, layout, devices):
  """(Counter of op types, three losses, impl, distinct values assigned to variables)."""
  c = config.TinyLmConfig()
  batch = config.synthetic_batch(c)
  inputs, targets = tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])
  impl = mtf.make_mesh_impl("placement", mesh_shape, layout, devices)
  step = mtf_model.TinyLmModel(c, config.initial_weights(c)).make_train_step(impl)
  graph_def = step.get_concrete_function(inputs, targets).graph.as_graph_def()
  nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
  kinds = collections.Counter(n.op for n in nodes)
  assigned = {n.input[1] for n in nodes if n.op == "AssignVariableOp"}
  losses = [float(step(inputs, targets)) for _ in range(3)]
  return kinds, losses, impl, len(assigned)


@pytest.fixture(scope="module")
def single():
  return _step_ops_and_loss("", "", [""])


def test_model_parallel_norms_are_computed_once(single):
  kinds, losses, impl, _ = _step_ops_and_loss("model:4", "d_ff:model;heads:model;vocab:model",
                                           CPUS[:4])
  assert impl.shares_memory
  # [batch, length, d_model] activations are replicated over "model": each RMS norm's
  # Rsqrt (forward) and its gradient run once, as on one device, not 4 times.
  assert kinds["Rsqrt"] == single[0]["Rsqrt"], (kinds["Rsqrt"], single[0]["Rsqrt"])
  # three SGD steps: the same losses as one device
  np.testing.assert_allclose(losses, single[1], rtol=1e-5)


def test_data_parallel_update_of_replicated_weights_is_computed_once(single):
  kinds, losses, _, assigned = _step_ops_and_loss("batch:8", "batch:batch", CPUS)
  # each weight's gradient is one AddN over the 8 devices; its update is computed once
  # and written once, to the one variable the 8 replicas share
  assert kinds["AddN"] >= 1
  assert kinds["AssignVariableOp"] == single[0]["AssignVariableOp"]
  assert assigned == single[3] == single[0]["AssignVariableOp"]
  np.testing.assert_allclose(losses, single[1], rtol=1e-5)


def _muls_for_one_shared_input(impl):
  """Computations (Muls, or calls of a function of the first device's Mul) slicewise
  emits when every processor's input is the same tensor."""
  @tf.function
  def build(a):
    return impl.slicewise(lambda t: t * 2.0, impl.LaidOutTensor([a] * impl.size)).tensor_list
  graph = build.get_concrete_function(tf.TensorSpec([4])).graph
  return sum(op.type in ("Mul", "PartitionedCall") for op in graph.get_operations())


def test_remote_devices_keep_one_computation_per_device():
  remote = mtf.PlacementMeshImpl("a:2", "", ["/job:worker/task:0/device:CPU:0",
                                             "/job:worker/task:1/device:CPU:0"])
  local = mtf.PlacementMeshImpl("a:2", "", CPUS[:2])
  assert local.shares_memory and not remote.shares_memory
  assert _muls_for_one_shared_input(local) == 1
  assert _muls_for_one_shared_input(remote) == 2


def test_processors_holding_the_same_slice_share_one_variable():
  """On CPUs of one process the replicas of a slice are one tf.Variable (on the first of
  their devices); each distinct slice has its own; writes and reads see the one value."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  d, h = mtf.Dimension("d", 2), mtf.Dimension("h", 4)
  split = mtf.get_variable(mesh, "split", [d, h], initializer=tf.zeros_initializer())
  replicated = mtf.get_variable(mesh, "replicated", [d], initializer=tf.ones_initializer())
  update = [mtf.assign(split, split + 1.0), mtf.assign(replicated, replicated * 3.0)]
  impl = mtf.PlacementMeshImpl("rows:2;cols:4", "h:cols", CPUS)
  lowering = mtf.Lowering(graph, {mesh: impl})
  for op in update:
    lowering.lowered_operation(op)
  store = impl.variable_store
  assert len({id(v) for v in store["replicated"].slice_variables}) == 1
  split_vars = store["split"].slice_variables
  assert len({id(v) for v in split_vars}) == 4
  for pnum in range(8):  # rows 0 and 1 of one column hold the same slice
    assert split_vars[pnum] is split_vars[pnum % 4]
    assert split_vars[pnum].device.endswith("CPU:%d" % (pnum % 4))
  np.testing.assert_array_equal(store["replicated"].read_full().numpy(), [3.0, 3.0])
  np.testing.assert_array_equal(store["split"].read_full().numpy(), np.ones([2, 4]))
