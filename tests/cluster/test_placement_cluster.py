"""A placement mesh over two worker processes (4 CPUs each), driven by one client."""
import subprocess

import numpy as np
import pytest

import cluster_helpers
import lm_cluster_helpers
import mesh_tf as mtf
from models.mlp.model import MlpModel, synthetic_digits


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
  """Two local workers with 4 virtual CPUs each, shared by this module's tests."""
  with cluster_helpers.local_workers(tmp_path_factory.mktemp("workers")) as (addrs, _):
    yield ",".join(addrs)


def test_mlp_across_processes_matches_one_device_and_restores_anywhere(workers, tmp_path):
  run = cluster_helpers.run_script(["tests/cluster/mlp_client.py", workers, str(tmp_path)])
  assert run.returncode == 0, run.stderr[-3000:]
  result = cluster_helpers.last_json_line(run.stdout)
  assert {d.split("/task:")[1][0] for d in result["devices"]} == {"0", "1"}
  np.testing.assert_allclose(result["losses"], result["single_losses"], rtol=1e-5)
  assert result["losses"][-1] < result["losses"][0]
  images, labels = synthetic_digits(32, seed=1)
  for impl in (mtf.PlacementMeshImpl("", "", [""]),
               mtf.PlacementMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols",
                                     ["/cpu:%d" % i for i in range(8)])):
    model = MlpModel(batch_size=32, hidden_size=32)
    eval_step = model.make_eval_step(impl)
    mtf.restore_checkpoint(result["checkpoint"], impl)
    np.testing.assert_allclose(float(eval_step(images, labels)), result["eval_loss"],
                               rtol=1e-5)


def test_make_train_lm_across_processes_matches_one_process(workers, tmp_path):
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(tmp_path)
  cluster_dir, local_dir = tmp_path / "cluster", tmp_path / "local"
  run = subprocess.run(
      lm_cluster_helpers.cluster_command(lm_cluster_helpers.lm_params(cluster_dir, corpus),
                                         workers),
      cwd=cluster_helpers.REPO_ROOT, env=cluster_helpers.env(), capture_output=True,
      text=True, timeout=240, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "8 devices of 2 worker tasks" in run.stdout
  assert "PlacementMeshImpl" in run.stdout and "batch:2;model:4" in run.stdout
  history = lm_cluster_helpers.run_here(lm_cluster_helpers.lm_params(local_dir, corpus))
  cluster_losses = lm_cluster_helpers.losses_of(cluster_dir)
  assert [s for s, _ in cluster_losses] == [1, 2, 3, 4]
  np.testing.assert_allclose([l for _, l in cluster_losses], [l for _, l in history],
                             rtol=1e-5)
  lm_cluster_helpers.assert_same_weights(
      lm_cluster_helpers.checkpoint_weights(cluster_dir),
      lm_cluster_helpers.checkpoint_weights(local_dir))
  # The chief's checkpoint restores in this one process on [] and on [2,4].
  evals = [lm_cluster_helpers.run_here(
      lm_cluster_helpers.lm_params(cluster_dir, corpus),
      ["utils.run.mode = 'eval'", "utils.run.mesh_shape = %r" % mesh,
       "utils.run.layout_rules = %r" % layout])
           for mesh, layout in (("", ""), ("batch:2,model:4", "batch:batch,d_ff:model,"
                                            "heads:model,vocab:model"))]
  assert evals[0]["step"] == evals[1]["step"] == 4
  np.testing.assert_allclose(evals[0]["loss"], evals[1]["loss"], rtol=1e-5)


def test_trainer_refuses_a_cluster_that_does_not_fit_the_mesh(workers, tmp_path):
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(tmp_path)
  params = lm_cluster_helpers.lm_params(tmp_path / "m", corpus) + [
      "utils.run.mesh_shape = 'batch:2,model:2'"]
  run = subprocess.run(lm_cluster_helpers.cluster_command(params, workers),
                       cwd=cluster_helpers.REPO_ROOT, env=cluster_helpers.env(),
                       capture_output=True, text=True, timeout=240, check=False)
  assert run.returncode == 1
  errors = [l for l in run.stderr.splitlines() if l.startswith("error:")]
  assert errors == ["error: mesh batch:2;model:2 has 4 processors but the cluster's 2 "
                    "tasks offer 4/4 CPU devices (8 in all); start the workers with "
                    "--virtual_cpus=2, or change the mesh"], run.stderr[-2000:]
  assert not (tmp_path / "m" / "checkpoint").exists()
