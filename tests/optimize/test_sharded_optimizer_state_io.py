"""shard_optimizer_state: communication equals the cost model's prediction, checkpoints
move between sharded and unsharded runs, the other optimizers, bad arguments, gin."""
import collections

import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf import analysis

import sharded_state_testing as st


def test_slot_bytes_numbers():
  """The totals for the toy model: 2 Adam slots of w1 (8x16), b1 (16), w2 (16x8) and
  odd (5) in float32 = 2216 bytes; 8-way data parallel, each processor owns
  2 * (64 + 8 + 64 + 20) = 312 (the cost model's figure per processor)."""
  model = st.ToyModel(st.adam(True))
  impl = st.make_impl("placement", "dp")
  mtf.Lowering(model.graph, {model.mesh: impl})
  per_device = st.bytes_per_device(impl, model.slot_names)
  # odd's slots (5 elements: not divisible by 8) stay whole, on the first device only
  # (the replicas of a slice on shared host memory are one variable)
  assert per_device == dict({"/device:CPU:%d" % i: 2 * (64 + 8 + 64) for i in range(8)},
                            **{"/device:CPU:0": 312})
  assert analysis.estimate_cost(model.graph, *st.LAYOUTS["dp"]).optimizer_bytes_per_processor == 312
  model = st.ToyModel(st.adam(False))
  impl = st.make_impl("placement", "dp")
  mtf.Lowering(model.graph, {model.mesh: impl})
  assert max(st.bytes_per_device(impl, model.slot_names).values()) == 2216
  predicted = analysis.estimate_cost(model.graph, *st.LAYOUTS["dp"])
  assert predicted.optimizer_bytes_per_processor == 2216


@pytest.mark.parametrize("make", [
    lambda s: mtf.optimize.AdafactorOptimizer(beta1=0.9, min_dim_size_to_factor=4,
                                              shard_optimizer_state=s),
    lambda s: mtf.optimize.MomentumOptimizer(0.05, 0.9, shard_optimizer_state=s),
], ids=["adafactor", "momentum"])
def test_other_optimizers(make):
  impl = lambda: st.make_impl("placement", "dp+mp")
  sharded_model = st.ToyModel(lambda: make(True))
  sharded_impl = impl()
  sharded = sharded_model.train(sharded_impl)
  unsharded = st.ToyModel(lambda: make(False)).train(impl())
  st.assert_same(sharded, unsharded, 1e-6, "sharded vs unsharded")
  # the full-size slots of w1 are halved on each device (2-way data parallel)
  for name in sharded_model.slot_names:
    if name.startswith("w1") and sharded[1][name].shape == (8, 16):
      per_device = st.bytes_per_device(sharded_impl, [name])
      assert max(per_device.values()) == 8 * 16 * 4 // 8


def test_layout_independent_graph_and_no_data_parallel_axis():
  """One graph lowers under a layout without a batch rule (model parallel only): the
  slots are laid out like their variables and nothing extra is communicated."""
  model = st.ToyModel(st.adam(True))
  unsharded = st.ToyModel(st.adam(False))
  mesh_shape, rules = "all:8", "hidden:all"
  a = analysis.estimate_cost(model.graph, mesh_shape, rules)
  b = analysis.estimate_cost(unsharded.graph, mesh_shape, rules)
  assert a.optimizer_bytes_per_processor == b.optimizer_bytes_per_processor
  assert a.comm_bytes_per_processor == b.comm_bytes_per_processor


def _traced_records(model, impl):
  mtf.Lowering(model.graph, {model.mesh: impl})
  lowerings = []

  @tf.function
  def step():
    lowering = mtf.Lowering(model.graph, {model.mesh: impl})
    lowerings.append(lowering)
    for op in model.update_ops:
      lowering.lowered_operation(op)
    return lowering.export_to_tf_tensor(model.loss)
  step.get_concrete_function()
  return lowerings[0].comm_records


