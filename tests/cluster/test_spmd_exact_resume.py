"""Two SPMD processes stopped at a step no checkpoint period picks and restarted (or the
checkpoint resumed in one process) train on the batches an uninterrupted run does."""
import shutil

import numpy as np
import pytest
import tensorflow as tf

import lm_cluster_helpers
from mesh_tf.cluster import input_share

STEPS, STOP = 5, 2
ONE_REPLICA_PER_PROCESS = "utils.run.mesh_shape = 'batch:2'"


def _params(model_dir, corpus, train_steps):
  # float32 checkpoints: the default bfloat16 ones round the weights a resumed run
  # starts from
  return lm_cluster_helpers.lm_params(model_dir, corpus, train_steps=train_steps,
                                      save_every=100) + [
      ONE_REPLICA_PER_PROCESS, "get_variable_dtype.master_dtype = 'float32'"]


def _losses(model_dir):
  losses = lm_cluster_helpers.losses_of(model_dir)
  assert [s for s, _ in losses] == list(range(1, STEPS + 1)), losses
  return [l for _, l in losses]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """(corpus, losses of steps 1..STEPS) of an uninterrupted one-process run."""
  root = tmp_path_factory.mktemp("one_process")
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(root)
  lm_cluster_helpers.run_here(_params(root / "model", corpus, STEPS))
  return corpus, _losses(root / "model")


def test_share_of_dataset_skips_whole_global_batches():
  examples = tf.data.Dataset.range(40)
  rows = (2, 6)
  every = [b.numpy().tolist() for b in input_share.share_of_dataset(examples, 8, rows)]
  later = [b.numpy().tolist()
           for b in input_share.share_of_dataset(examples, 8, rows, skip_batches=2)]
  assert every[0] == [2, 3, 4, 5] and later == every[2:]


def test_spmd_run_stopped_and_restarted_matches_one_process(reference, tmp_path):
  corpus, expected = reference
  model_dir = tmp_path / "spmd"
  (tmp_path / "first").mkdir()
  lm_cluster_helpers.run_spmd(_params(model_dir, corpus, STOP), tmp_path / "first")
  moved = tmp_path / "moved"  # the same checkpoint, resumed in one process below
  shutil.copytree(model_dir, moved)
  (tmp_path / "then").mkdir()
  outs = lm_cluster_helpers.run_spmd(_params(model_dir, corpus, STEPS), tmp_path / "then")
  for out in outs:
    assert ("the input pipeline skips the %d batches (%d examples) it already trained "
            "on" % (STOP, STOP * 8)) in out, out[-3000:]
  np.testing.assert_allclose(_losses(model_dir), expected, rtol=1e-5)
  # stopped in SPMD, resumed in one process on a single device
  lm_cluster_helpers.run_here(_params(moved, corpus, STEPS), [
      "utils.run.mesh_shape = ''", "utils.run.layout_rules = ''"])
  np.testing.assert_allclose(_losses(moved), expected, rtol=1e-5)
