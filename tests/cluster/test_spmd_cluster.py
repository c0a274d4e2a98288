"""Multi-client SPMD: two processes (4 virtual CPUs each) run the tiny LM's replicas on
mesh batch:2;model:4 and meet in TF collective ops; one is killed, both restart and
resume; compared with one process. (The trainer's SPMD mode: test_spmd_trainer.py.)"""
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import cluster_helpers
import mesh_tf as mtf
from mesh_tf.cluster import host_threads
from models.tiny_lm import config, mtf_model

SCRIPT = os.path.join("tests", "cluster", "spmd_lm_process.py")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spmd_lm_process  # pylint: disable=g-import-not-at-top,wrong-import-position

STOP_TIMEOUT = 120  # seconds the survivor may take to stop after its peer dies


def _start(addresses, model_dir, steps, log_dir, timeout=60.0,
           mesh=spmd_lm_process.MESH, program="auto", env=None):
  """The two processes of a run, with output to log_dir/task<i>.{out,err}."""
  env = env or cluster_helpers.env()
  procs = []
  for task in range(len(addresses)):
    out = open(os.path.join(str(log_dir), "task%d.out" % task), "w")
    err = open(os.path.join(str(log_dir), "task%d.err" % task), "w")
    procs.append(subprocess.Popen(
        [sys.executable, SCRIPT, ",".join(addresses), str(task), str(model_dir),
         str(steps), str(timeout), mesh, program], cwd=cluster_helpers.REPO_ROOT,
        env=env, stdout=out, stderr=err))
    out.close()
    err.close()
  return procs


def _results(procs, log_dir, timeout=240):
  """Waits for every process; returns their JSON lines (asserting they succeeded)."""
  results = []
  for task, p in enumerate(procs):
    p.wait(timeout=timeout)
    out = open(os.path.join(str(log_dir), "task%d.out" % task)).read()
    err = open(os.path.join(str(log_dir), "task%d.err" % task)).read()
    assert p.returncode == 0, err[-3000:]
    results.append(cluster_helpers.last_json_line(out))
  return results


def _tiny_lm():
  return mtf_model.TinyLmModel(config.TinyLmConfig(**spmd_lm_process.SIZES))


def _batch():
  batch = config.synthetic_batch(config.TinyLmConfig(**spmd_lm_process.SIZES))
  return tf.constant(batch[:, :-1]), tf.constant(batch[:, 1:])


def _placement_2x4(mesh=spmd_lm_process.MESH):
  return mtf.PlacementMeshImpl(mesh, spmd_lm_process.LAYOUT,
                               ["/cpu:%d" % i for i in range(8)])


def _check_primitives_and_initial_values(results, programs, mesh=spmd_lm_process.MESH):
  """Every collective primitive across the processes gives the placement backend's
  slices, and the random initial values drawn by each of the `programs` (replicas, or
  one program per process) were made equal, and step_and_agree gave every process the
  largest task's value."""
  assert [r["agreed"] for r in results] == [10 + len(results) - 1] * len(results)
  primitives = {k: sum((r["primitives"][k] for r in results), [])
                for k in results[0]["primitives"]}
  impl = _placement_2x4(mesh)
  x = impl.LaidOutTensor([tf.constant(spmd_lm_process.primitive_input(p))
                          for p in range(8)])
  for name, laid_out in spmd_lm_process.apply_primitives(impl, x).items():
    expected = [t.numpy() for t in laid_out.tensor_list]
    np.testing.assert_allclose(primitives[name], expected, err_msg=name)
  inits = np.array(sum((r["random_init"] for r in results), []))
  assert inits.shape == (programs, 4, 8) and np.std(inits[0]) > 0.01
  np.testing.assert_array_equal(inits, np.broadcast_to(inits[0], inits.shape))


