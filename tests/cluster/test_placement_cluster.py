"""A placement mesh over two worker processes (4 CPUs each), driven by one client.

The workers are shared by the tests of this module. The kill test restarts the worker it
kills on the same address, serving the same 4 CPUs, so the tests pass in any order (run
with the kill test first, the others still pass).
"""
import json
import os
import re
import subprocess
import time

import numpy as np
import pytest

import cluster_helpers
import lm_cluster_helpers
import mesh_tf as mtf
from models.mlp.model import MlpModel, synthetic_digits

STOP_TIMEOUT = 120  # seconds the chief may take to notice the loss on a loaded host


def _wait_for(path, proc, timeout):
  deadline = time.time() + timeout
  while not os.path.exists(path):
    if proc.poll() is not None:
      raise AssertionError("the trainer exited (%s) before writing %s"
                           % (proc.returncode, path))
    if time.time() > deadline:
      raise AssertionError("no %s after %ds" % (path, timeout))
    time.sleep(0.1)


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
  """Two local workers with 4 virtual CPUs each, shared by this module's tests."""
  with cluster_helpers.local_workers(tmp_path_factory.mktemp("workers")) as workers_:
    yield workers_


def test_mlp_across_processes_matches_one_device_and_restores_anywhere(workers, tmp_path):
  cluster = ",".join(workers[0])
  run = cluster_helpers.run_script(["tests/cluster/mlp_client.py", cluster, str(tmp_path)])
  assert run.returncode == 0, run.stderr[-3000:]
  result = cluster_helpers.last_json_line(run.stdout)
  assert {d.split("/task:")[1][0] for d in result["devices"]} == {"0", "1"}
  np.testing.assert_allclose(result["losses"], result["single_losses"], rtol=1e-5)
  assert result["mismatch_error"] == (
      "mesh rows:2;cols:2 has 4 processors but the cluster's 2 tasks offer 4/4 CPU "
      "devices (8 in all); start the workers with --virtual_cpus=2, or change the mesh")
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


def test_make_train_lm_across_processes_matches_one_process(workers, tmp_path,
                                                           local_lm):
  cluster = ",".join(workers[0])
  corpus = local_lm.corpus
  cluster_dir = tmp_path / "cluster"
  run = subprocess.run(
      lm_cluster_helpers.cluster_command(lm_cluster_helpers.lm_params(cluster_dir, corpus),
                                         cluster),
      cwd=cluster_helpers.REPO_ROOT, env=cluster_helpers.env(), capture_output=True,
      text=True, timeout=240, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "8 devices of 2 worker tasks" in run.stdout
  assert "PlacementMeshImpl" in run.stdout and "batch:2;model:4" in run.stdout
  cluster_losses = lm_cluster_helpers.losses_of(cluster_dir)
  assert [s for s, _ in cluster_losses] == [1, 2, 3, 4]
  np.testing.assert_allclose([l for _, l in cluster_losses], local_lm.losses(),
                             rtol=1e-5)
  lm_cluster_helpers.assert_same_weights(
      lm_cluster_helpers.checkpoint_weights(cluster_dir), local_lm.weights())
  # The chief's checkpoint restores in this one process on [] and on [2,4].
  evals = [lm_cluster_helpers.run_here(
      lm_cluster_helpers.lm_params(cluster_dir, corpus),
      ["utils.run.mode = 'eval'", "utils.run.mesh_shape = %r" % mesh,
       "utils.run.layout_rules = %r" % layout])
           for mesh, layout in (("", ""), ("batch:2,model:4", "batch:batch,d_ff:model,"
                                            "heads:model,vocab:model"))]
  assert evals[0]["step"] == evals[1]["step"] == 4
  np.testing.assert_allclose(evals[0]["loss"], evals[1]["loss"], rtol=1e-5)


def test_killed_worker_stops_the_chief_naming_it_and_restart_resumes(workers, tmp_path):
  corpus = lm_cluster_helpers.trainer_helpers.write_corpus(tmp_path)
  model_dir = tmp_path / "m"
  params = lm_cluster_helpers.lm_params(model_dir, corpus, train_steps=100000,
                                        save_every=2)
  addresses, procs = workers
  cluster = ",".join(addresses)
  out, err = open(tmp_path / "out.txt", "w"), open(tmp_path / "err.txt", "w")
  chief = subprocess.Popen(lm_cluster_helpers.cluster_command(params, cluster),
                           cwd=cluster_helpers.REPO_ROOT, env=cluster_helpers.env(),
                           stdout=out, stderr=err)
  try:
    _wait_for(str(model_dir / "model.ckpt-2.index"), chief, 240)
    procs[1].kill()
    procs[1].wait(timeout=30)
    killed = time.time()
    try:
      returncode = chief.wait(timeout=STOP_TIMEOUT)  # a hang fails here
    except subprocess.TimeoutExpired:
      pytest.fail("the chief did not stop within %ds of losing worker 1"
                  % STOP_TIMEOUT)
    print("the chief stopped %.1fs after worker 1 was killed" % (time.time() - killed))
  finally:
    cluster_helpers.stop([chief])
    out.close()
    err.close()
  stderr = (tmp_path / "err.txt").read_text()
  errors = [l for l in stderr.splitlines() if l.startswith("error:")]
  assert returncode == 1, stderr[-3000:]
  assert len(errors) == 1 and errors[0].startswith(
      "error: lost worker task 1 (%s)" % addresses[1]), stderr[-3000:]
  saved = [int(m) for m in re.findall(r"saved checkpoint .*-(\d+)\n",
                                      (tmp_path / "out.txt").read_text())]
  assert saved and saved[-1] >= 2

  # Restart the worker on its address -- this time as the trainer's own worker role,
  # from TF_CONFIG (it serves mesh size / 2 = 4 CPUs) -- then the same command.
  config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 1}}
  procs[1] = subprocess.Popen(
      lm_cluster_helpers.cluster_command(params, cluster)[:3] + [
          "--gin_file=%s" % f for f in lm_cluster_helpers.GIN_FILES],
      cwd=cluster_helpers.REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
      env=dict(cluster_helpers.env(), TF_CONFIG=json.dumps(config)))
  cluster_helpers.wait_listening(addresses, procs)
  resume = subprocess.run(
      lm_cluster_helpers.cluster_command(
          params + ["utils.run.train_steps = %d" % (saved[-1] + 2)], cluster),
      cwd=cluster_helpers.REPO_ROOT, env=cluster_helpers.env(), capture_output=True,
      text=True, timeout=240, check=False)
  assert resume.returncode == 0, resume.stderr[-3000:]
  assert "at step %d" % saved[-1] in resume.stdout, resume.stdout[-2000:]
  assert "saved checkpoint %s-%d" % (model_dir / "model.ckpt", saved[-1] + 2) in (
      resume.stdout)
