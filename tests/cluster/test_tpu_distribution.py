"""The trainer's `cluster_config.distribution = 'tpu'` path on CPU: variables under the
strategy's scope, the step through strategy.run on SimdMeshImpl's TPU runtime. The
TPUStrategy is replaced by a MirroredStrategy over the 8 virtual CPUs and the TPU
collectives by the stand-ins of tests/backends/tpu_contract; only the TPU connection
itself (cluster_setup.tpu_strategy) is untested."""
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import lm_cluster_helpers
import mesh_tf as mtf
from mesh_tf import cluster
from mesh_tf.backends import simd_tpu
from models.transformer.trainer import cluster_setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "backends", "tpu_contract"))
import tpu_standins  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_make_train_lm_through_strategy_run_matches_placement(tmp_path, monkeypatch,
                                                              local_lm):
  strategy = tf.distribute.MirroredStrategy(["/cpu:%d" % i for i in range(8)])
  standins = tpu_standins.TpuCollectiveStandIns(strategy).install(monkeypatch)
  assignment = simd_tpu.device_assignment_for_mesh(
      tpu_standins.fake_topology([2, 2, 1, 2]))
  made = []

  def fake_tpu(mesh_size):
    made.append(mesh_size)
    return strategy, assignment
  monkeypatch.setitem(cluster_setup.STRATEGY_FACTORIES, "tpu", fake_tpu)
  monkeypatch.setitem(cluster_setup._state, "strategy", None)  # pylint: disable=protected-access
  tpu_dir = tmp_path / "tpu"
  history = lm_cluster_helpers.run_here(
      lm_cluster_helpers.lm_params(tpu_dir, local_lm.corpus, train_steps=2),
      ["cluster_setup.cluster_config.distribution = 'tpu'"])
  assert made == [8] and standins.ops_used()
  np.testing.assert_allclose([l for _, l in history], local_lm.losses(2), rtol=1e-5)
  lm_cluster_helpers.assert_same_weights(
      lm_cluster_helpers.checkpoint_weights(tpu_dir), local_lm.weights(2))
  reader = tf.train.load_checkpoint(str(tpu_dir))
  assert reader.get_tensor("global_step") == 2


def test_a_tpu_mesh_outside_the_tpu_distribution_is_refused_with_the_switch_named(
    monkeypatch):
  assignment = simd_tpu.device_assignment_for_mesh(
      tpu_standins.fake_topology([2, 2, 1, 2]))
  tpu_mesh = mtf.SimdMeshImpl("batch:2;model:4", "batch:batch",
                              device_assignment=assignment)
  monkeypatch.setitem(cluster_setup._state, "strategy", None)  # pylint: disable=protected-access
  with pytest.raises(cluster.ClusterError, match="distribution = 'tpu'"):
    cluster_setup.variable_scope(tpu_mesh)
  emulated = mtf.SimdMeshImpl("batch:2;model:4", "batch:batch")
  assert cluster_setup.run_replicated(emulated, lambda x: x + 1, 1) == 2