def test_killed_process_stops_the_other_and_restart_resumes_as_one_process(tmp_path):
  addresses = ["localhost:%d" % p for p in cluster_helpers.free_ports(2)]
  model_dir = tmp_path / "m"
  # the run that loses a process: mesh batch:2, one replica per process (quick to
  # trace); its full-shape checkpoint resumes on batch:2;model:4 below
  procs = _start(addresses, model_dir, 100000, tmp_path, timeout=40.0, mesh="batch:2")
  try:
    deadline = time.time() + 240
    while not (model_dir / "model.ckpt-2.index").exists():
      assert all(p.poll() is None for p in procs), "a process exited before step 2"
      assert time.time() < deadline, "no checkpoint after 240s"
      time.sleep(0.1)
    procs[1].kill()
    killed = time.time()
    try:
      returncode = procs[0].wait(timeout=STOP_TIMEOUT)  # a hang fails here
    except subprocess.TimeoutExpired:
      pytest.fail("task 0 did not stop within %ds of losing task 1" % STOP_TIMEOUT)
    print("task 0 stopped %.1fs after task 1 was killed" % (time.time() - killed))
  finally:
    cluster_helpers.stop(procs)
  err = (tmp_path / "task0.err").read_text()
  errors = [l for l in err.splitlines() if l.startswith("error:")]
  assert returncode == 1, err[-3000:]
  assert len(errors) == 1 and errors[0].startswith(
      "error: lost worker task 1 (%s)" % addresses[1]), err[-3000:]
  saved = max(int(m) for m in re.findall(r"model\.ckpt-(\d+)\.index",
                                         " ".join(os.listdir(model_dir))))
  # restart both processes on new ports: they resume from the last checkpoint
  addresses = ["localhost:%d" % p for p in cluster_helpers.free_ports(2)]
  procs = _start(addresses, model_dir, saved + 2, tmp_path)
  try:
    results = _results(procs, tmp_path)
  finally:
    cluster_helpers.stop(procs)
  assert [r["start"] for r in results] == [saved, saved]
  # each process read only its share of the batch: the rows of its batch coordinate
  assert [r["rows"] for r in results] == [[0, 4], [4, 8]]
  # one process, 8 devices, placement backend, from the same checkpoint: the same
  # losses and weights
  model = _tiny_lm()
  impl = _placement_2x4()
  step = model.make_train_step(impl)
  mtf.restore_checkpoint(str(model_dir / ("model.ckpt-%d" % saved)), impl)
  inputs, targets = _batch()
  single = [float(step(inputs, targets)) for _ in range(2)]
  for r in results:
    np.testing.assert_allclose(r["losses"], single, rtol=1e-5)
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
  assert reader.get_tensor("global_step") == saved + 2
  for name, v in impl.variable_store.items():
    np.testing.assert_allclose(reader.get_tensor(name), v.read_full().numpy(), rtol=1e-5,
                               atol=1e-6, err_msg=name)
  # each process ran its 4 devices as one placement program
  assert [r["impl"] for r in results] == ["ProcessPlacementMeshImpl"] * 2
  _check_primitives_and_initial_values(results, programs=2)


def test_processes_holding_part_of_a_mesh_axis_run_one_program_each(tmp_path):
  """Mesh batch:4;model:2 over 2 processes: each holds 2 of the 4 batch coordinates, so
  a batch-axis sum is an in-memory sum of 2, then one collective between the processes.
  The primitives give the placement backend's slices, and 2 steps from a checkpoint give
  the losses of one process on the same mesh. The processes size their own thread
  pools here (the suite's TF_NUM_INTRAOP_THREADS removed): each gets its share of the
  host's cores, as host_threads computes it."""
  mesh = "batch:4;model:2"
  addresses = ["localhost:%d" % p for p in cluster_helpers.free_ports(2)]
  own_sizing = {k: v for k, v in cluster_helpers.env().items()
                if k != "TF_NUM_INTRAOP_THREADS"}
  procs = _start(addresses, tmp_path / "m", 4, tmp_path, mesh=mesh, env=own_sizing)
  try:
    results = _results(procs, tmp_path)
  finally:
    cluster_helpers.stop(procs)
  assert [r["impl"] for r in results] == ["ProcessPlacementMeshImpl"] * 2
  for task, r in enumerate(results):
    expected = list(host_threads.share(addresses, task, "auto", 4))
    assert r["threads"] == r["pools"] == expected, r
  assert [r["rows"] for r in results] == [[0, 4], [4, 8]]
  _check_primitives_and_initial_values(results, programs=2, mesh=mesh)
  impl = _placement_2x4(mesh)
  step = _tiny_lm().make_train_step(impl)
  mtf.restore_checkpoint(str(tmp_path / "m" / "model.ckpt-2"), impl)
  inputs, targets = _batch()
  single = [float(step(inputs, targets)) for _ in range(2)]
  for r in results:
    np.testing.assert_allclose(r["losses"][2:], single, rtol=1e-5)


def test_one_replica_per_device_program_trains_alike(tmp_path):
  """program='per_device' (one MultiClientMeshImpl per device, the only program where a
  process's processors are not a block of the mesh): the same collectives and
  initial values, a checkpoint that one process restores, and losses both tasks agree on."""
  addresses = ["localhost:%d" % p for p in cluster_helpers.free_ports(2)]
  procs = _start(addresses, tmp_path / "m", 2, tmp_path, program="per_device")
  try:
    results = _results(procs, tmp_path)
  finally:
    cluster_helpers.stop(procs)
  assert [r["impl"] for r in results] == ["MultiClientMeshImpl"] * 2
  # the suite's TF_NUM_INTRAOP_THREADS is the user's choice: kept, nothing resized
  assert [(r["threads"], r["pools"]) for r in results] == [(None, [0, 0])] * 2
  _check_primitives_and_initial_values(results, programs=8)
  impl = _placement_2x4()
  _tiny_lm().make_train_step(impl)  # creates the variables the checkpoint restores
  mtf.restore_checkpoint(str(tmp_path / "m" / "model.ckpt-2"), impl)
  reader = tf.train.load_checkpoint(str(tmp_path / "m" / "model.ckpt-2"))
  assert reader.get_tensor("global_step") == 2
  assert results[0]["losses"] == results[1]["losses"] and len(results[0]["losses"]) == 2
  assert np.isfinite(results[0]["losses"]).all()
