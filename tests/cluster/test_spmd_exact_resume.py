"""Two SPMD processes stopped at a step no checkpoint period picks and restarted (or the
checkpoint resumed in one process) train on the batches an uninterrupted run does.

The runs start once (the `runs` fixture) and serve three tests: the stopped run steps
through MultiWorkerMirroredStrategy.run (one replica per process), and the restarted
run (without the strategy) goes on after the compared steps until task 1 is killed."""
import shutil
import types

import numpy as np
import pytest
import tensorflow as tf

import lm_cluster_helpers
from mesh_tf.cluster import input_share

STEPS, STOP = 5, 2
KILL_AFTER = 20  # the restarted run's step after which task 1 is killed
ONE_REPLICA_PER_PROCESS = "utils.run.mesh_shape = 'batch:2'"
STRATEGY = "cluster_setup.cluster_config.distribution = 'multi_worker_mirrored'"
TIMEOUT = "cluster_setup.cluster_config.collective_timeout = 5"


def _params(model_dir, corpus, train_steps):
  # float32 checkpoints: the default bfloat16 ones round the weights a resumed run
  # starts from
  return lm_cluster_helpers.lm_params(model_dir, corpus, train_steps=train_steps,
                                      save_every=100) + [
      ONE_REPLICA_PER_PROCESS, "get_variable_dtype.master_dtype = 'float32'"]


def _losses(model_dir, steps=STEPS):
  """The losses of steps 1..steps (a run may have logged more)."""
  losses = lm_cluster_helpers.losses_of(model_dir)
  assert [s for s, _ in losses][:steps] == list(range(1, steps + 1)), losses
  return [l for _, l in losses[:steps]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted one-process run: its corpus, the losses of steps 1..STEPS and
  the weights of its checkpoint after STOP steps."""
  root = tmp_path_factory.mktemp("one_process")
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(root)
  lm_cluster_helpers.run_here(_params(root / "model", corpus, STEPS) + [
      "utils.run.save_checkpoints_steps = %d" % STOP,
      "utils.run.keep_checkpoint_max = 5"])
  return types.SimpleNamespace(
      corpus=corpus, losses=_losses(root / "model"),
      weights=lm_cluster_helpers.checkpoint_weights(
          root / "model" / ("model.ckpt-%d" % STOP)))


@pytest.fixture(scope="module")
def runs(reference, tmp_path_factory):
  """Two peers train STOP steps through MultiWorkerMirroredStrategy.run and end (a
  copy of model_dir is kept); the same command without the strategy, to step 100000,
  resumes; task 1 is killed after step KILL_AFTER. Returns the outputs and model_dirs."""
  tmp_path = tmp_path_factory.mktemp("spmd")
  model_dir = tmp_path / "spmd"
  (tmp_path / "first").mkdir()
  first = lm_cluster_helpers.run_spmd(
      _params(model_dir, reference.corpus, STOP) + [TIMEOUT, STRATEGY],
      tmp_path / "first")
  first_losses = _losses(model_dir, STOP)
  first_weights = lm_cluster_helpers.checkpoint_weights(model_dir)
  moved = tmp_path / "moved"  # the same checkpoint, resumed in one process below
  shutil.copytree(model_dir, moved)
  log_dir = tmp_path / "then"
  log_dir.mkdir()
  with lm_cluster_helpers.spmd_peers(_params(model_dir, reference.corpus, 100000) +
                                     [TIMEOUT], log_dir) as procs:
    lm_cluster_helpers.wait_for_text(log_dir / "peer0.txt", "step %d/" % KILL_AFTER,
                                     procs, 240)
    procs[1].kill()
    code = procs[0].wait(timeout=90)
  return types.SimpleNamespace(
      first=first, first_losses=first_losses, first_weights=first_weights,
      model_dir=model_dir, moved=moved, then=lm_cluster_helpers.peer_logs(log_dir),
      code=code)


def test_share_of_dataset_skips_whole_global_batches():
  examples = tf.data.Dataset.range(40)
  rows = (2, 6)
  every = [b.numpy().tolist() for b in input_share.share_of_dataset(examples, 8, rows)]
  later = [b.numpy().tolist()
           for b in input_share.share_of_dataset(examples, 8, rows, skip_batches=2)]
  assert every[0] == [2, 3, 4, 5] and later == every[2:]


def test_step_through_multi_worker_mirrored_strategy_run_matches_one_process(
    runs, reference):
  # one replica per process: mesh batch:2 over the two processes
  outs = runs.first
  assert "steps through strategy.run of MultiWorkerMirroredStrategy" in outs[0]
  assert "rows [0, 4) of each batch" in outs[0] and "rows [4, 8) of each batch" in outs[1]
  np.testing.assert_allclose(runs.first_losses, reference.losses[:STOP], rtol=1e-5)
  lm_cluster_helpers.assert_same_weights(runs.first_weights, reference.weights)


def test_spmd_run_stopped_and_restarted_matches_one_process(runs, reference):
  for out in runs.then:
    assert ("the input pipeline skips the %d batches (%d examples) it already trained "
            "on" % (STOP, STOP * 8)) in out, out[-3000:]
  np.testing.assert_allclose(_losses(runs.model_dir), reference.losses, rtol=1e-5)
  # stopped in SPMD, resumed in one process on a single device
  lm_cluster_helpers.run_here(_params(runs.moved, reference.corpus, STEPS), [
      "utils.run.mesh_shape = ''", "utils.run.layout_rules = ''"])
  np.testing.assert_allclose(_losses(runs.moved), reference.losses, rtol=1e-5)


def test_a_killed_peer_is_named(runs):
  out = runs.then[0]
  assert runs.code == 1, out[-3000:]
  errors = [l for l in out.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "task 1 (localhost:" in errors[0], out[-3000:]
