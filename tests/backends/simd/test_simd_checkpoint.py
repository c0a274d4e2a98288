"""Checkpoints move between PlacementMeshImpl and SimdMeshImpl emulation bit for bit."""
import numpy as np
import tensorflow as tf

import mesh_tf as mtf

CPUS = ["/cpu:%d" % i for i in range(8)]
H, V, K = mtf.Dimension("hidden", 16), mtf.Dimension("vocab", 32), mtf.Dimension("k", 8)


def _graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  mtf.get_variable(mesh, "w", [H, V], initializer=tf.random_normal_initializer(seed=1))
  with mtf.variable_scope("block"):
    mtf.get_variable(mesh, "b", [V, K], dtype=mtf.VariableDType(tf.float32, tf.bfloat16),
                     initializer=tf.random_normal_initializer(seed=2))
  mtf.get_variable(mesh, "step", [], dtype=tf.int32, initializer=tf.zeros_initializer())
  return graph, mesh


def _values(impl):
  return {name: v.read_full().numpy() for name, v in impl.variable_store.items()}


def _fresh(impl):
  graph, mesh = _graph()
  mtf.Lowering(graph, {mesh: impl})
  return impl


def _perturb(impl):
  for i, v in enumerate(impl.variable_store.values()):
    v.assign_full(tf.cast(v.read_full(), tf.float32) * 0.5 + i + 1)


def test_placement_to_simd_and_back_bit_equal(tmp_path):
  placement = _fresh(mtf.PlacementMeshImpl("rows:2;cols:4", "hidden:rows;vocab:cols", CPUS))
  _perturb(placement)
  saved = _values(placement)
  prefix = mtf.save_checkpoint(str(tmp_path / "a"), placement)

  simd = _fresh(mtf.SimdMeshImpl("rows:8;cols:8", "vocab:rows;hidden:cols;k:cols",
                                 logical_to_physical=list(reversed(range(64)))))
  assert any(not np.array_equal(_values(simd)[n], saved[n]) for n in saved)
  mtf.restore_checkpoint(prefix, simd)
  for name, value in _values(simd).items():
    np.testing.assert_array_equal(value, saved[name], err_msg=name)

  _perturb(simd)
  changed = _values(simd)
  prefix = mtf.save_checkpoint(str(tmp_path / "b"), simd)
  back = _fresh(mtf.PlacementMeshImpl("rows:2;cols:4", "vocab:rows;hidden:cols", CPUS))
  mtf.restore_checkpoint(prefix, back)
  for name, value in _values(back).items():
    np.testing.assert_array_equal(value, changed[name], err_msg=name)