@pytest.mark.parametrize("layout", list(st.LAYOUTS))
def test_communication_equals_prediction(layout):
  key = lambda r: (r.op, r.kind, r.mesh_axes, r.group_size, r.slice_bytes)
  model = st.ToyModel(st.adam(True))
  measured = _traced_records(model, st.make_impl("placement", layout))
  predicted = analysis.estimate_cost(model.graph, *st.LAYOUTS[layout],
                                     fetches=[model.loss] + model.update_ops)
  assert collections.Counter(map(key, measured)) == collections.Counter(
      map(key, predicted.comm_records))
  assert predicted.unmodelled_ops == []
  # the new values come back with one all-gather per sharded variable
  gathers = [r for r in measured if r.op.startswith("from_optimizer_shard")]
  assert {r.kind for r in gathers} == {"allconcat"}
  assert len(gathers) == (3 if layout == "dp" else 2)
  # the gradients of w1 and w2 (einsums owing their SUM over the batch axis) and, on dp,
  # of b1 (a reduce_sum owing it) are reduce-scattered, not allreduced
  scatters = [r for r in measured if r.op.startswith("to_optimizer_shard")]
  assert [r.kind for r in scatters] == ["reducescatter"] * (3 if layout == "dp" else 2)
  assert not [r for r in measured if r.op.startswith("einsum") and 0 in r.mesh_axes]
  # so the step sends what the unsharded one does (reduce-scatter + all-gather = one
  # allreduce)
  unsharded = st.ToyModel(st.adam(False))
  before = analysis.total_bytes_per_processor(
      _traced_records(unsharded, st.make_impl("placement", layout)))
  assert analysis.total_bytes_per_processor(measured) == pytest.approx(before)


def test_checkpoints_move_between_sharded_and_unsharded(tmp_path):
  for save_shard, save_layout, load_layout in [(True, "dp+mp", "dp"), (False, "dp", "dp+mp")]:
    model = st.ToyModel(st.adam(save_shard))
    impl = st.make_impl("placement", save_layout)
    model.train(impl, steps=2)
    saved = {n: v.read_full().numpy() for n, v in impl.variable_store.items()}
    lowering = mtf.Lowering(model.graph, {model.mesh: impl})
    prefix = mtf.save_checkpoint(str(tmp_path / str(save_shard)), lowering, global_step=2)
    after = model.train(impl, steps=1)

    other = st.ToyModel(st.adam(not save_shard))
    other_impl = st.make_impl("placement", load_layout)
    mtf.Lowering(other.graph, {other.mesh: other_impl})
    result = mtf.restore_checkpoint(prefix, other_impl)
    assert sorted(result.names) == sorted(saved)
    for name, v in other_impl.variable_store.items():
      np.testing.assert_array_equal(v.read_full().numpy(), saved[name], err_msg=name)
    st.assert_same(other.train(other_impl, steps=1), after, 1e-6,
                 "step after restoring (saved sharded=%s)" % save_shard)


def test_bad_arguments_are_named():
  with pytest.raises(mtf.MtfError, match="SgdOptimizer.shard_optimizer_state=True.*no "
                     "optimizer state"):
    mtf.optimize.SgdOptimizer(0.1, shard_optimizer_state=True)
  mtf.optimize.SgdOptimizer(0.1, shard_optimizer_state=False)
  with pytest.raises(mtf.MtfError, match="AdamWeightDecayOptimizer.shard_optimizer_state "
                     "must be True or False, got 'yes'"):
    mtf.optimize.AdamWeightDecayOptimizer(0.1, shard_optimizer_state="yes")
  with pytest.raises(mtf.MtfError, match="AdafactorOptimizer.shard_optimizer_state"):
    mtf.optimize.AdafactorOptimizer(shard_optimizer_state=1)
  with pytest.raises(mtf.MtfError, match="MomentumOptimizer.shard_optimizer_state"):
    mtf.optimize.MomentumOptimizer(0.1, 0.9, shard_optimizer_state=None)


def test_gin_turns_it_on():
  import gin  # pylint: disable=g-import-not-at-top
  with gin.unlock_config():
    gin.parse_config("mesh_tf.optimize.AdafactorOptimizer.shard_optimizer_state = True\n"
                     "AdamWeightDecayOptimizer.shard_optimizer_state = True")
  try:
    assert mtf.optimize.AdafactorOptimizer().shard_optimizer_state is True
    assert mtf.optimize.AdamWeightDecayOptimizer(0.1).shard_optimizer_state is True
  finally:
    gin.clear_config()
  assert mtf.optimize.AdafactorOptimizer().shard_optimizer_state is False
