"""The trainer (`python -m models.transformer.main`) in multi-client SPMD mode: two
processes (4 virtual CPUs each) train the `make train` LM on mesh batch:2,model:4, each
from TF_CONFIG, each reading its own rows of the batch; compared with one process."""
import json
import subprocess

import numpy as np

import cluster_helpers
import lm_cluster_helpers

SPMD = "cluster_setup.cluster_config.mode = 'spmd'"


def _peer_command(params):
  """argv of one SPMD peer (its task comes from TF_CONFIG)."""
  cmd = lm_cluster_helpers.cluster_command(params + [SPMD], "x:1")
  return [a for a in cmd if not a.startswith("--cluster=")]


def run_spmd(params, tmp_path, timeout=300):
  """Runs the two peers to the end; returns their stdout texts (asserting success)."""
  addresses = ["localhost:%d" % p for p in cluster_helpers.free_ports(2)]
  procs, logs = [], []
  try:
    for task in range(2):
      config = {"cluster": {"worker": addresses},
                "task": {"type": "worker", "index": task}}
      logs.append(open(tmp_path / ("peer%d.txt" % task), "w+"))
      procs.append(subprocess.Popen(
          _peer_command(params), cwd=cluster_helpers.REPO_ROOT,
          env=dict(cluster_helpers.env(), TF_CONFIG=json.dumps(config)),
          stdout=logs[-1], stderr=subprocess.STDOUT))
    for p in procs:
      p.wait(timeout=timeout)
  finally:
    cluster_helpers.stop(procs)
    for log in logs:
      log.close()
  outs = [(tmp_path / ("peer%d.txt" % t)).read_text() for t in range(2)]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  return outs


def test_make_train_lm_in_spmd_matches_one_process_and_restores_anywhere(tmp_path):
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(tmp_path)
  spmd_dir, local_dir = tmp_path / "spmd", tmp_path / "local"
  outs = run_spmd(lm_cluster_helpers.lm_params(spmd_dir, corpus), tmp_path)
  assert "rows [0, 4) of each batch" in outs[0] and "rows [4, 8) of each batch" in outs[1]
  assert "saved checkpoint" in outs[0] and "saved checkpoint" not in outs[1]
  history = lm_cluster_helpers.run_here(lm_cluster_helpers.lm_params(local_dir, corpus))
  spmd_losses = lm_cluster_helpers.losses_of(spmd_dir)
  assert [s for s, _ in spmd_losses] == [1, 2, 3, 4]
  np.testing.assert_allclose([l for _, l in spmd_losses], [l for _, l in history],
                             rtol=1e-5)
  lm_cluster_helpers.assert_same_weights(
      lm_cluster_helpers.checkpoint_weights(spmd_dir),
      lm_cluster_helpers.checkpoint_weights(local_dir))
  evals = [lm_cluster_helpers.run_here(
      lm_cluster_helpers.lm_params(spmd_dir, corpus),
      ["utils.run.mode = 'eval'", "utils.run.mesh_shape = %r" % mesh,
       "utils.run.layout_rules = %r" % layout])
           for mesh, layout in (("", ""), ("batch:2,model:4", "batch:batch,d_ff:model,"
                                            "heads:model,vocab:model"))]
  assert evals[0]["step"] == evals[1]["step"] == 4
  np.testing.assert_allclose(evals[0]["loss"], evals[1]["loss"], rtol=1e-5)


def test_step_through_multi_worker_mirrored_strategy_run_matches_one_process(tmp_path):
  # one replica per process: mesh batch:2 over the two processes, each step through
  # MultiWorkerMirroredStrategy.run
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(tmp_path)
  spmd_dir, local_dir = tmp_path / "spmd", tmp_path / "local"
  strategy = ["utils.run.mesh_shape = 'batch:2'", "utils.run.train_steps = 2",
              "cluster_setup.cluster_config.distribution = 'multi_worker_mirrored'"]
  outs = run_spmd(lm_cluster_helpers.lm_params(spmd_dir, corpus) + strategy, tmp_path)
  assert "steps through strategy.run of MultiWorkerMirroredStrategy" in outs[0]
  assert "rows [0, 4) of each batch" in outs[0] and "rows [4, 8) of each batch" in outs[1]
  history = lm_cluster_helpers.run_here(lm_cluster_helpers.lm_params(
      local_dir, corpus, train_steps=2))
  np.testing.assert_allclose([l for _, l in lm_cluster_helpers.losses_of(spmd_dir)],
                             [l for _, l in history], rtol=1e-5)
  lm_cluster_helpers.assert_same_weights(
      lm_cluster_helpers.checkpoint_weights(spmd_dir),
      lm_cluster_helpers.checkpoint_weights(local_dir))
