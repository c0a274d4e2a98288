"""A placement mesh over two worker processes (4 CPUs each), driven by one client.

The module's processes start once, in the `runs` fixture, and its tests only read what
they did: the tests pass alone and in any order, and none changes a shared process.
"""
import json
import os
import re
import subprocess
import time
import types

import numpy as np
import pytest

import cluster_helpers
import lm_cluster_helpers
import mesh_tf as mtf
from models.mlp.model import MlpModel, synthetic_digits

STOP_TIMEOUT = 120  # seconds the chief may take to notice the loss on a loaded host
KILL_AT = 4  # the chief's checkpoint (and loss summaries) compared with one process


def _wait_for(path, proc, timeout):
  deadline = time.time() + timeout
  while not os.path.exists(path):
    if proc.poll() is not None:
      raise AssertionError("the trainer exited (%s) before writing %s"
                           % (proc.returncode, path))
    if time.time() > deadline:
      raise AssertionError("no %s after %ds" % (path, timeout))
    time.sleep(0.1)


def _lm_until_worker_1_is_killed(addresses, procs, params, tmp_path):
  """Runs the trainer's chief on the cluster until it wrote checkpoint KILL_AT, then
  kills worker 1; returns the chief's (exit status, stdout, stderr)."""
  model_dir = tmp_path / "lm"
  out, err = open(tmp_path / "out.txt", "w"), open(tmp_path / "err.txt", "w")
  command = lm_cluster_helpers.cluster_command(params, ",".join(addresses))
  chief = subprocess.Popen(command, cwd=cluster_helpers.REPO_ROOT,
                           env=cluster_helpers.env(), stdout=out, stderr=err)
  try:
    _wait_for(str(model_dir / ("model.ckpt-%d.index" % KILL_AT)), chief, 240)
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
  return (returncode, (tmp_path / "out.txt").read_text(),
          (tmp_path / "err.txt").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory, local_lm):
  """Two local workers with 4 virtual CPUs each, then, in this order: the MLP client
  on them; the trainer's chief on the `make train` LM (local_lm's corpus) until its
  checkpoint KILL_AT, when worker 1 is killed; worker 1 restarted on its address as the
  trainer's own worker role (from TF_CONFIG); the chief's command again, 2 steps past
  its last checkpoint. Returns what each run left."""
  tmp_path = tmp_path_factory.mktemp("placement")
  model_dir = tmp_path / "lm"
  # keep every checkpoint: KILL_AT's is compared with one process after the resume
  params = lm_cluster_helpers.lm_params(model_dir, local_lm.corpus, train_steps=100000,
                                        save_every=2) + [
                                            "utils.run.keep_checkpoint_max = 100"]
  with cluster_helpers.local_workers(tmp_path) as (addresses, procs):
    cluster = ",".join(addresses)
    mlp = cluster_helpers.run_script(["tests/cluster/mlp_client.py", cluster,
                                      str(tmp_path)])
    returncode, stdout, stderr = _lm_until_worker_1_is_killed(addresses, procs, params,
                                                              tmp_path)
    losses = lm_cluster_helpers.losses_of(model_dir)
    saved = [int(m) for m in re.findall(r"saved checkpoint .*-(\d+)\n", stdout)]
    assert saved, stdout[-3000:] + stderr[-3000:]
    config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 1}}
    procs[1] = subprocess.Popen(
        lm_cluster_helpers.cluster_command(params, cluster)[:3] + [
            "--gin_file=%s" % f for f in lm_cluster_helpers.GIN_FILES],
        cwd=cluster_helpers.REPO_ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(cluster_helpers.env(), TF_CONFIG=json.dumps(config)))
    cluster_helpers.wait_listening(addresses, procs)
    resume = subprocess.run(
        lm_cluster_helpers.cluster_command(
            params + ["utils.run.train_steps = %d" % (saved[-1] + 2)], cluster),
        cwd=cluster_helpers.REPO_ROOT, env=cluster_helpers.env(), capture_output=True,
        text=True, timeout=240, check=False)
  return types.SimpleNamespace(
      addresses=addresses, mlp=mlp, model_dir=model_dir, params=params,
      returncode=returncode, stdout=stdout, stderr=stderr, losses=losses, saved=saved,
      resume=resume)


def test_mlp_across_processes_matches_one_device_and_restores_anywhere(runs):
  run = runs.mlp
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


def test_make_train_lm_across_processes_matches_one_process(runs, local_lm):
  # the first KILL_AT steps of the chief that later lost worker 1
  assert "8 devices of 2 worker tasks" in runs.stdout
  assert "PlacementMeshImpl" in runs.stdout and "batch:2;model:4" in runs.stdout
  steps = [s for s, _ in runs.losses]
  assert steps == list(range(1, len(steps) + 1)) and len(steps) >= KILL_AT, steps
  np.testing.assert_allclose([l for _, l in runs.losses[:KILL_AT]], local_lm.losses(),
                             rtol=1e-5)
  checkpoint = runs.model_dir / ("model.ckpt-%d" % KILL_AT)
  lm_cluster_helpers.assert_same_weights(
      lm_cluster_helpers.checkpoint_weights(checkpoint), local_lm.weights(KILL_AT))
  # The chief's checkpoint restores in this one process on [] and on [2,4].
  evals = [lm_cluster_helpers.run_here(
      lm_cluster_helpers.lm_params(runs.model_dir, local_lm.corpus),
      ["utils.run.mode = 'eval'", "utils.run.eval_checkpoint_step = %d" % KILL_AT,
       "utils.run.mesh_shape = %r" % mesh, "utils.run.layout_rules = %r" % layout])
           for mesh, layout in (("", ""), ("batch:2,model:4", "batch:batch,d_ff:model,"
                                            "heads:model,vocab:model"))]
  assert evals[0]["step"] == evals[1]["step"] == KILL_AT
  np.testing.assert_allclose(evals[0]["loss"], evals[1]["loss"], rtol=1e-5)


def test_killed_worker_stops_the_chief_naming_it_and_restart_resumes(runs):
  errors = [l for l in runs.stderr.splitlines() if l.startswith("error:")]
  assert runs.returncode == 1, runs.stderr[-3000:]
  assert len(errors) == 1 and errors[0].startswith(
      "error: lost worker task 1 (%s)" % runs.addresses[1]), runs.stderr[-3000:]
  assert runs.saved and runs.saved[-1] >= 2
  # the same command after worker 1 restarted
  resume = runs.resume
  assert resume.returncode == 0, resume.stderr[-3000:]
  assert "at step %d" % runs.saved[-1] in resume.stdout, resume.stdout[-2000:]
  assert "saved checkpoint %s-%d" % (runs.model_dir / "model.ckpt",
                                    runs.saved[-1] + 2) in resume.stdout
