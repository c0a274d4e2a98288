"""SIMD TPU-runtime variables: created under the scope, checkpointed outside it.

Checkpoints move between the TPU runtime (MirroredStrategy on 8 virtual CPUs) and the
CPU emulation bit for bit, with float32, bfloat16-sliced, int64 and bool variables and
+-inf values; each core's component holds exactly the emulation's slice of that core.
Creating and restoring variables sends each core its slice from the host, without
strategy.run (on a TPU: no compilation per variable).
"""
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf

MESH = "rows:2;cols:4"
LAYOUT = "hidden:rows;vocab:cols"
SCRAMBLED = [5, 2, 7, 0, 3, 6, 1, 4]
H, V = mtf.Dimension("hidden", 4), mtf.Dimension("vocab", 8)


def _graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.get_variable(mesh, "w", [H, V], initializer=tf.random_normal_initializer(seed=1))
  mtf.get_variable(mesh, "b", [V], dtype=mtf.VariableDType(tf.float32, tf.bfloat16),
                   initializer=tf.random_normal_initializer(seed=2))
  mtf.get_variable(mesh, "counts", [V, H], dtype=tf.int64, initializer=tf.zeros_initializer())
  mtf.get_variable(mesh, "mask", [H], dtype=tf.bool, initializer=tf.zeros_initializer())
  return graph, mesh


def _lowered(impl, strategy=None):
  graph, mesh = _graph()
  if strategy is None:
    mtf.Lowering(graph, {mesh: impl})
  else:
    with strategy.scope():
      mtf.Lowering(graph, {mesh: impl})
  return impl


def _new_values(seed):
  rng = np.random.RandomState(seed)
  w = rng.randn(4, 8).astype(np.float32)
  w[0, 1], w[3, 6] = np.inf, -np.inf
  return {"w": w, "b": rng.randn(8).astype(np.float32),
          "counts": rng.randint(-2 ** 50, 2 ** 50, size=[8, 4]).astype(np.int64),
          "mask": rng.rand(4) > 0.5}


def _assign(impl, values):
  for name, value in values.items():
    impl.variable_store[name].assign_full(tf.constant(value))


def _values(impl):
  return {name: v.read_full().numpy() for name, v in impl.variable_store.items()}


def _assert_equal(got, want, what):
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg="%s: %s" % (what, name))


@pytest.fixture
def no_strategy_run(monkeypatch, strategy):
  """Makes any strategy.run fail (variable I/O must not compile a step per variable)."""
  def refuse(*args, **kwargs):
    raise AssertionError("strategy.run called for variable I/O")
  monkeypatch.setattr(strategy, "run", refuse)


def test_save_and_restore_outside_the_scope(tmp_path, strategy, device_assignment,
                                            no_strategy_run):
  del no_strategy_run
  tpu = _lowered(mtf.SimdMeshImpl(MESH, LAYOUT, device_assignment=device_assignment,
                                  logical_to_physical=SCRAMBLED), strategy)
  emulation = _lowered(mtf.SimdMeshImpl(MESH, LAYOUT, logical_to_physical=SCRAMBLED))
  _assert_equal(_values(tpu), _values(emulation), "initial values")

  saved = _new_values(0)
  saved["b"] = saved["b"].astype(tf.bfloat16.as_numpy_dtype).astype(np.float32)
  _assign(tpu, saved)
  assert not tf.distribute.has_strategy()
  prefix = mtf.save_checkpoint(str(tmp_path / "tpu"), tpu)
  fresh = _lowered(mtf.SimdMeshImpl(MESH, LAYOUT, logical_to_physical=SCRAMBLED))
  mtf.restore_checkpoint(prefix, fresh)
  _assert_equal(_values(fresh), saved, "TPU checkpoint restored on the emulation")

  changed = _new_values(1)
  _assign(emulation, changed)
  prefix = mtf.save_checkpoint(str(tmp_path / "emulation"), emulation)
  mtf.restore_checkpoint(prefix, tpu)
  _assert_equal(_values(tpu), _values(emulation), "emulation checkpoint restored on TPU")
  for name, variable in tpu.variable_store.items():
    components = strategy.experimental_local_results(variable.variable)
    slices = emulation.variable_store[name].laid_out_tensor.all_slices[0].numpy()
    for core, component in enumerate(components):
      np.testing.assert_array_equal(component.numpy(), slices[core],
                                    err_msg="%s on physical core %d" % (name, core))


def test_variables_need_the_strategy_scope(device_assignment):
  impl = mtf.SimdMeshImpl(MESH, LAYOUT, device_assignment=device_assignment)
  with pytest.raises(mtf.LayoutError, match=r"variable w .*strategy.scope\(\)"):
    _lowered(impl)


def test_variables_need_one_replica_per_core(device_assignment):
  impl = mtf.SimdMeshImpl(MESH, LAYOUT, device_assignment=device_assignment)
  four = tf.distribute.MirroredStrategy(["/cpu:%d" % i for i in range(4)])
  with pytest.raises(mtf.LayoutError, match="4 replicas but mesh rows:2;cols:4 has 8"):
    _lowered(impl, four)
